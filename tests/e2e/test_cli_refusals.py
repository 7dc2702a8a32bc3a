"""The CLI refuses what it cannot run, as a user calls it, before starting anything: a bad spec,
missing connection settings, a hostile or unknown ``--restore`` / ``--pipeline``: exit code 2 and
a message naming the problem."""

from __future__ import annotations

import os

import pytest

from tests.support import run_cli, spend_spec, write_spec


def test_cli_rejects_a_bad_spec_before_starting_anything(tmp_path, stack_env):
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        "name: x\nsource: {kafka: {topic: t, format: json}}\nsink: {files: {path: 'file:///tmp/a'}}\n"
        "checkpoint: {store: 'file:///tmp/b'}\nstate: {aggregate: {key: [user], values: {t: 'median(x)'}}}\n"
    )
    for args in (["validate", str(spec)], ["run", str(spec)]):
        result = run_cli(args, stack_env, timeout=60)
        assert result.returncode == 2
        assert "source.kafka: Value error" not in result.stderr
        assert "source.kafka: format json needs a schema" in result.stderr
        assert "state.aggregate.values: t: cannot parse aggregate 'median(x)'" in result.stderr


def test_cli_names_missing_connection_settings(tmp_path, payments):
    spec = write_spec(tmp_path, spend_spec("no-env", "payments-e2e", "s3://results/no-env", "s3://checkpoints/no-env"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    result = run_cli(["run", str(spec)], env, timeout=60)
    assert result.returncode == 2
    assert "PIPELINE_KAFKA_BOOTSTRAP is not set" in result.stderr


@pytest.mark.parametrize("locations", ["file"], indirect=True)
@pytest.mark.parametrize(
    "args,message",
    [
        (["--restore", "../../etc/passwd"], "is not a snapshot id"),
        (["--restore", "0000000009-a1"], "is not among the retained snapshots"),
        (["--pipeline", "../main"], "has no pipeline"),
    ],
)
def test_hostile_or_unknown_restore_arguments_are_refused_cleanly(stack_env, tmp_path, locations, args, message):
    name, sink, store_uri = locations
    spec = write_spec(tmp_path, spend_spec(name, "payments-e2e", sink, store_uri))
    result = run_cli(["run", str(spec), *args], stack_env, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr
