# Every target sets itself up on a fresh machine: .venv, editable install with the extras it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install test demo lint bench chaos fuzz clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[spark,test,lint,bench]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

demo: $(STAMP)
	$(BIN)/python -m client.demo

lint: $(STAMP)
	$(BIN)/ruff check protocol broker client spark_jobs tests bench
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

chaos: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/chaos --chaos-long

fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz.fuzz_decoders

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
