"""Short scheduled runs: the whole process over a small backlog, where start-up is the cost.

Airflow launches ``--until-caught-up`` runs every few minutes over a small backlog. So, in the
same bench invocation, a fresh topic of ``cfg.short_events`` events is read by a new job of ours
(``pipeline-lib run SPEC --until-caught-up --timings``) and by Structured Streaming with Spark's
Kafka connector and an S3A checkpoint (availableNow), each as a whole process timed from spawn
to exit. Both tables are checked against the plain-Python reference. From our run's log lines
comes how long after the Spark session was up (the "pipeline ... attempt" line, logged as soon as
the session has started) epoch 1 committed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.config import BenchConfig
from benchmarks.events import produce_payments
from benchmarks.listed_ends import unseen_tail, without
from benchmarks.measures import compare
from benchmarks.our_job import run_cli, upsert_table_ours, write_spec
from benchmarks.structured_streaming_run import run_structured_streaming_kafka
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings


def short_runs(
    bootstrap: str,
    env: dict[str, str],
    settings: ConnectionSettings,
    cfg: BenchConfig,
    work: Path,
    logs: Path,
    tag: str,
) -> dict[str, Any]:
    """Both engines over a fresh backlog of ``cfg.short_events`` events: whole-process times,
    their ratio, and our epoch 1 measured from the Spark session being up."""
    topic, job = f"bench-short-{tag}", f"bench-short-ours-{tag}"
    produced = produce_payments(bootstrap, topic, cfg.short_events, cfg.keys, cfg.partitions, cfg.seed + 3)
    expected = spend_per_user(produced.events)

    spec, sink, _ = write_spec(work / f"{job}.yaml", job, topic, cfg)
    run = run_cli(["run", str(spec), "--until-caught-up", "--timings"], env, logs / "ours-short.log")
    if run.returncode != 0:
        raise RuntimeError(f"our short run failed (exit {run.returncode}); see {logs / 'ours-short.log'}")
    first = run.epochs[0]["at_s"] if run.epochs else None
    session_up = run.pipeline_started_at_s
    ours = {
        "wall_s": round(run.wall_s, 3),
        "epochs": len(run.epochs),
        "records": sum(e["records"] for e in run.epochs),
        "spark_session_up_s": session_up,
        "first_epoch_committed_s": first,
        "first_epoch_after_session_s": (
            round(first - session_up, 3) if first is not None and session_up is not None else None
        ),
        "check": compare(upsert_table_ours(sink, settings), expected),
    }

    tail = unseen_tail(bootstrap, topic, produced.ranges)
    sss = run_structured_streaming_kafka(
        bootstrap,
        env,
        topic,
        cfg,
        work,
        logs,
        without(expected, tail),
        settings,
        f"bench-short-sss-{tag}",
        label="structured-streaming-kafka-short",
    )
    sss["records_unseen"] = len(tail)
    return {
        "events": cfg.short_events,
        "topic": topic,
        "ours": ours,
        "structured_streaming_kafka": sss,
        "ours_speedup": round(sss["wall_s"] / run.wall_s, 3) if run.wall_s else None,
    }
