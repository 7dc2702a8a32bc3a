"""State files per key-group span: the grid, the file size, parallel I/O."""

import threading
import time

import pytest

from pipeline_lib.checkpoint.state_spans import in_parallel, span_of, spans_of
from pipeline_lib.spec.models import CheckpointSpec


def test_spans_tile_the_key_groups_and_the_last_one_is_cut_at_max_parallelism():
    assert span_of(0, 1, 128) == (0, 1) and span_of(127, 1, 128) == (127, 128)
    assert span_of(9, 4, 10) == (8, 10)  # 10 key groups in files of 4: [0,4) [4,8) [8,10)
    assert spans_of(range(10), 4, 10) == {(0, 4), (4, 8), (8, 10)}
    for per_file, maxp in [(1, 7), (3, 7), (7, 7), (5, 128), (16, 128)]:
        spans = sorted(spans_of(range(maxp), per_file, maxp))
        covered = [kg for start, end in spans for kg in range(start, end)]
        assert covered == list(range(maxp)), (per_file, maxp)


def test_file_size_follows_the_state_size_unless_the_spec_sets_it():
    spec = CheckpointSpec(store="s3://ckpt/x")  # max_parallelism 128
    sizes = {keys: spec.state_file_key_groups(keys) for keys in (0, 1_000, 10_000, 100_000, 1_000_000)}
    assert sizes == {0: 128, 1_000: 128, 10_000: 8, 100_000: 1, 1_000_000: 1}
    for keys, per_file in sizes.items():  # files of at most ~1,024 keys, unless that needs more than 128 files
        assert keys * per_file / 128 <= 1_024 or per_file == 1
    assert CheckpointSpec(store="s3://ckpt/x", max_parallelism=4096).state_file_key_groups(10**7) == 32  # ≤ 128 files
    assert CheckpointSpec(store="s3://ckpt/x", max_parallelism=8).state_file_key_groups(10**6) == 1
    assert CheckpointSpec(store="s3://ckpt/x", key_groups_per_state_file=4).state_file_key_groups(10**6) == 4


def test_in_parallel_keeps_order_overlaps_calls_and_stops_at_the_first_error():
    active, peak, lock = [0], [0], threading.Lock()

    def slow_square(x: int) -> int:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return x * x

    assert list(in_parallel(slow_square, list(range(20)))) == [x * x for x in range(20)]
    assert peak[0] > 1
    assert list(in_parallel(slow_square, [])) == [] and list(in_parallel(slow_square, [3])) == [9]

    def fail_on_three(x: int) -> int:
        if x == 3:
            raise OSError("store unreachable")
        return x

    with pytest.raises(OSError, match="store unreachable"):
        list(in_parallel(fail_on_three, list(range(10))))
