"""A span's base and deltas: what an epoch writes (plan_span_writes), how a chain folds back into
the span's rows (fold_chain), and that an epoch changing few keys of a large state writes about
those keys' bytes while a restore still gives back the exact state."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.checkpoint.manifest import StateFileRef
from pipeline_lib.checkpoint.restore import load_state
from pipeline_lib.checkpoint.state_files import decode_state_file, encode_state_table, fold_chain
from pipeline_lib.checkpoint.state_spans import MAX_DELTAS, MAX_OLDER_PACKS, plan_span_writes
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.spec.aggregates import AggregateFunction
from tests.commit_harness import job_spec, new_attempt, run_epochs

MAXP = 64
PER_FILE = 4


def _ref(key: str, rows: int, span=(0, 4), deltas: tuple[StateFileRef, ...] = (), keys: int | None = None):
    return StateFileRef(
        key=key,
        rows=rows,
        bytes=100,
        sha256=f"{len(key):064x}",
        key_group_start=span[0],
        key_group_end=span[1],
        offset=0,
        deltas=deltas,
        keys=keys,
    )


def _chain(rows: int, delta_rows: list[int], span=(0, 4), pack="old") -> StateFileRef:
    deltas = tuple(_ref(f"{pack}-d{i}", n, span) for i, n in enumerate(delta_rows))
    return _ref(f"{pack}-base", rows, span, deltas, rows if deltas else None)


# -- what an epoch writes ---------------------------------------------------------------------------
def test_a_changed_span_takes_a_delta_until_its_chain_would_outweigh_its_base():
    previous = {(0, 4): _chain(100, [30, 30]), (4, 8): _chain(100, [30, 30]), (8, 12): _chain(100, [])}
    writes = plan_span_writes(previous, {(0, 4): 40, (4, 8): 41, (12, 16): 5})
    assert dict(writes.deltas) == {(0, 4): previous[(0, 4)]}  # 30 + 30 + 40 rows: as many as the base
    assert writes.bases == {(4, 8), (12, 16)}  # one row over the base: compacted; a new span: a base
    assert dict(writes.kept) == {(8, 12): previous[(8, 12)]}
    assert writes.to_write() == [(0, 4), (4, 8), (12, 16)]


def test_a_chain_of_max_deltas_is_compacted_whatever_its_rows():
    full = _chain(10**6, [1] * MAX_DELTAS)
    one_short = _chain(10**6, [1] * (MAX_DELTAS - 1), span=(4, 8))
    writes = plan_span_writes({(0, 4): full, (4, 8): one_short}, {(0, 4): 1, (4, 8): 1})
    assert writes.bases == {(0, 4)} and set(writes.deltas) == {(4, 8)}


def test_spans_to_write_whole_are_never_deltas_and_unchanged_off_grid_files_are_not_kept():
    previous = {(0, 4): _chain(100, [])}
    writes = plan_span_writes(previous, {(0, 4): 1}, whole=[(0, 4), (4, 8)])
    assert writes.bases == {(0, 4), (4, 8)} and not writes.deltas and not writes.kept


def test_spans_of_sparse_older_packs_are_compacted_so_few_packs_stay_referenced():
    spans = [(4 * i, 4 * i + 4) for i in range(MAX_OLDER_PACKS + 3)]
    # each span's base and deltas in packs of its own: too many objects, the sparsest folded
    previous = {span: _chain(100, [1], span, pack=f"p{i}") for i, span in enumerate(spans)}
    writes = plan_span_writes(previous, {spans[0]: 1})
    objects = {part.key for ref in [*writes.kept.values(), *writes.deltas.values()] for part in ref.chain()}
    assert len(objects) <= MAX_OLDER_PACKS
    assert writes.bases - {spans[0]}  # unchanged spans folded into the new pack
    assert set(writes.kept) | set(writes.deltas) | writes.bases == set(spans)


def test_a_delta_entry_records_its_chain_and_the_span_s_keys():
    base = _chain(10, [])
    delta = _ref("new-d", 3)
    entry = plan_span_writes({(0, 4): base}, {(0, 4): 3}).entry(delta, 12)
    assert entry.chain() == [base, delta] and entry.span_keys() == 12 and entry.chain_rows() == 3
    assert StateFileRef.model_validate(entry.model_dump()) == entry
    assert "deltas" not in base.model_dump() and "keys" not in base.model_dump()  # old manifests verify as sealed
    with pytest.raises(ValueError, match="covers key groups"):
        _ref("b", 1, deltas=(_ref("d", 1, span=(4, 8)),), keys=1)
    with pytest.raises(ValueError, match="key count goes with its deltas"):
        _ref("b", 1, keys=1)


# -- folding a chain ------------------------------------------------------------------------------
FUNCTIONS = {"total": AggregateFunction("sum", "amount"), "n": AggregateFunction("count", "amount")}


def _partials(keys: list, rng: random.Random, key_type: pa.DataType) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(keys, key_type),
            "total": pa.array([rng.randint(-5, 9) for _ in keys], pa.int64()),
            "n": pa.array([1] * len(keys), pa.int64()),
        }
    )


@pytest.mark.parametrize(
    "key_type, make_key",
    [
        (pa.string(), lambda i: f"user-{i}"),
        (pa.float64(), lambda i: float("nan") if i == 7 else (None if i == 3 else i / 4)),
    ],
)
def test_a_folded_chain_is_the_span_as_the_state_writes_it_after_every_epoch(key_type, make_key):
    """Over 30 epochs of random changes the base with each epoch's delta folds, byte for byte,
    into what the keyed state would write for the span: new keys, NaN and null keys included."""
    rng = random.Random(11)
    state = KeyedAggregateState(["k"], FUNCTIONS, MAXP)
    schema = pa.schema([("k", key_type), ("total", pa.int64()), ("n", pa.int64())])
    chains: dict[tuple[int, int], list[tuple[pa.Table, np.ndarray]]] = {}
    for epoch in range(30):
        keys = list({repr(k): k for k in (make_key(rng.randrange(200)) for _ in range(rng.randint(1, 40)))}.values())
        changed = state.merge(_partials(keys, rng, key_type))
        every, touched = state.slots_by_key_group(), state.slots_by_key_group(changed)
        for start in range(0, MAXP, PER_FILE):
            span = range(start, start + PER_FILE)
            delta = state.slots_in(touched, span)
            if not len(delta):
                continue
            whole = state.slots_in(every, span)
            rows = state.table(delta if (start, start + 4) in chains else whole, schema)
            # through Parquet, as the files are stored
            stored = decode_state_file(
                encode_state_table(rows, state.key_groups(delta if (start, start + 4) in chains else whole))
            )
            chains.setdefault((start, start + 4), []).append(stored)
            folded, groups = fold_chain(chains[(start, start + 4)], 1)
            assert encode_state_table(folded, groups) == encode_state_table(
                state.table(whole, schema), state.key_groups(whole)
            ), f"epoch {epoch} span {span}"  # the bytes a compaction writes, NaN keys included
    assert max(len(chain) for chain in chains.values()) > 5


def test_a_chain_of_two_key_columns_folds_by_both():
    base = pa.table({"a": ["x", "x", "y"], "b": [1, 2, 1], "v": [1, 2, 3]})
    delta = pa.table({"a": ["x", "z"], "b": [2, 1], "v": [20, 40]})
    table, groups = fold_chain([(base, np.array([0, 0, 1], np.int32)), (delta, np.array([0, 1], np.int32))], 2)
    assert table.to_pylist() == [
        {"a": "x", "b": 1, "v": 1},
        {"a": "x", "b": 2, "v": 20},
        {"a": "y", "b": 1, "v": 3},
        {"a": "z", "b": 1, "v": 40},
    ]
    assert groups.tolist() == [0, 0, 1, 1]


# -- through the runner: bytes written and the state restored -------------------------------------
def _state_bytes(manifest) -> tuple[int, int]:
    """(bytes the snapshot's state references, bytes of the files it wrote itself)."""
    files = [part for f in manifest.flows["job"].state.files for part in f.chain()]
    return sum(f.bytes for f in files), sum(f.bytes for f in files if manifest.snapshot_id in f.key)


def test_an_epoch_changing_few_keys_writes_about_their_bytes_and_a_restore_is_exact(tmp_path):
    """20,000 keys in 8 spans; then epochs changing 1% of the keys at random touch every span
    but write only deltas of those keys (under a tenth of the state's bytes here, mostly the
    files' own overhead, where whole spans would be all of them), and a restore folds every
    chain back into the state the runner holds in memory."""
    rng = random.Random(5)
    users = [f"user-{i:05d}" for i in range(20_000)]
    runner = new_attempt(job_spec(tmp_path, retain=3))
    epochs = [{u: rng.randint(1, 99) for u in users}] + [
        {u: rng.randint(1, 99) for u in rng.sample(users, 200)} for _ in range(6)
    ]
    history, _ = run_epochs(runner, epochs)
    manifest = runner.snapshots.load_manifest(history[0].snapshot_id)
    total, written = _state_bytes(manifest)
    entries = manifest.flows["job"].state.files
    assert len(entries) == 8 and all(e.deltas for e in entries)  # every span touched, none rewritten
    # 200 keys' rows plus each delta file's own cost (about 1 KB of Parquet footer and schema)
    assert written < 0.1 * total, (written, total)
    print(f"state {total} bytes, the last epoch wrote {written}")

    restored = new_attempt(job_spec(tmp_path, retain=3))
    flow, memory = restored.flows[0], runner.flows[0]
    assert flow.state is not None and memory.state is not None
    assert len(flow.state) == len(memory.state) == 20_000
    for user in rng.sample(users, 500) + ["user-00000", "user-19999"]:
        assert flow.state.value((user,)) == memory.state.value((user,))
    loaded, _ = load_state(runner.snapshots, manifest)
    assert loaded["job"].rows == 20_000
