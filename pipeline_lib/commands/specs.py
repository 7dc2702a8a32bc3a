"""``validate`` and ``spec schema``: check a job spec, and print the schema editors check one with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pipeline_lib.commands.output import fail, out
from pipeline_lib.errors import PipelineError

spec_app = typer.Typer(help="The job spec's format.", no_args_is_help=True)


def validate(spec: Annotated[Path, typer.Argument(help="Job spec YAML.")]) -> None:
    """Check a job spec without starting anything."""
    from pipeline_lib.spec import load_spec

    try:
        job = load_spec(spec)
    except PipelineError as exc:
        fail(exc)
    out.print(f"{spec}: job {job.name!r} is valid")
    hooks = [t.python for f in job.all_flows() for t in f.transforms if t.python is not None]
    if hooks:
        out.print(
            f"note: python hooks ({', '.join(sorted(set(hooks)))}) must be stateless: what a hook keeps between "
            "calls is in no snapshot; keep state with state.process (docs/your-own-state.md)"
        )


@spec_app.command("schema")
def spec_schema() -> None:
    """Print the JSON Schema of a job spec, for editors (e.g. yaml-language-server's
    "# yaml-language-server: $schema=FILE" line); the fields are described in docs/spec.md."""
    from pipeline_lib.spec.models import job_spec_json_schema

    print(json.dumps(job_spec_json_schema(), indent=2))  # plain print: exact JSON, never wrapped
