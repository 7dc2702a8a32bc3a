"""Credentials never reach logs, manifests, snapshots, plans, status records or outputs."""

from __future__ import annotations

import pytest

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store
from tests.support import run_cli, spend_spec, write_spec


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_nothing_a_run_writes_contains_a_credential(stack_env, tmp_path, payments, local_stack, locations):
    topic, _ = payments
    name, sink, store = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=8_000))
    runs = [
        run_cli(["-v", "run", str(spec)], stack_env),
        run_cli(["snapshots", "show", str(spec), "--json"], stack_env),
        run_cli(["plan", str(spec), "--restore", "latest", "--json"], stack_env),
        # a failing run: a wrong secret makes S3 refuse; the error must not echo either key
        run_cli(["run", str(spec)], {**stack_env, "PIPELINE_S3_SECRET_KEY": local_stack.secret_key[::-1]}),
    ]
    assert runs[0].returncode == 0, runs[0].stderr[-2000:]
    assert runs[3].returncode != 0 and "error:" in runs[3].stderr
    settings = ConnectionSettings.from_env(stack_env)
    written = [r.stdout + r.stderr for r in runs]
    for uri in (sink, store):
        objects = open_store(uri, settings)
        written += [objects.get(key).decode("utf-8", "replace") for key in objects.list()]
    assert len(written) > 10
    for secret in (local_stack.secret_key, local_stack.access_key, local_stack.secret_key[::-1]):
        leaks = [text[:200] for text in written if secret in text]
        assert not leaks, f"a credential leaked into: {leaks}"
