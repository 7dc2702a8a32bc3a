"""``pipeline_lib.testing.run_on_records`` against answers computed in plain Python: the Arrow
path over several epochs and partitions, the Spark SQL path with a ``python:`` hook, a filter and a
stateless flow beside an aggregate, and bad records under each ``on_error``. Spark in local mode
in this process; no broker, no S3 server."""

from __future__ import annotations

from collections import Counter

import pytest

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine.spark_session import start_spark
from pipeline_lib.samples import payment_events, spend_job_spec, spend_per_user
from pipeline_lib.testing import Record, run_on_records

NOWHERE = ("s3://results/spend", "s3://checkpoints/spend")  # never touched: the test run writes locally


@pytest.fixture(scope="module")
def spark():
    session = start_spark("test-testing-module", None, 2)
    yield session
    session.stop()


def test_an_aggregate_over_several_epochs_and_partitions_is_the_plain_python_answer(spark, tmp_path):
    events = payment_events(900, 40, seed=7)
    spec = spend_job_spec("spend", "payments", *NOWHERE, per_epoch=250)
    records = [Record(e, key=e["user"], partition=i % 3) for i, e in enumerate(events)]
    run = run_on_records(spec, records, workdir=tmp_path, spark=spark)
    assert run.epochs == 4  # 900 records, 250 an epoch, as a run catching up plans them
    assert {row["user"]: row for row in run.table()} == spend_per_user(events)
    for folder in (tmp_path / "sinks" / "spend" / "_staging", tmp_path / "sinks" / "spend"):  # staged, then published
        written = folder.glob("epoch=*/_SUCCESS")
        assert sorted(marker.parent.name for marker in written) == [f"epoch={n}" for n in range(1, 5)]
    folder = tmp_path / "sinks" / "spend"  # what a downstream reader reads: the staged parts, copied
    published = {p.relative_to(folder): p.read_bytes() for p in folder.glob("epoch=*/part-*")}
    assert published and published == {
        p.relative_to(folder / "_staging"): p.read_bytes() for p in (folder / "_staging").glob("epoch=*/part-*")
    }
    assert run.bad_records == 0 and run.dead_letters == []


def test_hooks_filters_and_a_stateless_flow_take_the_spark_sql_path(spark, tmp_path):
    events = payment_events(300, 12, seed=11)
    spec = {
        "name": "shop",
        "sources": {"payments": {"kafka": {"topic": "payments", "schema": "user string, amount long"}}},
        "flows": [
            {
                "name": "big-cents",
                "source": "payments",
                "transforms": [{"python": "tests.hooks_example:add_cents"}, {"filter": "amount >= 500"}],
                "state": {"aggregate": {"key": ["user"], "values": {"cents": "sum(cents)", "n": "count(*)"}}},
                "sink": {"files": {"path": "s3://results/big-cents", "format": "parquet"}},
            },
            {
                "name": "small",
                "source": "payments",
                "transforms": [{"filter": "amount < 100"}, {"select": ["user", "amount", "_offset"]}],
                "sink": {"files": {"path": "s3://results/small"}},
            },
        ],
        "checkpoint": {"store": "s3://checkpoints/shop"},
        "trigger": {"max_records_per_epoch": 120},
        "parallelism": 2,
    }
    run = run_on_records(spec, events, workdir=tmp_path, spark=spark)
    expected: dict[str, dict] = {}
    for e in events:
        if e["amount"] >= 500:
            row = expected.setdefault(e["user"], {"user": e["user"], "cents": 0, "n": 0})
            row["cents"] += e["amount"] * 100
            row["n"] += 1
    assert {row["user"]: row for row in run.table("big-cents")} == expected
    assert Counter((r["user"], r["amount"], r["_offset"]) for r in run.table("small")) == Counter(
        (e["user"], e["amount"], i) for i, e in enumerate(events) if e["amount"] < 100
    )
    assert run.epochs == 3


BAD = [{"user": "a", "amount": 5}, b"not json", {"user": "b", "amount": "ten"}, {"user": "a", "amount": 7}]


def test_dead_letters_keep_bad_records_out_of_the_table_and_name_them(spark, tmp_path):
    spec = spend_job_spec(
        "spend", "payments", *NOWHERE, extra={"on_error": "dead_letter", "dead_letter": {"path": "s3://dead/spend"}}
    )
    run = run_on_records(spec, BAD, workdir=tmp_path, spark=spark)
    assert run.table() == [{"user": "a", "total": 12, "n": 2}]
    assert run.bad_records == 2
    assert [(d["partition"], d["offset"]) for d in run.dead_letters] == [(0, 1), (0, 2)]
    assert "ten" in run.dead_letters[1]["error"]


def test_skip_counts_them_and_fail_names_the_first(spark, tmp_path):
    skipped = run_on_records(
        spend_job_spec("spend", "payments", *NOWHERE, extra={"on_error": "skip"}),
        BAD,
        workdir=tmp_path / "skip",
        spark=spark,
    )
    assert skipped.table() == [{"user": "a", "total": 12, "n": 2}] and skipped.bad_records == 2
    with pytest.raises(PipelineError, match=r"bad record at payments\[0\]@1: "):
        run_on_records(spend_job_spec("spend", "payments", *NOWHERE), BAD, workdir=tmp_path / "fail", spark=spark)


def test_a_hook_sees_the_active_session_on_any_thread_and_its_errors_name_it(spark):
    """Epochs are planned on a read-ahead thread: the hook still gets the session, and an error
    it raises names the hook and its place in the spec."""
    import threading

    from pipeline_lib.errors import TransformError
    from pipeline_lib.execution.engine.transforms import apply_transforms
    from pipeline_lib.spec.flow_spec import TransformSpec

    df = spark.createDataFrame([(3,)], "amount long")
    out: dict = {}

    def on_a_thread(hook: str) -> None:
        try:
            out[hook] = apply_transforms(df, [TransformSpec(python=hook)]).collect()
        except TransformError as exc:
            out[hook] = str(exc)

    for hook in ("tests.hooks_example:needs_session", "tests.hooks_example:explode"):
        thread = threading.Thread(target=on_a_thread, args=(hook,))
        thread.start()
        thread.join()
    assert [r["cents"] for r in out["tests.hooks_example:needs_session"]] == [300]
    assert out["tests.hooks_example:explode"] == (
        "transforms[0].python 'tests.hooks_example:explode' raised ValueError: refund rules are broken"
    )


def test_a_process_function_and_dedup_run_on_records(spark, tmp_path):
    """pipeline_lib.testing runs process flows too: dedup over re-sent ids and running totals,
    over several epochs, against plain Python."""
    from tests.e2e.test_process_functions import _expected_totals, _spec

    events = [{"id": f"p{i}", **e} for i, e in enumerate(payment_events(400, 15, seed=3))]
    sent = events + events[:40]  # re-sent, in a later epoch
    spec = _spec("dedup", "payments", "s3://checkpoints/dedup", ("s3://results/d", "s3://results/t"))
    spec["trigger"]["max_records_per_epoch"] = 150
    # each user in one partition, so a user's rows come in the order sent
    records = [
        Record(e, key=e["user"], partition=int(e["user"][-1]) % 2, timestamp_ms=1_000 + i) for i, e in enumerate(sent)
    ]
    run = run_on_records(spec, records, workdir=tmp_path, spark=spark)
    assert run.epochs == 3
    assert sorted(r["id"] for r in run.table("distinct")) == sorted(e["id"] for e in events)
    assert {r["user"]: r for r in run.table("totals")} == _expected_totals(sent)


def test_a_stream_join_then_a_select_a_filter_and_an_aggregate_on_records_is_plain_pythons(spark, tmp_path):
    """The join runs as its stage and the flow aggregates the matches it passes each epoch,
    unmatched orders included as the watermark passes them (tests/e2e/test_stream_join_aggregate.py)."""
    from tests.e2e.test_stream_join_aggregate import aggregate_spec, events_of, expected_totals
    from tests.windows_reference import iso

    events = events_of(400, seed=7)
    records = [
        Record({**{k: v for k, v in e.items() if k != "ms"}, "ts": iso(e["ms"])}, key=e["order_id"], partition=i % 2)
        for i, e in enumerate(events)
    ]
    spec = aggregate_spec("ssjoin-agg-records")
    spec["trigger"]["max_records_per_epoch"] = 250
    run = run_on_records(spec, records, workdir=tmp_path, spark=spark)
    assert run.epochs >= 3
    want = expected_totals(events)
    assert len(want) > 2
    got = {
        r["bucket"]: {k: r[k] for k in ("bucket", "rows", "paid", "biggest")} for r in run.table("ssjoin-agg-records")
    }
    assert got == want
