# zarr_skip: `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint venv bench bench-quick clean

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

# lint, format and types, the main suite (its 25 slowest tests listed), then the verl integration
# suite in its own environment (.venv-verl)
test: $(STAMP)
	$(MAKE) lint
	$(PY) -m pytest -q --durations=25
	$(MAKE) test-verl

# the daily subset, under 3 minutes on 2 cores: the main suite without the tests marked `slow`
# (real processes killed or racing, FUSE, Chromium, notebooks, benchmark runs)
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" --durations=10

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# every benchmark (benchmarks/suite.py: bench, peers, FUSE + S3, write floor, tables), results in
# benchmarks/results; each run records the machine's load and is marked BUSY on a loaded machine.
# For figures to publish: make bench BENCH_ARGS=--require-quiet (refuses a busy machine, exit 2/3)
BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) -m benchmarks.suite --out benchmarks/results $(BENCH_ARGS)

# the same on the smallest preset, one repetition (a smoke test, ~1 min on a quiet machine)
bench-quick: $(STAMP)
	$(PY) -m benchmarks.suite --quick --out $${TMPDIR:-/tmp}/zarr_skip_bench_quick $(BENCH_ARGS)

clean:
	rm -rf demo_cache demo_cache_random report.html rollouts.parquet .pytest_cache .hypothesis build *.egg-info
