# Two entry points: `make demo` (the main job on its embedded default) and
# `make test` (the default test run: all but `gpu` and `slow`). Both build .venv themselves.
# `make test-all` adds the `slow` sweeps; `make docs` builds the site, `make notebooks` reruns
# the notebooks.
#
# Python >= 3.12 is required (JAX >= 0.11). The first of these that is >= 3.12
# is used: $(PYTHON) if given, python3.14 ... python3, then the oldest pyenv 3.12+.
# Elsewhere: `make test PYTHON=/path/to/python3.12`.

VENV   := .venv
BIN    := $(VENV)/bin
EXTRAS ?= test,lint,kernel-check,milp,distill,docs
PYTEST_ARGS ?=

define FIND_PYTHON
for c in $(PYTHON) python3.14 python3.13 python3.12 python3; do \
  if command -v $$c >/dev/null 2>&1 && \
     $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then \
    command -v $$c; exit 0; fi; done; \
if command -v pyenv >/dev/null 2>&1; then \
  v=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9])(\.[0-9]+)?$$' | sort -V | head -1); \
  if [ -n "$$v" ]; then echo "$$(pyenv root)/versions/$$v/bin/python3"; exit 0; fi; fi; \
exit 1
endef

.PHONY: demo test test-all lint layers venv clean docs notebooks xla-aot

$(VENV)/.installed: pyproject.toml
	@py=$$( $(FIND_PYTHON) ) || { echo "error: need Python >= 3.12 (set PYTHON=...)" >&2; exit 1; }; \
	  echo "using $$py ($$($$py --version))"; \
	  [ -x $(BIN)/python ] || $$py -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	@touch $@

venv: $(VENV)/.installed

# A fresh run each time; continue it with
#   .venv/bin/python -m jaxlib_ext train --out-dir runs/demo --steps 400 --resume --extend-schedule
demo: venv
	rm -rf runs/demo
	$(BIN)/python -m jaxlib_ext train --out-dir runs/demo

lint: venv layers
	$(BIN)/ruff check .

# The layer contracts of pyproject.toml ([tool.importlinter]), checked by import-linter on the
# package as pip installs it (the family folders join the jaxlib_ext namespace only there), run
# from inside that tree: lint-imports puts its working folder first on the import path.
LAYERS_TREE := .cache/layers
layers: venv
	rm -rf build $(LAYERS_TREE)
	$(BIN)/python -m pip install -q --no-deps --no-compile --target $(LAYERS_TREE) . 2>&1 \
	  | grep -v -e WARNING -e BuildBackendWarning -e '^ ' -e '^$$' || true
	cd $(LAYERS_TREE) && $(CURDIR)/$(BIN)/lint-imports $(CURDIR)/pyproject.toml --no-cache

test: venv lint
	JAX_PLATFORMS=cpu $(BIN)/pytest -m "not gpu and not slow" -n 2 --dist loadscope $(PYTEST_ARGS)

test-all: venv lint
	JAX_PLATFORMS=cpu $(BIN)/pytest -m "not gpu" -n 2 --dist loadscope $(PYTEST_ARGS)

# XLA's own compile of the Pallas kernels for an H200, without a GPU: tools/kernel_audit/xla_aot.py
# run as a module of the repo root (e.g. XLA_AOT_ARGS="--sweep --candidates"); PYTHONPATH holds
# the plugin and nvdisasm only. Fetches the CUDA PJRT plugin of the venv's JAX (~145 MB) into
# .cache/xla-aot once; ptxas comes from the kernel-check extra (pip Triton) or a CUDA toolkit.
# nvdisasm (5 MB, optional) gives the spills' local-memory traffic in and out of loops.
XLA_AOT_ARGS ?=
NVDISASM_VERSION ?= 13.5.37
xla-aot: venv
	@jv=$$($(BIN)/python -c 'import jax; print(jax.__version__)'); dir=.cache/xla-aot/$$jv; \
	  [ -d $$dir ] || $(BIN)/python -m pip install -q --no-deps --target $$dir \
	    jax-cuda13-plugin==$$jv jax-cuda13-pjrt==$$jv || { rm -rf $$dir; exit 1; }; \
	  nd=.cache/xla-aot/nvdisasm-$(NVDISASM_VERSION); [ -d $$nd ] || $(BIN)/python -m pip \
	    install -q --no-deps --target $$nd nvidia-cuda-nvdisasm==$(NVDISASM_VERSION) || rm -rf $$nd; \
	  PYTHONPATH=$$dir:$$nd $(BIN)/python -m tools.kernel_audit.xla_aot $(XLA_AOT_ARGS)

# The site, offline, into docs/_build/html, warnings as errors (a public name without a
# docstring, a broken link). The site runs every notebook in FAST mode (FAST=1: shrunk,
# minutes on a CPU); DOCS_EXECUTE=0 runs none and renders the outputs stored in the
# .ipynb files instead (what tests/test_docs.py builds).
DOCS_EXECUTE ?= 1
docs: venv
	FAST=1 JAXLIB_EXT_DOCS_EXECUTE=$(DOCS_EXECUTE) \
	  $(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

# Every notebooks/*.ipynb regenerated from its jupytext .py and run in full (not FAST), so the
# committed .ipynb files carry a full run's outputs and plots (GitHub, Colab, the site with
# DOCS_EXECUTE=0). Long on a CPU; NOTEBOOK_TIMEOUT bounds each notebook (seconds).
NOTEBOOK_TIMEOUT ?= 7200
notebooks: venv
	$(BIN)/python tools/execute_notebooks.py --timeout $(NOTEBOOK_TIMEOUT) notebooks/*.py

clean:
	rm -rf $(VENV) build *.egg-info runs .cache docs/_build docs/api docs/notebooks/*.ipynb
