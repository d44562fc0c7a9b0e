# Two set-up commands for a fresh machine (see README):
#   make demo   -- create .venv, install, run the main job on the embedded default
#   make test   -- create .venv, install with test extras, run the whole test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/merak-sim reproduce merak --out out/reproduce

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) out .pytest_cache
