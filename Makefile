# Every target sets itself up on a fresh machine: .venv, editable install with the extras it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install test demo lint bench chaos fuzz clean promtool browser venv-python

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# PY=... given to make (or in the environment) only builds a venv that does not exist yet: refuse a .venv made by
# another interpreter rather than run on it silently (docs/OPERATIONS.md, *Which Python*).
REAL_PYTHON := import os, sys; print(os.path.realpath(sys.executable))
venv-python: | $(BIN)/python
ifneq ($(origin PY),file)
	@want=$$($(PY) -c '$(REAL_PYTHON)') && have=$$($(BIN)/python -c '$(REAL_PYTHON)') \
	  && if [ "$$want" != "$$have" ]; then \
	    echo "make: $(VENV) runs $$have, not PY=$(PY) ($$want); remove $(VENV) (make clean) to rebuild it with PY" >&2; \
	    exit 2; fi
endif

$(STAMP): pyproject.toml setup.py | venv-python
	$(BIN)/pip install -q -e '.[spark,test,lint,bench]'
	touch $(STAMP)

# The JVM reader of clean commit-log segments (spark_jobs/jvm_reader.py), compiled with the JDK's javac against the
# installed pyspark's jars; trimq's Spark sessions load it when it is there.
JAR := spark_jobs/jvm/trimq-commitlog.jar
$(JAR): spark_jobs/jvm/CommitLogSource.java $(STAMP)
	$(BIN)/python -c "from trimq.spark_jobs.jvm_reader import build_jar; build_jar()"

install: $(STAMP) $(JAR)

test: $(STAMP) $(JAR) promtool browser
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup tests

# promtool checks deploy/prometheus/ in the tests (tests/unit/test_deploy_configs.py). When it is not on PATH
# it is taken out of Debian's prometheus package into build/tools/usr/bin without installing the package
# (apt-get download + dpkg-deb: no Prometheus service is enabled or started); the package lists are
# refreshed first when the download needs it and this is root. Elsewhere the promtool tests skip.
TOOLS := build/tools
promtool:
	@if ! command -v promtool >/dev/null 2>&1 && [ ! -x $(TOOLS)/usr/bin/promtool ] \
	    && command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then \
	  mkdir -p $(TOOLS)/deb && cd $(TOOLS)/deb && rm -f prometheus_*.deb && \
	  { apt-get download -qq prometheus 2>/dev/null \
	    || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get download -qq prometheus; }; } \
	  && dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x -C .. ./usr/bin/promtool \
	  && rm -f prometheus_*.deb && echo "promtool: $(TOOLS)/usr/bin/promtool"; \
	fi

# tests/console drives a real headless browser: Debian's chromium (playwright, from the test extra, uses it at
# /usr/bin/chromium and never downloads one). Installed with apt when missing and this is root (the package
# lists are refreshed first when the install needs it); elsewhere install it yourself or set TRIMQ_CHROMIUM.
browser:
	@if [ ! -x /usr/bin/chromium ] && [ -z "$$TRIMQ_CHROMIUM" ] && [ "$$(id -u)" = 0 ] \
	    && command -v apt-get >/dev/null 2>&1; then \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
	    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; } \
	  && echo "browser: /usr/bin/chromium"; \
	fi

# The demo needs the package and its base dependencies only (no spark, test, lint or bench extras): a stamp of
# its own, satisfied by the full install too when that one is up to date.
DEMO_STAMP := $(VENV)/.installed-demo-stamp
$(DEMO_STAMP): pyproject.toml setup.py | venv-python
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ] && [ $(STAMP) -nt setup.py ]; then :; \
	else $(BIN)/pip install -q -e .; fi
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m trimq.demo

# mypy and lint-imports read the layer folders through build/typecheck/trimq, links that lay them out as
# installed (neither follows setuptools' editable-install import hook).
TYPECHECK := build/typecheck/trimq
LAYERS := protocol runtime namesrv broker client spark_jobs tools testing demo

# import-linter lives in a venv of its own: it depends on rich, and structlog imports rich wherever it is
# installed, which would cost every trimq process in .venv (tests, demo, bench) ~60 ms of start-up.
LINT_VENV := .venv-lint
LINT_STAMP := $(LINT_VENV)/.installed-stamp
$(LINT_STAMP): pyproject.toml
	$(PY) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/pip install -q 'import-linter>=2.17'
	touch $(LINT_STAMP)

lint: $(STAMP) $(LINT_STAMP)
	$(BIN)/ruff check trimq $(LAYERS) tests bench setup.py
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)
	cp trimq/__init__.py trimq/py.typed $(TYPECHECK)/
	for layer in $(LAYERS); do ln -s ../../../$$layer $(TYPECHECK)/$$layer; done
	cd build/typecheck && $(abspath $(LINT_VENV))/bin/lint-imports --config $(abspath pyproject.toml)
	$(BIN)/mypy
	$(BIN)/mypy --explicit-package-bases --namespace-packages --follow-imports=silent tests bench

bench: $(STAMP) $(JAR)
	$(BIN)/python -m bench.run_all

chaos: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/chaos --chaos-long

fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz.fuzz_decoders

clean:
	rm -rf $(VENV) $(LINT_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache $(JAR)
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
