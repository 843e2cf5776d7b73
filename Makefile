# Jagged flash attention: set up, test, benchmark.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SUITES ?= gem-jagged,gem-cross,gem-broadcast-q,llm-dense
GPUS ?=            # empty: every visible GPU; N: the first N; 0,2: those GPUs
GPU_ARG := $(if $(strip $(GPUS)),--gpus $(strip $(GPUS)))

.PHONY: setup test test-gpu bench bench-quick report lines clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

setup: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'

test: setup
	$(BIN)/python -m pytest -q

test-gpu:
	python3 -m pytest -q -m gpu

# `bench` runs every available backend over the full suites (fwd and bwd), then
# regenerates charts and the report. Without a GPU it says so and runs `smoke` on CPU.
bench: setup
	$(BIN)/python -m harness bench --suite $(SUITES) --passes fwd,bwd $(GPU_ARG)
	$(BIN)/python -m harness plot
	$(BIN)/python -m harness lines
	$(BIN)/python -m harness report

bench-quick: setup
	$(BIN)/python -m harness bench --quick --passes fwd,bwd $(GPU_ARG)
	$(BIN)/python -m harness plot
	$(BIN)/python -m harness report

report:
	$(BIN)/python -m harness plot
	$(BIN)/python -m harness lines
	$(BIN)/python -m harness report

lines:
	$(BIN)/python -m harness lines

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
