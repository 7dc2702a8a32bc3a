# Two commands for a newcomer: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install demo test bench bench-restore bench-cluster soak mutation clean
N ?= 200
BENCH_ARGS ?=
MUTATION_ARGS ?=

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

# Start-up to the first committed epoch and steady-epoch time, local mode vs a standalone cluster.
bench-cluster: install
	$(BIN)/python -m pipeline_lib.benchmarks.cluster_vs_local $(BENCH_ARGS)

# N random crash/restore cycles with a report in results/soak.md (records lost and duplicated must be 0).
soak: install
	$(BIN)/python -m pipeline_lib.soak --cycles $(N) --report results/soak.md

# Remove each safety line of the commit protocol (tools/mutants.py) in turn: the unit tests must
# catch every one (e.g. make mutation MUTATION_ARGS="--only head-cas-plain-put -j 1").
mutation: install
	$(BIN)/python tools/mutation.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) demo-output .stack
