"""``stack up | env | down | status``: the embedded local stack (a Kafka-protocol broker and an S3 server)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from pipeline_lib.commands.output import err, fail, out
from pipeline_lib.errors import PipelineError

DEFAULT_STACK_DIR = Path(os.environ.get("PIPELINE_STACK_DIR", ".stack"))
stack_app = typer.Typer(help="The embedded local stack: Kafka-protocol broker + S3 server.", no_args_is_help=True)


@stack_app.command("up")
def stack_up(
    data_dir: Annotated[Path, typer.Option("--dir", help="Data directory of the stack.")] = DEFAULT_STACK_DIR,
    broker_storage: Annotated[str, typer.Option(help="Tansu's log: s3 (durable) or memory.")] = "s3",
    broker: Annotated[
        str,
        typer.Option(
            help="tansu (embedded, quick to start) or kafka (Apache Kafka from Maven Central jars, "
            "fetched on first use)."
        ),
    ] = "tansu",
) -> None:
    """Start the broker and S3 server on free 127.0.0.1 ports; print export lines."""
    from pipeline_lib.localstack import start_stack

    try:
        info = start_stack(data_dir.resolve(), broker_storage=broker_storage, broker=broker)
    except Exception as exc:
        fail(exc)
    err.print(
        f"stack up in {data_dir} ({info.broker} broker pid {info.broker_pid}, s3 pid {info.s3_pid}); "
        f'run: eval "$(pipeline-lib stack env --dir {data_dir})"'
    )
    print(info.export_lines())


@stack_app.command("env")
def stack_env(data_dir: Annotated[Path, typer.Option("--dir")] = DEFAULT_STACK_DIR) -> None:
    """Print the export lines of a running stack."""
    from pipeline_lib.localstack import load_stack

    info = load_stack(data_dir.resolve())
    if info is None:
        fail(PipelineError(f"no stack recorded in {data_dir}"))
    print(info.export_lines())


@stack_app.command("down")
def stack_down(data_dir: Annotated[Path, typer.Option("--dir")] = DEFAULT_STACK_DIR) -> None:
    """Stop the stack's processes (by PID)."""
    from pipeline_lib.localstack import stop_stack

    stopped = stop_stack(data_dir.resolve())
    err.print("stack stopped" if stopped else f"no stack running in {data_dir}")


@stack_app.command("status")
def stack_status(data_dir: Annotated[Path, typer.Option("--dir")] = DEFAULT_STACK_DIR) -> None:
    """Show whether the stack's processes are alive."""
    from pipeline_lib.localstack import stack_status as status

    out.print_json(json.dumps(status(data_dir.resolve()), default=str))
