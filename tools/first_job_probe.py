"""Time a fresh local Spark session as a run starts it: the session up, then its first two Python jobs.

    .venv/bin/python tools/first_job_probe.py [--runs 3] [--conf spark.KEY=VALUE ...]
    PIPELINE_JVM_ARCHIVE=off .venv/bin/python tools/first_job_probe.py    # without the JVM archive
    ... --conf spark.python.daemon.module=pyspark.daemon                  # Spark's own daemon

Each run is a new process (``start_spark`` as the runner calls it) that prints seconds from its
start to the session being up, and for each job the seconds from its submission to the first
line of the task's code in the Python worker, and to its rows back. A profiling aid for the
start-up levers (docs/performance.md), not a benchmark of record.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, sys, time
started = time.time()
from pipeline_lib.execution.engine.spark_session import start_spark
spark = start_spark("first-job-probe", None, 2, overrides=json.loads(sys.argv[1]))
up = time.time()
def task(rows):
    import time
    yield time.time()
jobs = []
for _ in range(2):
    submitted = time.time()
    first_code = min(spark.sparkContext.parallelize(range(2), 2).mapPartitions(task).collect())
    jobs.append((first_code - submitted, time.time() - submitted))
print(f"session up {up - started:.2f} s; " + "; ".join(
    f"job {i + 1}: task code at +{code:.3f} s, rows at +{done:.3f} s" for i, (code, done) in enumerate(jobs)))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--conf", action="append", default=[], help="spark.KEY=VALUE for the session")
    args = parser.parse_args()
    overrides = json.dumps(dict(item.split("=", 1) for item in args.conf))
    for _ in range(args.runs):
        done = subprocess.run([sys.executable, "-c", CHILD, overrides], capture_output=True, text=True, check=True)
        print(done.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
