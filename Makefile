# Two set-up commands for a fresh machine (see README):
#   make demo   -- create .venv, install everything, run the main job on the embedded default
#   make test   -- create .venv, install everything, run the whole test suite
#   make test-research -- the tests of the studies in research/ (not installed)
# Both install the simulator, the backend's `exec` extra (torch, transformers), the
# `data` extra (HuggingFace datasets folders) and the test extras; `pip install .`
# alone gives the simulator only.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-research venv clean notebooks

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[exec,data,test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/merak-sim reproduce merak --out out/reproduce

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadscope --no-loadscope-reorder tests

# The edit loop's tier: everything but the tests marked slow (tests/conftest.py's
# SLOW_MODULES: those that start ranks, command lines or notebooks).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "not slow" tests

# The studies in research/ (not installed, not part of make test): their own tests.
test-research: $(STAMP)
	$(BIN)/python -m pytest -q research/tests

# Rebuild every notebook from its build script and store its executed outputs (figures
# included) in the committed .ipynb files.
notebooks: $(STAMP)
	$(BIN)/python notebooks/build_notebooks.py
	$(BIN)/python notebooks/build_notebook_04.py
	$(BIN)/python notebooks/run_notebooks.py

clean:
	rm -rf $(VENV) out .pytest_cache
