# Two commands for a newcomer: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install demo test bench bench-restore soak clean
N ?= 200
BENCH_ARGS ?=

$(BIN)/pipeline-lib: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[local,airflow,test]'
	touch $@

install: $(BIN)/pipeline-lib

demo: install
	$(BIN)/python -m pipeline_lib.demo

test: install
	$(BIN)/python -m pytest tests

# Ours vs Spark Structured Streaming vs raw kafka-python, snapshot bytes, restore and recovery
# times; report + plots in results/bench (e.g. make bench BENCH_ARGS="--events 200000 --keys 10000").
bench: install
	$(BIN)/python -m pipeline_lib.benchmarks.throughput $(BENCH_ARGS)

# Restore time with many completed pipelines vs restoring everything (prints the ratio).
bench-restore: install
	$(BIN)/python -m pipeline_lib.benchmarks.restore_completed

# N random crash/restore cycles with a report in results/soak.md (records lost and duplicated must be 0).
soak: install
	$(BIN)/python -m pipeline_lib.soak --cycles $(N) --report results/soak.md

clean:
	rm -rf $(VENV) demo-output .stack
