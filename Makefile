# mechsink: the commands the README gives. Everything runs inside .venv (made by `make setup`).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.mechsink-setup
# The CPU build of torch is installed first so no later requirement pulls a CUDA build.
TORCH   ?= torch==2.13.0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1

.PHONY: setup demo test test-fast lint bench docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(BIN)/mechsink scan smollm2-135m --out report/
	@echo "Open report/index.html in a browser (it works offline)."

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

lint: setup
	$(BIN)/ruff check mechsink tests benchmarks circuits docs/build

bench: setup
	$(BIN)/python benchmarks/load.py
	$(BIN)/python benchmarks/census.py
	$(BIN)/python benchmarks/patching.py
	$(BIN)/python benchmarks/training.py
	$(BIN)/python benchmarks/discover.py
	$(BIN)/python benchmarks/sweep.py

# The docs site: runs the experiments the pages show (cached in docs/_cache, so a second build
# takes seconds), renders the pages and builds docs/_site. MECHSINK_DOCS_QUICK=1: tiny models.
docs: setup
	$(BIN)/python -m docs.build
	@echo "The site is in docs/_site: open docs/_site/index.html (it works offline)."

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
