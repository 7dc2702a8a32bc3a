"""``pipeline-lib bench``: the checkout's benchmarks when they are there, else a message saying where to run them."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from pipeline_lib import bench_command
from pipeline_lib.cli import app

pytestmark = pytest.mark.unit


def test_in_a_checkout_the_cli_mounts_the_benchmarks_commands():
    from benchmarks.commands import bench_app

    assert bench_command.bench_app is bench_app
    result = CliRunner().invoke(app, ["bench", "restore", "--help"])
    assert result.exit_code == 0 and "completed pipelines" in result.output


def test_without_the_benchmarks_every_bench_command_says_where_to_run_them():
    """Installed from the wheel (no benchmarks package): plain, with options, with a sub-command."""
    cli = typer.Typer()
    cli.add_typer(typer.Typer(cls=bench_command._Missing, help="stand-in"), name="bench")

    @cli.command()
    def other() -> None:  # a second command, so that "bench" is a sub-command as in pipeline-lib
        """Another command."""

    runner = CliRunner()
    for args in (["bench"], ["bench", "--events", "5"], ["bench", "restore"], ["bench", "driver", "--keys", "9"]):
        result = runner.invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert "source checkout" in result.stderr and "python -m benchmarks" in result.stderr, args
    assert runner.invoke(cli, ["bench", "--help"]).exit_code == 0
