# Every target sets itself up on a fresh machine: .venv, editable install with the extras it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install test demo lint bench chaos fuzz clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/pip install -q -e '.[spark,test,lint,bench]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

demo: $(STAMP)
	$(BIN)/python -m trimq.demo

# mypy and lint-imports read the layer folders through build/typecheck/trimq, links that lay them out as
# installed (neither follows setuptools' editable-install import hook).
TYPECHECK := build/typecheck/trimq
LAYERS := protocol broker client spark_jobs tools testing demo

lint: $(STAMP)
	$(BIN)/ruff check trimq $(LAYERS) tests bench setup.py
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)
	cp trimq/__init__.py trimq/py.typed $(TYPECHECK)/
	for layer in $(LAYERS); do ln -s ../../../$$layer $(TYPECHECK)/$$layer; done
	cd build/typecheck && ../../$(BIN)/lint-imports --config ../../pyproject.toml
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
