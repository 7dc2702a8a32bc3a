"""``trigger.interval`` on the real broker, S3 server and Spark: a continuous run over a backlog
starts its epochs one interval apart or more (an epoch never starts early, read ahead or not),
measured from the epoch reports' starts; no assertion on how long anything takes."""

from __future__ import annotations

import pytest

from pipeline_lib import job_from_dict, run_job
from pipeline_lib.settings import ConnectionSettings
from tests.support import spend_spec

INTERVAL_S = 1.0


@pytest.mark.parametrize("locations", ["file"], indirect=True)
def test_a_continuous_run_with_an_interval_starts_epochs_at_most_once_per_interval(stack_env, payments, locations):
    topic, _ = payments
    name, sink, store = locations
    spec = spend_spec(name, topic, sink, store, per_epoch=2_000)
    spec["trigger"]["interval"] = "1 second"
    seen = []
    summary = run_job(
        job_from_dict(spec),
        settings=ConnectionSettings.from_env(stack_env),
        mode="continuous",
        max_epochs=3,
        on_epoch=seen.append,
    )
    [pipeline] = summary.pipelines
    assert [r.epoch for r in seen] == [1, 2, 3] and all(r.records == 2_000 for r in seen)
    starts = [r.started for r in seen]
    assert all(later - earlier >= INTERVAL_S for earlier, later in zip(starts, starts[1:])), starts
    assert pipeline.status == "RAN"
