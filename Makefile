# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv and installs
# what it needs. torch (the CPU wheel, pinned by TORCH so that pip never picks a multi-GB CUDA
# build) is installed by `make test` only, for the calibration tests.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
TORCH  ?= torch==2.13.0

.PHONY: demo test dashboards browser mutation clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,calibrate,ray]' '$(TORCH)'
	touch $@

demo: $(VENV)/.core
	mkdir -p dashboards
	$(BIN)/simtrain compare --out dashboards/default.html

test: $(VENV)/.test browser
	$(BIN)/python -m pytest -q

# Mutation testing of the core modules (slow: not part of `make test` or CI). MUTANTS narrows it to
# mutant names matching a glob, e.g. make mutation MUTANTS='simtrain.network*'. Survivors: see
# README, "Development notes".
MUTANTS ?=
$(VENV)/.mutation: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,mutation]'
	touch $@

mutation: $(VENV)/.mutation
	$(BIN)/mutmut run $(if $(MUTANTS),"$(MUTANTS)")
	$(BIN)/mutmut results

# Headless Chromium + chromedriver for tests/test_browser.py (installed only when missing).
browser:
	sh scripts/ensure-chromium.sh

# Render every built-in scenario (simtrain/scenarios/) into dashboards/NAME.html (git-ignored).
dashboards: $(VENV)/.core
	@mkdir -p dashboards; set -e; for f in simtrain/scenarios/*.yaml; do \
	    n=$$(basename "$$f" .yaml); echo "== $$n"; $(BIN)/simtrain compare "$$n" --out "dashboards/$$n.html"; \
	done

clean:
	rm -rf $(VENV) dashboards mutants
