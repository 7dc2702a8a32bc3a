"""What every command prints with: the two consoles, errors, per-pipeline tables, and the
``--log-format json`` switch that turns a run's report lines into JSON objects."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipeline_lib.errors import PipelineError
from pipeline_lib.logs import scrub
from pipeline_lib.settings import ConnectionSettings

# markup=False: what the CLI prints holds names, paths, patterns and record data, which must
# print literally ("[a-z0-9]" is not a style, "[/b]" not a closing tag); styles go in Text parts.
err = Console(stderr=True, soft_wrap=True, markup=False)
out = Console(soft_wrap=True, markup=False)
if not out.is_terminal:
    out.width = 140
log = logging.getLogger("pipeline_lib.cli")


_json_logs = False  # --log-format json: what the CLI reports on stderr goes out as JSON lines too


def use_json(value: bool) -> None:
    """Set by ``--log-format``: errors and a run's report lines go out as JSON objects too."""
    global _json_logs
    _json_logs = value


def json_logs() -> bool:
    """True under ``--log-format json``."""
    return _json_logs


def fail(exc: Exception, settings: ConnectionSettings | None = None) -> NoReturn:
    """Print ``exc`` as the command's error, secrets scrubbed, and exit: 2 for a PipelineError (the
    spec, an option or the data is wrong), 1 for anything else."""
    message = scrub(str(exc), settings.secrets() if settings else ConnectionSettings.from_env().secrets())
    if _json_logs:
        log.error("error: %s", message, extra={"fields": {"event": "error"}})
    else:
        err.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False)
    raise typer.Exit(code=2 if isinstance(exc, PipelineError) else 1)


def first_line(exc: BaseException) -> str:
    """The first non-blank line of ``exc`` (a Spark/py4j error's message, not its JVM stack trace)."""
    return next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def bold(prefix: str, rest: str) -> Text:
    """``prefix`` in bold, then ``rest``: both literal text, never markup."""
    return Text.assemble((prefix, "bold"), rest)


def print_per_pipeline(rows: Iterable[Any], columns: tuple[str, ...], cells: Callable[[Any], tuple[str, ...]]) -> None:
    """One table per pipeline, in the order the rows name them (verify's findings, repair's outcomes)."""
    rows = list(rows)
    for name in dict.fromkeys(r.pipeline for r in rows):
        table = Table(*columns, title=f"pipeline {name}")
        for r in rows:
            if r.pipeline == name:
                table.add_row(*cells(r))
        out.print(table)
