"""Which owner task holds which keyed state in an epoch, and the read side's cut of partials by owner.

Owner ``i`` of ``p`` holds every span (state file, see checkpoint.state_spans) whose first key
group lies in ``key_group_range(i, p, max_parallelism)``: the contiguous key groups subtask ``i``
owns, widened to whole spans, so a span is never split between two owners whatever the
parallelism and the span size. A read task computes each partial row's key group and so its
owner; the shuffle's partitioner is then the identity on the owner index.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.checkpoint.state_files import KEY_GROUP_COLUMN
from pipeline_lib.checkpoint.state_spans import Span
from pipeline_lib.plan.keygroups import key_group_range, key_groups_of, subtask_of


@dataclass(frozen=True)
class SpanOwners:
    """The owners of one epoch: ``parallelism`` of them over ``max_parallelism`` key groups cut
    into spans of ``per_file`` key groups."""

    parallelism: int
    max_parallelism: int
    per_file: int

    def span_of(self, key_group: int) -> Span:
        """The span holding ``key_group`` (grid-aligned, as checkpoint.state_spans.span_of)."""
        start = key_group - key_group % self.per_file
        return start, min(start + self.per_file, self.max_parallelism)

    def owner_of(self, key_groups: np.ndarray) -> np.ndarray:
        """The owner of each key group: the subtask owning its span's first key group."""
        starts = key_groups - key_groups % self.per_file  # guard: owner-of-unaligned-key-group
        return subtask_of(starts, self.parallelism, self.max_parallelism)

    def owned(self, owner: int) -> range:
        """The key groups ``owner`` holds: whole spans, contiguous, possibly none."""
        kgs = key_group_range(owner, self.parallelism, self.max_parallelism)
        return range(self._span_boundary(kgs.start), self._span_boundary(kgs.stop))  # guard: owned-not-whole-spans

    def spans_covering(self, start: int, stop: int) -> set[Span]:
        """The spans of the grid that hold any of the key groups [start, stop)."""
        # guard: spans-covering-unaligned-start
        return {self.span_of(kg) for kg in range(start - start % self.per_file, stop, self.per_file)}

    def _span_boundary(self, key_group: int) -> int:
        """The first span start at or after ``key_group`` (the end of the key groups past the last)."""
        return min(-(-key_group // self.per_file) * self.per_file, self.max_parallelism)


def key_groups_of_rows(table: pa.Table, key_columns: Sequence[str], max_parallelism: int) -> np.ndarray:
    """Each row's key group (``plan.keygroups.key_group_of`` of its key columns)."""
    keys = zip(*(table.column(name).to_pylist() for name in key_columns))
    return key_groups_of(keys, table.num_rows, max_parallelism)


def cut_by_owner(table: pa.Table, key_groups: np.ndarray, owners: SpanOwners) -> Iterator[tuple[int, pa.Table]]:
    """``table``'s rows by owner, in owner order, each with its key group in a last column
    ``_key_group`` (the owner files them into spans without hashing the key again); rows keep
    their order within an owner, and owners without rows are left out."""
    with_groups = table.append_column(pa.field(KEY_GROUP_COLUMN, pa.int32()), [pa.array(key_groups, pa.int32())])
    of_row = owners.owner_of(key_groups)
    for owner in np.unique(of_row).tolist():
        # guard: cut-gives-owners-every-row
        yield owner, with_groups.filter(pa.array(of_row == owner)) if len(of_row) else with_groups


def without_key_groups(table: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """The rows of a cut (``cut_by_owner``) and their key groups, apart."""
    groups = pc.cast(table.column(KEY_GROUP_COLUMN), pa.int32()).to_numpy(zero_copy_only=False)
    return table.drop_columns([KEY_GROUP_COLUMN]), groups
