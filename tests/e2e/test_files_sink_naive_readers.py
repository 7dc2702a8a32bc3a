"""A files sink read the way other tools read a folder of Parquet files: pyarrow.dataset,
pandas.read_parquet and Spark's parquet reader, which know nothing of ``_SUCCESS`` and skip
``_``-prefixed folders. The real ``pipeline-lib run`` is held with epoch 3's parts written and its
marker not (the fault point ``after_sink_files``), read, then SIGKILLed there, read again, and
restored: the readers never see a row of an uncommitted epoch, and in the end exactly the
committed changelog (every epoch's rows, as our reader takes them), whose upsert is the answer.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest
from pyspark import SparkContext

from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import committed_epochs, epoch_rows
from pipeline_lib.storage import open_store
from tests.support import CliRun, result_table, run_cli, spend_spec, write_spec

COLUMNS = ["user", "total", "n"]


@pytest.fixture(scope="module")
def spark():
    from pipeline_lib.execution.engine.spark_session import start_spark

    session = start_spark("naive-readers-e2e", None, 1)
    gateway = session.sparkContext._gateway
    yield session
    session.stop()
    SparkContext._gateway = SparkContext._jvm = None
    gateway.shutdown()


def _rows(records) -> Counter:
    return Counter(tuple(r[c] for c in COLUMNS) for r in records)


def naive_rows(folder: Path, spark) -> Counter:
    """The rows pyarrow.dataset finds in ``folder``; pandas and Spark must find the same."""
    dataset = ds.dataset(str(folder), format="parquet")
    assert all("/_" not in f[len(str(folder)) :] for f in dataset.files), dataset.files
    rows = _rows(dataset.to_table(columns=COLUMNS).to_pylist())
    if not rows:
        return rows
    assert _rows(pd.read_parquet(str(folder), columns=COLUMNS).to_dict("records")) == rows
    spark_rows = spark.read.parquet(f"file://{folder}").select(*COLUMNS).collect()
    assert _rows(r.asDict() for r in spark_rows) == rows
    return rows


def committed_rows(store, through: int | None = None) -> Counter:
    """Every committed epoch's rows (up to ``through``), as our reader takes them."""
    epochs = [e for e in committed_epochs(store) if through is None or e <= through]
    return _rows(row for e in epochs for row in epoch_rows(store, e))


@pytest.mark.full
def test_naive_readers_see_only_committed_rows_mid_commit_and_after_a_sigkill(stack_env, tmp_path, payments, spark):
    topic, events = payments
    name = f"naive-{tmp_path.name[-12:].strip('_').lower()}".replace("_", "-")
    folder = tmp_path / "results" / name
    sink, store = f"file://{folder}", f"s3://checkpoints/{name}"
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store, fmt="parquet"))
    settings = ConnectionSettings.from_env(stack_env)
    staged, visible = open_store(f"{sink}/_staging", settings), open_store(sink, settings)
    resume, fault_log = tmp_path / "resume", tmp_path / "faults.log"
    held_env = {
        **stack_env,
        "PIPELINE_FAULT_POINTS": "after_sink_files@3",
        "PIPELINE_FAULT_PAUSE_UNTIL": str(resume),
        "PIPELINE_FAULT_LOG": str(fault_log),
    }
    held = CliRun(["run", str(spec)], held_env, tmp_path / "held.log")
    try:
        held.until(lambda: fault_log.exists() and "FAULT PAUSED" in fault_log.read_text(), 300, "the hold")
        assert [k for k in staged.list("epoch=3/") if "/part-" in k]  # epoch 3's parts are written...
        assert not staged.exists("epoch=3/_SUCCESS")  # ...and not committed
        seen = naive_rows(folder, spark)
        assert seen and not seen - committed_rows(staged, through=2)  # epochs 1-2 (2 may be mid-publication)
        assert not [k for k in visible.list("epoch=3/")]
    finally:
        held.kill()  # SIGKILL, paused between epoch 3's parts and its marker
    assert held.returncode == -9
    assert not visible.list("epoch=3/") and not naive_rows(folder, spark) - committed_rows(staged, through=2)
    restored = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert result_table(stack_env, sink) == spend_per_user(events)
    assert naive_rows(folder, spark) == committed_rows(visible) == committed_rows(staged)
