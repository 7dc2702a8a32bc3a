"""The command-line options the benchmark commands share, named once (benchmarks/commands.py,
benchmarks/feature_commands.py): each command gives only its own default."""

from __future__ import annotations

from typing import Annotated

import typer

Events = Annotated[int, typer.Option(min=1, help="JSON payment events to produce.")]
Users = Annotated[int, typer.Option(min=1, help="Distinct users (keys).")]
PerEpoch = Annotated[int, typer.Option(min=1, help="Max records per epoch.")]
PerEpochAndTrigger = Annotated[int, typer.Option(min=1, help="Max records per epoch (and per Spark trigger).")]
BothEngines = Annotated[int, typer.Option(min=1, help="local[N] for both engines.")]
JobParallelism = Annotated[int, typer.Option(min=1, help="The job's parallelism (local[N]).")]
Workers = Annotated[int, typer.Option(min=1, help="One-core workers of the standalone cluster.")]
Repeat = Annotated[int, typer.Option(min=1, help="Runs per mode (medians are reported).")]
Partitions = Annotated[int, typer.Option(min=1, help="Kafka partitions of the benchmark topic.")]
Kinds = Annotated[str, typer.Option(help="Jobs: stateless,aggregate (either or both).")]
Seconds = Annotated[float, typer.Option(min=1, help="Seconds of producing at each rate.")]
