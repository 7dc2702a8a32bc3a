"""Autoscaling in the composed runner (no Spark, see tests/runner_fakes.py): a decision applies at
a boundary with no read in flight, every epoch commits whole at the parallelism its manifest
records, and a restore resumes with that parallelism unless ``--parallelism`` says otherwise."""

from __future__ import annotations

import pytest

from pipeline_lib.execution.engine import spark_capacity
from pipeline_lib.execution.runtime.runner_types import RunOptions
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.spec import parse_spec
from tests.runner_fakes import FakeClock, FakeSpark, WatchedStores, composed_runner
from tests.unit.test_runner_composed import PARTITIONS, RECORDS, SETTINGS, prepared

pytestmark = pytest.mark.unit

POLICY = {"min": 1, "max": 2, "target_lag_records": 10, "cooldown_epochs": 0}


def autoscaled(root, policy: dict | None = None):
    spec = spend_job_spec("job", "payments", f"file://{root}/out", f"file://{root}/ckpt", per_epoch=10, parallelism=1)
    return parse_spec({**spec, "autoscale": {**POLICY, **(policy or {})}})


def run(root, options: RunOptions | None = None, master: str = "local[3]", policy: dict | None = None):
    spec = autoscaled(root, policy)
    runner, path = composed_runner(spec, options or RunOptions(), SETTINGS, FakeClock(), WatchedStores(spec))
    runner.autoscaler.latest_offsets = lambda loop: dict.fromkeys(range(PARTITIONS), RECORDS)
    restored = runner.restore()
    positions = restored.manifest.positions if restored else dict.fromkeys(range(PARTITIONS), 0)
    runner.run(FakeSpark(master), prepared(positions))
    return runner, path


def manifests(runner) -> list:
    head, _ = runner.snapshots.read_head()
    return sorted((runner.snapshots.load_manifest(h.snapshot_id) for h in head.history), key=lambda m: m.epoch)


def test_a_scale_up_waits_for_the_epoch_in_flight_then_the_next_epoch_runs_wider(tmp_path):
    """Lag 30 after epoch 1 (load 3.0): up to 2, decided while epoch 2's read is in flight, so
    epoch 2 commits at 1 with no read-ahead past it, and epoch 3 runs at 2; epoch 4 leaves no lag:
    down to 1, with nothing in flight, for the next epoch (none comes)."""
    runner, path = run(tmp_path)
    reports = runner.epochs
    assert [r.parallelism for r in reports] == [1, 1, 2, 2]
    assert [r.scaled_to for r in reports] == [2, None, None, 1]
    assert [m.parallelism for m in manifests(runner)] == [1, 1, 2, 2]
    assert runner.parallelism == 1
    assert "load 3.00 (lag 30 records) ≥ scale_up_at 1.0" in (reports[0].autoscale or "")
    assert "keeps 2: load 1.00 (lag 10 records) ≥ scale_up_at 1.0: already at autoscale.max" == reports[2].autoscale
    assert path.read_epochs == [1, 2, 3, 4]
    assert [e.epoch for e in runner.autoscaler.history if e.changed] == [1, 4]


def test_a_scale_up_warms_the_wider_tasks_beside_the_epoch_in_flight_and_the_first_wider_epoch_waits(tmp_path):
    """The warm-up (the epoch query over no records) runs at 2 subtasks while epoch 2 (at 1) is in
    flight; epoch 3, the first at 2, is read only once it has finished; a scale-down warms nothing."""
    spec = autoscaled(tmp_path)
    runner, path = composed_runner(spec, RunOptions(), SETTINGS, FakeClock(), WatchedStores(spec))
    runner.autoscaler.latest_offsets = lambda loop: dict.fromkeys(range(PARTITIONS), RECORDS)
    path.warm_up_seconds = 0.3  # longer than epoch 2's read and commit on the fakes
    runner.restore()
    runner.run(FakeSpark(), prepared(dict.fromkeys(range(PARTITIONS), 0)))
    assert [r.parallelism for r in runner.epochs] == [1, 1, 2, 2]
    assert path.events.count("warmed at 2") == 1 and not any(e.startswith("warmed at 1") for e in path.events)
    assert path.events.index("read 2") < path.events.index("warmed at 2") < path.events.index("read 3")


class DynamicSpark(FakeSpark):
    """A local master whose conf turns dynamic allocation on."""

    def getConf(self):
        return {"spark.dynamicAllocation.enabled": "true"}


def test_with_dynamic_allocation_a_scale_down_gives_the_request_for_executors_back(tmp_path, monkeypatch):
    """The scale-down after epoch 4 hands the request back to dynamic allocation (what a scale-up
    asked for would otherwise stand, and an executor removed as idle would be replaced)."""
    released: list[int] = []
    monkeypatch.setattr(spark_capacity, "release_request", lambda spark, keep: released.append(keep))
    spec = autoscaled(tmp_path)
    runner, _ = composed_runner(spec, RunOptions(), SETTINGS, FakeClock(), WatchedStores(spec))
    runner.autoscaler.latest_offsets = lambda loop: dict.fromkeys(range(PARTITIONS), RECORDS)
    runner.restore()
    runner.run(DynamicSpark("local[3]"), prepared(dict.fromkeys(range(PARTITIONS), 0)))
    assert [r.scaled_to for r in runner.epochs] == [2, None, None, 1]
    assert released == [1]


def test_a_scale_up_is_bounded_by_the_cores_spark_offers(tmp_path):
    runner, _ = run(tmp_path, master="local[1]")
    assert [r.parallelism for r in runner.epochs] == [1, 1, 1, 1]
    assert "Spark offers 1 cores: stays" in (runner.epochs[0].autoscale or "")


def test_a_restore_resumes_with_the_parallelism_the_snapshot_ran_at(tmp_path):
    first, _ = run(tmp_path, RunOptions(max_epochs=3))
    assert [m.parallelism for m in manifests(first)] == [1, 1, 2]
    second, _ = run(tmp_path, policy={"target_lag_records": 1_000, "scale_down_at": 0.0})
    assert second.restored is not None and second.restored.manifest.epoch == 3
    assert [r.parallelism for r in second.epochs] == [2]


def test_parallelism_on_restore_overrides_the_recorded_one(tmp_path):
    run(tmp_path, RunOptions(max_epochs=3))
    second, _ = run(tmp_path, RunOptions(parallelism=3), policy={"target_lag_records": 1_000, "scale_down_at": 0.0})
    assert [r.parallelism for r in second.epochs] == [3]


def test_a_restore_keeps_the_recorded_parallelism_within_the_policy_bounds(tmp_path):
    run(tmp_path, RunOptions(max_epochs=3))
    second, _ = run(tmp_path, policy={"max": 1, "target_lag_records": 1_000, "scale_down_at": 0.0})
    assert [r.parallelism for r in second.epochs] == [1]


def test_without_autoscale_the_report_carries_the_parallelism_and_no_decision(tmp_path):
    spec = parse_spec(
        spend_job_spec("job", "payments", f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt", per_epoch=10)
    )
    runner, _ = composed_runner(spec, RunOptions(), SETTINGS, FakeClock(), WatchedStores(spec))
    runner.restore()
    runner.run(FakeSpark(), prepared(dict.fromkeys(range(PARTITIONS), 0)))
    assert [(r.parallelism, r.autoscale, r.scaled_to) for r in runner.epochs] == [(2, None, None)] * 4
    assert [m.parallelism for m in manifests(runner)] == [2] * 4


def test_the_spec_refuses_a_max_over_max_parallelism_and_unknown_pipelines(tmp_path):
    spec = spend_job_spec("job", "payments", f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt")
    with pytest.raises(Exception, match="exceeds checkpoint.max_parallelism"):
        parse_spec({**spec, "autoscale": {"max": 4_096, "target_lag_records": 1}})
    with pytest.raises(Exception, match="which the job does not have"):
        parse_spec({**spec, "autoscale": {"max": 2, "target_lag_records": 1, "pipelines": {"other": {"max": 1}}}})


def test_the_pipelines_page_shows_the_parallelism_and_its_latest_changes(tmp_path):
    import yaml
    from fastapi.testclient import TestClient

    from pipeline_lib.orchestration.ui_app import create_app

    run(tmp_path, RunOptions(max_epochs=3))  # epochs 1 and 2 at 1, epoch 3 at 2
    specs = tmp_path / "pipelines"
    specs.mkdir()
    spec = spend_job_spec("job", "payments", f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt", parallelism=1)
    (specs / "job.yaml").write_text(yaml.safe_dump({**spec, "autoscale": POLICY}, sort_keys=False))
    app = create_app(specs, settings_factory=lambda _ids: SETTINGS, authenticated=False)
    page = TestClient(app).get("/", params={"lag": "false"}).text
    assert '<div class="reason" data-parallelism="2">parallelism 2 · scaled 1 → 2 at epoch 3</div>' in page


def test_a_relaunch_of_an_autoscaled_pipeline_keeps_no_parallelism(tmp_path):
    """Recovery's relaunch (and the page's restore form) leave the parallelism to the restore,
    which resumes with the snapshot's; a pipeline not autoscaled keeps its launch's."""
    import datetime as dt

    from pipeline_lib.checkpoint.manifest import LaunchInfo, PipelineStatus
    from pipeline_lib.recovery.recover import kept_settings

    now = dt.datetime.now(dt.UTC)
    status = PipelineStatus(
        state="FAILED", attempt=2, epoch=3, updated_at=now, launch=LaunchInfo(mode="forever", parallelism=2)
    )
    assert "parallelism" not in kept_settings(autoscaled(tmp_path), status, None, "main")
    off = autoscaled(tmp_path, {"pipelines": {"main": {"enabled": False}}})
    assert kept_settings(off, status, None, "main")["parallelism"] == 2


def test_latest_offsets_the_broker_cannot_give_leave_the_run_s_ends_to_weigh(tmp_path):
    spec = autoscaled(tmp_path)
    runner, _ = composed_runner(spec, RunOptions(), SETTINGS, FakeClock(), WatchedStores(spec))

    def unreachable(loop):
        raise OSError("broker unreachable")

    runner.autoscaler.latest_offsets = unreachable
    runner.restore()
    runner.run(FakeSpark("local[3]"), prepared(dict.fromkeys(range(PARTITIONS), 0)))
    assert [r.parallelism for r in runner.epochs] == [1, 1, 2, 2]  # the targets (20 a partition) weighed
