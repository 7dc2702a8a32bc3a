"""Time one restore of a job's latest snapshot, in a fresh process, the way ``pipeline-lib run`` does it.

    python -m benchmarks.restore_probe SPEC.yaml   (prints JSON)

What is timed is ``PipelineRunner.restore()`` for the job's (single) pipeline — exactly the call
``run`` makes before it starts Spark: read the head, load and verify the manifest, fetch every
referenced state object (a pack of state files) from the checkpoint store, check each file's
SHA-256, decode the Parquet files into Arrow tables, then load them into the in-memory keyed
state (with their stored key groups). The child process of the throughput benchmark's restore
measurement (restore_sizes.py), not a command of its own.
The breakdown, in wall-clock seconds, splits it into two phases that follow each other:

    read_s    restore_snapshot: head, manifest, sink markers, and every state file fetched,
              SHA-256-checked and decoded (on IO_THREADS threads, so these overlap)
    load_s    the rest: the files' tables and key groups loaded into the keyed state

plus ``fetch_thread_s``, the time spent inside SnapshotStore.read_state_object summed over the reading
threads: thread-seconds, not a phase (with 8 threads it can exceed ``read_s``).

Python start-up and imports are not in ``restore_s``; the caller times the whole process too.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    """Time ``PipelineRunner.restore()`` in this fresh process (no warm caches) and print its breakdown as JSON."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
    from pipeline_lib.execution.runtime import runner_restore
    from pipeline_lib.execution.runtime.runner_factory import build_runner
    from pipeline_lib.execution.runtime.runner_types import RunOptions
    from pipeline_lib.graph import build_graph
    from pipeline_lib.settings import ConnectionSettings
    from pipeline_lib.spec import load_spec

    job = load_spec(argv[0])
    pipeline = build_graph(job).pipelines()[0]
    runner = build_runner(job, pipeline, ConnectionSettings.from_env(), RunOptions(restore="latest"))
    timings = {"fetch_thread_s": 0.0, "read_s": 0.0}

    read_state_object = SnapshotStore.read_state_object
    restore_snapshot = runner_restore.restore_snapshot

    def timed_read(self, key):
        started = time.monotonic()
        try:
            return read_state_object(self, key)
        finally:
            timings["fetch_thread_s"] += time.monotonic() - started

    def timed_restore(*args, **kwargs):
        started = time.monotonic()
        try:
            return restore_snapshot(*args, **kwargs)
        finally:
            timings["read_s"] += time.monotonic() - started

    SnapshotStore.read_state_object = timed_read  # type: ignore[method-assign]
    runner_restore.restore_snapshot = timed_restore
    started = time.monotonic()
    restored = runner.restore()
    total = time.monotonic() - started
    if restored is None:
        print(json.dumps({"error": "no snapshot to restore"}))
        return 1
    keys = sum(len(f.state) for f in runner.parts.flows if f.state is not None)
    state_files = restored.manifest.state_files()
    print(
        json.dumps(
            {
                "snapshot": restored.manifest.snapshot_id,
                "keys": keys,
                "state_files": len(state_files),
                "state_bytes": sum(ref.bytes for ref in state_files),
                "restore_s": round(total, 4),
                "read_s": round(timings["read_s"], 4),
                "load_s": round(total - timings["read_s"], 4),
                "fetch_thread_s": round(timings["fetch_thread_s"], 4),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
