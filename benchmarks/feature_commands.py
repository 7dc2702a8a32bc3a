"""The benchmarks' sub-commands of the library's features: windows, table sinks, process state,
autoscaling, joins, stream-stream joins, the Kafka and Delta sinks, and batch decoding.

commands.py registers them on ``bench_app`` after its own (the throughput callback, restore,
cluster, scale-out, driver, latency), so the help lists them in that order. Each benchmark's
modules load only when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from benchmarks.bench_options import (
    BothEngines,
    Events,
    JobParallelism,
    Kinds,
    Partitions,
    PerEpochAndTrigger,
    Users,
)


def windows(
    events: Annotated[int, typer.Option(min=1, help="JSON click events to produce.")] = 200_000,
    pages: Annotated[int, typer.Option(min=1, help="Distinct pages (keys).")] = 1_000,
    per_epoch: PerEpochAndTrigger = 20_000,
    parallelism: JobParallelism = 2,
    sketches: Annotated[
        bool, typer.Option(help="Also approx_count_distinct(user) and approx_percentile(ms, 0.95) on both sides.")
    ] = False,
    keyed_state: Annotated[
        str, typer.Option(help="Where our windows merge: auto (the driver in local mode), owners or driver.")
    ] = "auto",
    gap: Annotated[
        str | None, typer.Option(help="Session windows of this gap (e.g. '30 seconds') on both sides instead.")
    ] = None,
) -> None:
    """1-minute tumbling windows with a watermark: ours vs Spark SS withWatermark + window, append.

    Prints both whole-process times and their ratio (see benchmarks/windows.py)."""
    from benchmarks.windows import windows_bench

    if keyed_state not in ("auto", "owners", "driver"):
        raise typer.BadParameter(f"{keyed_state!r}: choose from auto, owners, driver", param_hint="--keyed-state")
    bench = windows_bench(
        events=events,
        pages=pages,
        per_epoch=per_epoch,
        parallelism=parallelism,
        sketches=sketches,
        keyed_state=keyed_state,
        gap=gap,
    )
    raise typer.Exit(bench)


def tables(
    epochs: Annotated[int, typer.Option(min=1, help="Epochs written to each table.")] = 20,
    keys: Annotated[int, typer.Option(min=1, help="Distinct keys of the aggregate.")] = 100_000,
    changed: Annotated[int, typer.Option(min=1, help="Keys (rows) each epoch changes (writes).")] = 2_000,
    parts: Annotated[int, typer.Option(min=1, help="Staged parts per epoch (the executors' files).")] = 4,
) -> None:
    """The Iceberg sink's driver commit per epoch against the Delta sink's, upsert and append (see
    benchmarks/table_commits.py; no Spark SS Iceberg writer for Spark 4.x is available here)."""
    from benchmarks.table_commits import tables_bench

    raise typer.Exit(tables_bench(epochs=epochs, keys=keys, changed=min(changed, keys), parts=parts))


def process(
    events: Annotated[int, typer.Option(min=1, help="JSON events to produce.")] = 200_000,
    active: Annotated[int, typer.Option(min=1, help="Users active at a time (the set slides).")] = 200,
    per_epoch: PerEpochAndTrigger = 20_000,
    parallelism: JobParallelism = 2,
) -> None:
    """Per-user session totals with an event-time timer: ours vs Spark SS applyInPandasWithState.

    Prints both whole-process times and their ratio (see benchmarks/process_bench.py)."""
    from benchmarks.process_bench import process_bench

    raise typer.Exit(process_bench(events=events, active=active, per_epoch=per_epoch, parallelism=parallelism))


def autoscale(
    rates: Annotated[str, typer.Option(help="Producer rates (events per second) in turn, comma-separated.")] = (
        "200,2000,200"
    ),
    seconds: Annotated[
        str, typer.Option(help="Seconds of producing at each rate: one for all, or one per rate, comma-separated.")
    ] = "20",
    max_parallelism: Annotated[int, typer.Option("--max", min=1, help="autoscale.max of the run with it on.")] = 2,
    target_lag: Annotated[int, typer.Option(min=1, help="autoscale.target_lag_records.")] = 2_000,
    per_epoch: Annotated[int, typer.Option(min=1, help="trigger.max_records_per_epoch.")] = 2_000,
    workers: Annotated[
        int, typer.Option(min=0, help="One-core workers of a Spark standalone cluster (0: local mode).")
    ] = 2,
    out: Annotated[
        Path | None, typer.Option(help="Where report.md and autoscale.svg go (default: a temp dir).")
    ] = None,
    per_subtask: Annotated[
        int | None,
        typer.Option(min=1, help="trigger.max_records_per_subtask (then max_records_per_epoch is it times --max)."),
    ] = None,
    record_cost_ms: Annotated[
        float,
        typer.Option(min=0, help="Milliseconds every record waits in its task: an I/O-bound job (0: none)."),
    ] = 0.0,
    scale_down_at: Annotated[
        float, typer.Option(min=0, help="autoscale.scale_down_at: the load at or under which it scales down.")
    ] = 0.5,
) -> None:
    """Lag and parallelism over time under a stepped input rate, autoscaling off and on.

    On a standalone cluster of --workers one-core workers (dynamic allocation on) unless 0. Prints both
    series side by side and each run's largest and final lag, and writes report.md with the figure
    autoscale.svg to --out (see benchmarks/autoscale.py)."""
    from benchmarks.autoscale import autoscale as run_autoscale
    from benchmarks.autoscale_report import step_seconds
    from benchmarks.config import parse_keys

    try:
        chosen = parse_keys(rates)
        if not chosen or min(chosen) < 1:
            raise ValueError(f"{rates!r}: give rates of at least 1 event per second")
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--rates") from None
    try:
        durations = step_seconds(chosen, [float(part) for part in seconds.split(",")])
        if min(durations) < 1:
            raise ValueError(f"{seconds!r}: give at least 1 second a step")
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--seconds") from None
    raise typer.Exit(
        run_autoscale(
            chosen,
            durations,
            max_parallelism,
            target_lag,
            per_epoch,
            workers,
            out,
            per_subtask,
            record_cost_ms,
            scale_down_at,
        )
    )


def joins(
    events: Annotated[int, typer.Option(min=1, help="JSON order events to produce.")] = 200_000,
    users: Annotated[int, typer.Option(min=1, help="Rows of the joined users table.")] = 10_000,
    per_epoch: PerEpochAndTrigger = 20_000,
    parallelism: JobParallelism = 2,
    dedup: Annotated[
        bool, typer.Option(help="Drop re-sent orders first: dedup vs dropDuplicatesWithinWatermark.")
    ] = False,
    keyed_state: Annotated[str, typer.Option(help="Our job's keyed_state: auto, driver or owners.")] = "auto",
) -> None:
    """A stream-static join, then sum and count per country: ours vs Spark SS join + groupBy, update.

    Prints both whole-process times and their ratio (see benchmarks/joins.py)."""
    from benchmarks.joins import joins_bench

    raise typer.Exit(
        joins_bench(
            events=events,
            users=users,
            per_epoch=per_epoch,
            parallelism=parallelism,
            dedup=dedup,
            keyed_state=keyed_state,
        )
    )


def stream_joins(
    orders: Annotated[int, typer.Option(min=1, help="Orders to produce (each with 0-2 payments).")] = 50_000,
    per_epoch: PerEpochAndTrigger = 20_000,
    parallelism: JobParallelism = 2,
) -> None:
    """A stream-stream interval join of orders and payments: ours vs Spark SS with withWatermark on both sides.

    Prints both whole-process times and their ratio (see benchmarks/stream_joins.py)."""
    from benchmarks.stream_joins import stream_joins_bench

    raise typer.Exit(stream_joins_bench(orders=orders, per_epoch=per_epoch, parallelism=parallelism))


def kafka_sink(
    events: Events = 500_000,
    users: Users = 50_000,
    per_epoch: PerEpochAndTrigger = 100_000,
    partitions: Annotated[int, typer.Option(min=1, help="Partitions of the source and of each output topic.")] = 4,
    parallelism: BothEngines = 2,
    kinds: Kinds = "stateless,aggregate",
    logs: Annotated[Path | None, typer.Option(help="Keep the runs' logs and specs in this folder.")] = None,
) -> None:
    """Kafka to Kafka: our exactly-once Kafka sink vs Spark SS writeStream.format("kafka"), on Apache Kafka.

    Stateless (a filter) and aggregate (an update stream per user); prints both whole-process
    times, events/s and the speed-up, and checks every output topic read back with read_committed
    (see benchmarks/kafka_sink.py). Exit 1 only if an output is wrong."""
    from benchmarks.kafka_sink import kafka_sink_bench
    from benchmarks.structured_streaming_kafka_sink import KINDS

    chosen = tuple(k.strip() for k in kinds.split(",") if k.strip())
    if not chosen or set(chosen) - set(KINDS):
        raise typer.BadParameter(f"{kinds!r}: choose from {', '.join(KINDS)}", param_hint="--kinds")
    raise typer.Exit(
        kafka_sink_bench(
            events=events,
            users=users,
            per_epoch=per_epoch,
            partitions=partitions,
            parallelism=parallelism,
            kinds=chosen,
            keep=logs,
        )
    )


def delta(
    events: Events = 200_000,
    users: Annotated[int, typer.Option(min=1, help="Distinct users (keys, the table's rows).")] = 20_000,
    per_epoch: PerEpochAndTrigger = 50_000,
    partitions: Partitions = 2,
    parallelism: BothEngines = 2,
) -> None:
    """A running aggregate into a Delta table: our sink.delta vs Spark SS foreachBatch + delta-spark MERGE.

    Spark runs in the second environment of `make delta-spark-env`; both tables are read back
    and checked against plain Python; prints both whole-process times and the ratio (see
    benchmarks/delta_bench.py). Exit 1 only if a table is wrong."""
    from benchmarks.delta_bench import delta_bench

    raise typer.Exit(
        delta_bench(events=events, users=users, per_epoch=per_epoch, partitions=partitions, parallelism=parallelism)
    )


def decoding(
    batches: Annotated[int, typer.Option(min=1, help="Record batches in the fetch.")] = 20,
    records: Annotated[int, typer.Option(min=1, help="Records per batch.")] = 300,
    rounds: Annotated[int, typer.Option(min=1, help="Interleaved rounds (the median is printed).")] = 7,
) -> None:
    """CPU of decoding a fetch's record batches: each alone vs all together (no broker, no Spark).

    See benchmarks/decoding.py. Exit 1 only if the two give different columns."""
    from benchmarks.decoding import decoding_bench

    raise typer.Exit(decoding_bench(batches=batches, records=records, rounds=rounds))


def register(app: typer.Typer) -> None:
    """Add these sub-commands to ``app``, in the order its help lists them."""
    app.command("windows")(windows)
    app.command("tables")(tables)
    app.command("process")(process)
    app.command("autoscale")(autoscale)
    app.command("joins")(joins)
    app.command("stream-joins")(stream_joins)
    app.command("kafka-sink")(kafka_sink)
    app.command("delta")(delta)
    app.command("decoding")(decoding)
