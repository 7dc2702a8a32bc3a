"""``pipeline-lib bench``: the benchmarks' commands when a source checkout is at hand, else what to do.

The benchmarks are not part of the pipeline-lib package: they live in the repository's top-level
``benchmarks`` package (docs/performance.md), with the test servers they start. In a source checkout
(the package installed with ``pip install -e``, so this file sits beside ``benchmarks/``) this
mounts ``benchmarks.commands.bench_app``, the commands ``python -m benchmarks`` and ``make bench``
run. Installed from a wheel, ``pipeline-lib bench`` says where to run them instead and exits 2.
Mounting costs other commands one small import: each benchmark's modules load only when it runs.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

CHECKOUT = Path(__file__).resolve().parents[1]
MISSING = (
    "pipeline-lib bench: the benchmarks are not part of the installed pipeline-lib package; they run from a "
    "source checkout of the repository: `make bench` there (or `pip install -e '.[local,bench]'`, then "
    "`python -m benchmarks --help` or `pipeline-lib bench --help`)."
)


class _Missing(TyperGroup):
    """``pipeline-lib bench`` without the benchmarks: any arguments get MISSING on stderr and exit 2."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # ctx: Typer's own click Context
        typer.echo(MISSING, err=True)
        raise typer.Exit(0 if set(args) & {"--help", "-h"} else 2)


def _bench_app() -> typer.Typer:
    """The checkout's ``benchmarks.commands.bench_app``, or a stand-in that says where to run them."""
    if (CHECKOUT / "benchmarks" / "commands.py").is_file() and str(CHECKOUT) not in sys.path:
        sys.path.append(str(CHECKOUT))  # last: an installed package of the same name is not shadowed
    try:
        app: typer.Typer = importlib.import_module("benchmarks.commands").bench_app
    except ModuleNotFoundError as exc:
        if exc.name not in ("benchmarks", "benchmarks.commands"):
            raise
        return typer.Typer(cls=_Missing, help="Benchmarks: from a source checkout only (not in the package).")
    return app


bench_app = _bench_app()
