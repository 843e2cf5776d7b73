# Jagged flash attention: set up, test, benchmark.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SUITES ?= gem-jagged,gem-cross,gem-broadcast-q,llm-dense,varlen-llm,fuzz,decode
TEST_JOBS ?= 2      # pytest processes for the CPU suite (pytest-xdist)
GPUS ?=            # empty: every visible GPU; N: the first N; 0,2: those GPUs
GPU_ARG := $(if $(strip $(GPUS)),--gpus $(strip $(GPUS)))
WARM ?= 8          # processes that gate (and so compile) every job in parallel before timing

.PHONY: setup setup-bench test test-matrix test-gpu bench bench-quick report lines clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# the library and the CPU tests' packages
setup: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'

# the library and the benchmark's packages (the FA4 baseline, pandas, matplotlib, tqdm)
setup-bench: $(BIN)/python
	$(BIN)/pip install -q -e '.[bench]'

test: setup
	$(BIN)/python -m pytest -q -n $(TEST_JOBS)

# every compile variant of every kernel for sm_90a / sm_100a, on the CPU (slow)
test-matrix: setup
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) -m matrix

test-gpu:
	python3 -m pytest -q -m gpu

# `bench` runs every available backend over the full suites (fwd and bwd), then
# regenerates charts, line counts, the side-by-side page and the report. Without a GPU
# it says so and runs `smoke` on the CPU.
bench: setup-bench
	$(BIN)/python -m harness bench --suite $(SUITES) --passes fwd,bwd --warm $(WARM) $(GPU_ARG)
	$(MAKE) report

bench-quick: setup-bench
	$(BIN)/python -m harness bench --quick --suite $(SUITES) --passes fwd,bwd --warm $(WARM) $(GPU_ARG)
	$(MAKE) report

report: setup-bench
	$(BIN)/python -m harness plot
	$(BIN)/python -m harness lines
	$(BIN)/python -m harness sidebyside
	$(BIN)/python -m harness report

lines: setup-bench
	$(BIN)/python -m harness lines
	$(BIN)/python -m harness sidebyside

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
