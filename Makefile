# mechsink: the commands the README gives. Everything runs inside .venv (made by `make setup`).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.mechsink-setup
# The CPU build of torch is installed first so no later requirement pulls a CUDA build.
TORCH   ?= torch==2.13.0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1

.PHONY: setup demo test test-fast compat compat-envs lint bench docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m docs.build --fetch
	touch $(STAMP)

demo: setup
	$(BIN)/mechsink scan smollm2-135m --out report/
	@echo "Open report/index.html in a browser (it works offline)."

test: setup compat-envs
	$(BIN)/python -m pytest -q
	$(MAKE) --no-print-directory compat

# The compatibility suite (tests/compat): a HookedTransformer must give the bridge's numbers.
# The main environment's TransformerLens (4.x) has no HookedTransformer, so each version below
# gets a small environment under .venv/compat/ that reuses every package of .venv (the same CPU
# torch included, through a .pth line) and installs only what differs: seconds, no download
# of torch. The main environment's bridge writes the reference numbers once.
COMPAT      := $(VENV)/compat
COMPAT_TLS  := 3.9.0 2.18.0
COMPAT_PINS_3.9.0  := "transformer-lens==3.9.0"
COMPAT_PINS_2.18.0 := "transformer-lens==2.18.0" "transformers>=4.57,<5" "numpy<2" "pyarrow<21"
COMPAT_REF  := build/compat/reference.pt

compat-envs: $(foreach v,$(COMPAT_TLS),$(COMPAT)/tl$(v)/.stamp)

$(COMPAT)/tl%/.stamp: $(STAMP)
	rm -rf $(COMPAT)/tl$*
	$(BIN)/python -m venv --without-pip $(COMPAT)/tl$*
	$(BIN)/python -c "import site, sysconfig, subprocess, pathlib; \
	  main = sysconfig.get_paths()['purelib']; \
	  own = subprocess.check_output(['$(COMPAT)/tl$*/bin/python', '-c', \
	    'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'], text=True).strip(); \
	  pathlib.Path(own, 'mechsink-main-env.pth').write_text(f'import site; site.addsitedir({main!r})\n')"
	$(BIN)/python -m pip --python $(COMPAT)/tl$*/bin/python install --quiet $(COMPAT_PINS_$*)
	touch $@

compat: setup compat-envs
	mkdir -p $(dir $(COMPAT_REF))
	$(BIN)/python -m tests.compat.reference $(COMPAT_REF)
	set -e; for v in $(COMPAT_TLS); do \
	  echo "compatibility suite under TransformerLens $$v"; \
	  MECHSINK_COMPAT_REFERENCE=$(COMPAT_REF) $(COMPAT)/tl$$v/bin/python -m pytest -q \
	    -p no:cacheprovider tests/compat; \
	done

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

# ruff, and the layers: rooms import only downwards, only model/ reads library internals
lint: setup
	$(BIN)/ruff check mechsink tests benchmarks circuits docs/build
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_layers.py

bench: setup
	$(BIN)/python benchmarks/load.py
	$(BIN)/python benchmarks/census.py
	$(BIN)/python benchmarks/patching.py
	$(BIN)/python benchmarks/training.py
	$(BIN)/python benchmarks/discover.py
	$(BIN)/python benchmarks/sweep.py

# The docs site: the committed real-model results (docs/results, JSON only: no model runs) feed
# the home page's atlas and the pages it covers; every other page is built on tiny models
# (cached in docs/_cache, so a second build takes seconds) with a banner saying so, then
# docs/_site. `python -m docs.build --full`: those pages on the real models (hours).
# Import a finished atlas: python -m docs.build --import-results atlas FOLDER --commit SHA.
docs: setup
	$(BIN)/python -m docs.build
	$(BIN)/python -m docs.build.check
	@echo "The site is in docs/_site: open docs/_site/index.html (it works offline, from file://)."

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info build/compat
