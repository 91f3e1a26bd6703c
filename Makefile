# Two commands on a fresh machine:  `make app` (run the dashboard)  and  `make test`.
# Each creates .venv and installs what it needs. TORCH picks the PyTorch build: the default is
# the CPU wheel these machines carry; on a CUDA machine use e.g. `make test TORCH=torch`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: app test test-shuffled lint bench clean venv notebook notebooks chromium
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# The browser tests drive Debian's chromium (Playwright's own download host is unreachable here) and Bokeh's
# PNG/SVG export drives it through chromedriver: `make test` installs both with apt-get when either is missing,
# through sudo unless it runs as root.
SUDO ?= $(if $(filter 0,$(shell id -u 2>/dev/null)),,sudo)
HAVE_CHROMIUM := $(shell command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && echo yes)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,notebooks,import]"
	touch $(STAMP)

venv: $(STAMP)

app: $(STAMP)
	$(VENV)/bin/panel serve apps/attention.py --setup apps/serve_setup.py --show $(ARGS)

notebook: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

# notebooks/*.ipynb are generated from their jupytext sources notebooks/*.py (edit the .py, then run this)
notebooks: $(STAMP)
	$(PY) scripts/build_notebooks.py

chromium:
ifneq ($(HAVE_CHROMIUM),yes)
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver
endif

# The suite runs on TEST_WORKERS pytest-xdist workers (CI has 2 cores; the tests use one thread each, and the
# browser tests mostly wait on the server and Chromium): a test file, and tests/browser/ as a whole, stays on one
# worker (--dist loadfile, and tests/conftest.py's scheduler for tests/browser/). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

test: $(STAMP) chromium
	$(PY) -m ruff check workbench apps tests benchmarks scripts notebooks
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The same suite with files and tests shuffled (pytest-randomly prints the seed; replay with
# PYTEST_ARGS=--randomly-seed=N): order dependence between tests shows up here.
test-shuffled: $(STAMP) chromium
	$(PY) -m pytest -p randomly -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check workbench apps tests benchmarks scripts notebooks

bench: $(STAMP)
	$(PY) benchmarks/bench_core.py

clean:
	rm -rf $(VENV)
