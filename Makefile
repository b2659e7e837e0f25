# zarr_skip: `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test lint venv bench clean

include verl.mk

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned: a CPU build of 2.13.0 lies on the machine's disk (other versions pull CUDA)
$(STAMP): $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet "torch==2.13.0"
	$(PIP) install --quiet -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m zarr_skip.demo --out demo_cache

# lint, format and types, the main suite, then the verl integration suite in its own environment (.venv-verl)
test: $(STAMP)
	$(MAKE) lint
	$(PY) -m pytest -q
	$(MAKE) test-verl

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) -m benchmarks.bench --preset medium --out benchmarks/results
	$(PY) -m benchmarks.bench_tables --out benchmarks/results
	$(PY) -m benchmarks.write_floor --preset medium --out benchmarks/results/realistic
	$(PY) -m benchmarks.bench_data --preset medium --steps 8 --out benchmarks/results

clean:
	rm -rf demo_cache .pytest_cache .hypothesis build *.egg-info
