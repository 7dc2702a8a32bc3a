"""The worker's long-lived heap is frozen once per process, so Spark's gc.collect() after each task
skips it (see execution/source/worker_heap)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc
from pipeline_lib.execution.source.worker_heap import freeze_imported_heap
import pyarrow, pyspark.sql  # what a worker has imported by its first task
assert gc.get_freeze_count() == 0
freeze_imported_heap()
frozen = gc.get_freeze_count()
assert frozen > 10_000, frozen
garbage = [[i] for i in range(1000)]  # made by a task: not frozen by a later call
freeze_imported_heap()
assert gc.get_freeze_count() == frozen
print("ok")
"""


def test_the_heap_is_frozen_once_per_process_and_task_garbage_is_not():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
