# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv and installs
# what it needs. torch (the CPU wheel, pinned by TORCH so that pip never picks a multi-GB CUDA
# build) is installed by `make test` only, for the calibration tests.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
TORCH  ?= torch==2.13.0

.PHONY: demo test dashboards browser clean

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
	$(BIN)/simtrain compare

test: $(VENV)/.test browser
	$(BIN)/python -m pytest -q

# Headless Chromium + chromedriver for tests/test_browser.py (installed only when missing).
browser:
	sh scripts/ensure-chromium.sh

# Render every scenario in dashboards/ into dashboards/NAME.html (git-ignored).
dashboards: $(VENV)/.core
	@set -e; for f in dashboards/*.yaml; do \
	    echo "== $$f"; $(BIN)/simtrain compare "$$f"; \
	done

clean:
	rm -rf $(VENV) dashboards/*.html
