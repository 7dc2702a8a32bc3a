"""Keep Spark's per-task garbage collection in reused Python workers cheap.

With ``spark.python.worker.reuse`` (on here), PySpark's daemon calls ``gc.collect()`` in a worker
after every task (pyspark/daemon.py). A full collection walks every container object the worker
holds, and a worker that imported pyarrow, pandas, pyspark and this project holds about 80,000,
which would make even an empty task cost its worker the walk over all of them.
``gc.freeze`` moves the objects that exist at that moment into a permanent generation which
collections skip; they are imported modules and what they hold. It runs once per worker
process, at the start of its first task of ours; garbage made by tasks is still collected. No
collection runs before it: the few dozen cycles left by the imports are frozen with the rest
(kept for the worker's life), because a full collection of the imported heap costs each worker
tens of milliseconds of CPU at the start of epoch 1's read, where every worker waits for it.
"""

from __future__ import annotations

import gc
import os

_frozen_in: int | None = None  # the pid that froze its heap (a forked child must freeze its own)


def freeze_imported_heap() -> None:
    """Call at the start of a task in a Spark Python worker (cheap after the first call)."""
    global _frozen_in
    pid = os.getpid()
    if _frozen_in != pid:
        gc.freeze()
        _frozen_in = pid
