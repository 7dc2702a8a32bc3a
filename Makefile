# Two commands for a newcomer: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install demo test full compose format unit e2e cluster airflow airflow-up bench bench-restore bench-cluster bench-latency soak mutation lint typecheck clean delta-spark-env bench-delta
N ?= 100
SOAK_ARGS ?= --cluster 2
BENCH_ARGS ?=
DELTA_ARGS ?=
AIRFLOW_UP_ARGS ?=
MUTATION_ARGS ?=

# docker/constraints.txt holds the versions the tests pass with (the images install with it too):
# a fresh install takes them, not whatever the index serves that day.
$(BIN)/pipeline-lib: pyproject.toml docker/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c docker/constraints.txt -e '.[local,airflow,test]'
	touch $@

# The driver JVM's class-data-sharing archive (docs/performance.md), built once per install.
install: $(BIN)/pipeline-lib
	$(BIN)/pipeline-lib jvm-archive --if-missing

demo: install
	$(BIN)/python -m pipeline_lib.demo

# Every tier except the rest of the exhaustive crash matrix (marked full; see docs/testing.md).
test: install
	$(BIN)/python -m pytest tests -m "not full"

# That rest: the other crash points and stores of the matrices `make test` samples (and Spark reading
# the Delta sink's tables, from the second environment of delta-spark-env).
full: install delta-spark-env
	$(BIN)/python -m pytest tests -m full

# docker-compose.yml run by a Docker engine of the test's own (root; installs docker.io if missing): images
# built on stand-ins of the official ones, `docker compose up`, a job killed and recovered (docs/compose.md).
compose: install
	$(BIN)/python -m pytest tests/compose -m compose -rP

# One tier at a time (markers in pyproject.toml; `make test` runs them all but `full`).
unit: install
	$(BIN)/python -m pytest -m unit

e2e: install
	$(BIN)/python -m pytest -m "e2e or stack"

cluster: install
	$(BIN)/python -m pytest -m cluster

airflow: install
	$(BIN)/python -m pytest -m airflow

# Airflow for this repository's DAGs and Pipelines page on http://127.0.0.1:8080 until Ctrl-C: api-server,
# scheduler, dag-processor and triggerer, loopback only (docs/airflow.md); e.g. AIRFLOW_UP_ARGS="--port 8081".
airflow-up: install
	$(BIN)/python -m pipeline_lib.orchestration.airflow_up $(AIRFLOW_UP_ARGS)

# Ours vs Spark Structured Streaming vs raw kafka-python, snapshot bytes, restore and recovery
# times; report + plots in results/bench (e.g. make bench BENCH_ARGS="--events 200000 --keys 10000").
# The benchmarks are the checkout's top-level benchmarks/ package, not part of the wheel. Then the Delta sink
# against Spark SS foreachBatch + MERGE (bench-delta, a few minutes; DELTA_ARGS="--events 500000" for its own).
bench: install delta-spark-env
	$(BIN)/python -m benchmarks $(BENCH_ARGS)
	$(BIN)/python -m benchmarks delta $(DELTA_ARGS)

# The Spark user's side of the Delta sink's benchmark and tests: a second venv, .venv-delta-spark/ (never
# committed), with PySpark 4.2.0 and delta-spark 4.4.0 (none is built for our PySpark 4.3.0), and their jars
# fetched with Maven into the cache (tools/delta-spark/, benchmarks/delta_spark_env.py).
DELTA_VENV := .venv-delta-spark
$(DELTA_VENV)/.installed: tools/delta-spark/requirements.txt
	$(PYTHON) -m venv $(DELTA_VENV)
	$(DELTA_VENV)/bin/pip install -q --upgrade pip
	$(DELTA_VENV)/bin/pip install -q -r tools/delta-spark/requirements.txt
	touch $@

delta-spark-env: install $(DELTA_VENV)/.installed
	$(BIN)/python -m benchmarks.delta_spark_env

# A running aggregate into a Delta table, ours vs Spark SS foreachBatch + delta-spark MERGE (prints the ratio).
bench-delta: delta-spark-env
	$(BIN)/python -m benchmarks delta $(DELTA_ARGS)

# Restore time with many completed pipelines vs restoring everything (prints the ratio).
bench-restore: install
	$(BIN)/python -m benchmarks restore

# Start-up to the first committed epoch and steady-epoch time, local mode vs a standalone cluster.
bench-cluster: install
	$(BIN)/python -m benchmarks cluster $(BENCH_ARGS)

# Latency from send to visible by rate, ours vs Structured Streaming micro-batch (benchmarks/latency.py).
bench-latency: install
	$(BIN)/python -m benchmarks latency $(BENCH_ARGS)

# N random fault cycles on a standalone cluster of two one-core workers (driver, executor and worker
# loss) with a report in results/soak.md (records lost and duplicated must be 0); local mode: SOAK_ARGS=.
soak: install
	$(BIN)/python -m benchmarks.soak --cycles $(N) $(SOAK_ARGS) --report results/soak.md

# Remove each safety line of the commit protocol (tools/mutants/) in turn: the unit tests must
# catch every one (e.g. make mutation MUTATION_ARGS="--only head-cas-plain-put -j 1").
mutation: install
	$(BIN)/python tools/mutation.py $(MUTATION_ARGS)

# Lint (rules in pyproject.toml's [tool.ruff]) and formatting (`ruff format`, the Python blocks of the docs'
# Markdown too; `make format` applies it).
lint: install
	$(BIN)/ruff check pipeline_lib tests tools dags plugins benchmarks testing_servers
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .

# Types (pyproject.toml's [tool.mypy]: strict for spec, plan, checkpoint and storage), with the checkout's
# benchmarks and test servers.
typecheck: install
	$(BIN)/mypy pipeline_lib benchmarks testing_servers

clean:
	-$(BIN)/python -c 'from pipeline_lib.execution.engine.jvm_archive import archive_path as a; a() and a().unlink(missing_ok=True)'
	rm -rf $(VENV) $(DELTA_VENV) demo-output .stack
