"""The benchmarks' one command line: ``python -m benchmarks`` (``make bench``), or ``pipeline-lib bench``.

``python -m benchmarks [OPTIONS]`` runs the throughput benchmark (throughput.py);
its sub-commands ``restore``, ``cluster``, ``driver`` and ``latency`` run the restore, cluster,
driver-load and latency benchmarks (restore_completed.py, cluster_vs_local.py, driver_load.py,
latency.py); the features' sub-commands (windows, tables, process, autoscale, joins, stream-joins,
kafka-sink, delta, decoding) are in feature_commands.py. The Makefile's bench targets call these;
in a source checkout ``pipeline-lib bench`` mounts the same app (pipeline_lib/bench_command.py).
Each benchmark's modules load only when it runs, so mounting this costs other commands nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from benchmarks import feature_commands
from benchmarks.bench_options import BothEngines, Events, Kinds, Partitions, PerEpoch, Repeat, Seconds, Users, Workers

bench_app = typer.Typer()  # its help is the throughput command's docstring (the callback below)


@bench_app.callback(invoke_without_command=True)
def throughput(
    ctx: typer.Context,
    events: Events = 1_000_000,
    keys: Users = 100_000,
    per_epoch: Annotated[
        int, typer.Option(min=1, help="Max records per epoch (ours) and per micro-batch (Structured Streaming).")
    ] = 100_000,
    restore_keys: Annotated[
        str, typer.Option(help="State sizes for the restore measurement, comma-separated.")
    ] = "10000,100000,1000000",
    partitions: Partitions = 4,
    parallelism: BothEngines = 2,
    incremental: Annotated[
        str, typer.Option(help="Small incremental runs: key_groups,users (or none).")
    ] = "key_groups,users",
    no_recovery: Annotated[bool, typer.Option("--no-recovery", help="Skip the SIGKILL/restart measurement.")] = False,
    short_events: Annotated[
        int,
        typer.Option(
            min=0,
            help="Backlog of the short scheduled runs (ours --until-caught-up vs Structured Streaming); 0 skips them.",
        ),
    ] = 50_000,
    broker: Annotated[
        str,
        typer.Option(
            help="kafka (Apache Kafka from Maven Central jars, what production runs) or tansu (the embedded broker)."
        ),
    ] = "kafka",
    out: Annotated[Path, typer.Option(help="Folder for report.md, report.json, plots and logs.")] = Path(
        "results/bench"
    ),
) -> None:
    """Throughput: this project's job vs Spark Structured Streaming vs raw Kafka consumers, with a report.

    Structured Streaming runs three times: with a Python Kafka source and a local checkpoint, and
    with Spark's own Kafka connector and its checkpoint on the S3 server (s3a://) or on local disk.
    Raw consumption runs with kafka-python and confluent-kafka. A short scheduled run over a small
    fresh backlog (--short-events) times both engines' whole processes. Every engine runs on
    one embedded stack; report.md, report.json, plots and logs go to --out (see
    benchmarks/throughput.py for what each figure times). The sub-commands run the other
    benchmarks instead."""
    if ctx.invoked_subcommand is not None:
        given = [f"--{p.name.replace('_', '-')}" for p in ctx.command.params if p.name and _given(ctx, p.name)]
        if given:
            raise typer.BadParameter(
                f"{', '.join(given)}: throughput options, given before the sub-command "
                f"{ctx.invoked_subcommand} (see {ctx.command_path} {ctx.invoked_subcommand} "
                "--help for its own)"
            )
        return
    from benchmarks.config import BenchConfig, parse_keys, parse_kinds
    from benchmarks.throughput import report_and_exit, run_bench

    try:
        sizes = parse_keys(restore_keys)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--restore-keys") from None
    try:
        kinds = parse_kinds(incremental)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--incremental") from None
    cfg = BenchConfig(
        events=events,
        keys=keys,
        per_epoch=per_epoch,
        restore_keys=sizes,
        partitions=partitions,
        parallelism=parallelism,
        incremental=kinds,
        recovery=not no_recovery,
        out=out,
        broker=broker,
        short_events=short_events,
    )
    raise typer.Exit(report_and_exit(run_bench(cfg), cfg))


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was given (not its default). By the source's name: Typer carries
    a click of its own, whose ParameterSource is not click's."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


@bench_app.command("restore")
def restore(
    pipelines: Annotated[int, typer.Option(min=1, help="Pipelines of the job, one bounded topic each.")] = 12,
    events: Annotated[int, typer.Option(min=1, help="Records per pipeline.")] = 20_000,
    users: Annotated[int, typer.Option(min=1, help="Keys of each pipeline's state.")] = 5_000,
    repeat: Repeat = 3,
) -> None:
    """Restore time with many completed pipelines: skipping them vs restoring everything.

    Prints the medians and their ratio (see benchmarks/restore_completed.py)."""
    from benchmarks.restore_completed import restore_completed

    raise typer.Exit(restore_completed(pipelines=pipelines, events=events, users=users, repeat=repeat))


@bench_app.command("cluster")
def cluster(
    events: Events = 120_000,
    users: Users = 5_000,
    per_epoch: PerEpoch = 20_000,
    workers: Workers = 2,
    parallelism: Annotated[int, typer.Option(min=1, help="The job's parallelism (local[N] in local mode).")] = 2,
    repeat: Repeat = 2,
) -> None:
    """Start-up to the first committed epoch and steady-epoch time, local mode vs a standalone cluster.

    Prints the medians per mode and the cluster/local ratios (see benchmarks/cluster_vs_local.py)."""
    from benchmarks.cluster_vs_local import cluster_vs_local

    raise typer.Exit(
        cluster_vs_local(
            events=events, users=users, per_epoch=per_epoch, workers=workers, parallelism=parallelism, repeat=repeat
        )
    )


@bench_app.command("scale-out")
def scale_out(
    events: Events = 600_000,
    users: Users = 20_000,
    per_epoch: PerEpoch = 100_000,
    partitions: Annotated[int, typer.Option(min=1, help="Partitions of the topic.")] = 4,
    repeat: Annotated[int, typer.Option(min=1, help="Runs per core count (medians are reported).")] = 2,
) -> None:
    """Steady throughput on one and on two one-core workers of a standalone cluster, and the speed-up.

    Prints the medians per core count, the ratio and the per-core efficiency (see benchmarks/scale_out.py)."""
    from benchmarks.scale_out import scale_out as run_scale_out

    raise typer.Exit(
        run_scale_out(events=events, users=users, per_epoch=per_epoch, partitions=partitions, repeat=repeat)
    )


@bench_app.command("driver")
def driver(
    keys: Annotated[str, typer.Option(help="State sizes (distinct users), comma-separated.")] = "10000,100000,1000000",
    per_epoch: PerEpoch = 100_000,
    workers: Workers = 2,
    parallelism: Annotated[int, typer.Option(min=1, help="The job's parallelism.")] = 2,
    modes: Annotated[
        str, typer.Option(help="Where keyed state lives: owners,driver (either or both).")
    ] = "owners,driver",
    out: Annotated[Path, typer.Option(help="Folder for report.md and report.json.")] = Path("results/bench-driver"),
) -> None:
    """What the driver receives, its CPU and its memory as the keyed state grows, owner tasks vs the driver path.

    On a standalone cluster started here (see benchmarks/driver_load.py)."""
    from benchmarks.config import parse_keys
    from benchmarks.driver_load import MODES, driver_load

    try:
        sizes = parse_keys(keys)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--keys") from None
    chosen = tuple(m.strip() for m in modes.split(",") if m.strip())
    if not chosen or set(chosen) - set(MODES):
        raise typer.BadParameter(f"{modes!r}: choose from {', '.join(MODES)}", param_hint="--modes")
    raise typer.Exit(
        driver_load(sizes, per_epoch=per_epoch, workers=workers, parallelism=parallelism, modes=chosen, out=out)
    )


@bench_app.command("latency")
def latency(
    rates: Annotated[str, typer.Option(help="Producer rates (events per second), comma-separated.")] = "20,100,500",
    seconds: Seconds = 20.0,
    users: Users = 1_000,
    interval: Annotated[str, typer.Option(help="Our job's trigger.interval (e.g. '100 ms').")] = "100 ms",
    kinds: Kinds = "stateless,aggregate",
    parallelism: BothEngines = 2,
    out: Annotated[Path, typer.Option(help="Folder for latency.csv, latency.json and latency.png.")] = Path(
        "results/bench-latency"
    ),
    engines: Annotated[
        str,
        typer.Option(help="Engines, comma-separated: ours, spark-ss, ours-kafka, spark-ss-kafka, spark-rtm."),
    ] = "ours,spark-ss,ours-kafka,spark-ss-kafka,spark-rtm",
    broker: Annotated[str, typer.Option(help="kafka (Apache Kafka) or tansu (the embedded broker).")] = "kafka",
) -> None:
    """Latency from send to visible, by rate: this project's job vs Structured Streaming, micro-batch
    and real-time mode.

    p50/p95/p99/max per rate for the stateless and the aggregate job, to files and to Kafka, with
    the snapshot cost per epoch beside (see benchmarks/latency.py)."""
    from benchmarks.config import parse_keys
    from benchmarks.latency import ENGINES, KINDS
    from benchmarks.latency import latency as run_latency
    from pipeline_lib.spec.durations import parse_duration

    try:
        chosen_rates = parse_keys(rates)
        if not chosen_rates or min(chosen_rates) < 1:
            raise ValueError(f"{rates!r}: give rates of at least 1 event per second")
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--rates") from None
    try:
        parse_duration(interval)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--interval") from None
    chosen = tuple(k.strip() for k in kinds.split(",") if k.strip())
    if not chosen or set(chosen) - set(KINDS):
        raise typer.BadParameter(f"{kinds!r}: choose from {', '.join(KINDS)}", param_hint="--kinds")
    picked = tuple(e.strip() for e in engines.split(",") if e.strip())
    if not picked or set(picked) - set(ENGINES):
        raise typer.BadParameter(f"{engines!r}: choose from {', '.join(ENGINES)}", param_hint="--engines")
    if broker not in ("kafka", "tansu"):
        raise typer.BadParameter(f"{broker!r}: kafka or tansu", param_hint="--broker")
    raise typer.Exit(run_latency(chosen_rates, seconds, users, interval, chosen, parallelism, out, picked, broker))


feature_commands.register(bench_app)  # after the commands above: the help lists them in this order
