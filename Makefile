# Two commands on a fresh machine:  `make app` (run the dashboard)  and  `make test`.
# Each creates .venv and installs what it needs. TORCH picks the PyTorch build: the default is
# the CPU wheel these machines carry; on a CUDA machine use e.g. `make test TORCH=torch`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: app test lint bench clean venv notebook

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,notebooks,import]"
	touch $(STAMP)

venv: $(STAMP)

app: $(STAMP)
	$(VENV)/bin/panel serve apps/attention.py --show $(ARGS)

notebook: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

test: $(STAMP)
	$(PY) -m ruff check workbench apps tests benchmarks
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check workbench apps tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/bench_core.py

clean:
	rm -rf $(VENV)
