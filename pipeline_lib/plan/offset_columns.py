"""Offsets of many partitions as columns: the compact form of epoch plans and manifests.

A plan and a manifest name every partition's position and the epoch's ranges. As one JSON object
and one validated pydantic model per partition they cost ~100 B and several microseconds each,
every epoch: the driver's first cost to grow with a topic's partitions (docs/performance.md).
Here a topic's ranges are one block of parallel integer arrays (partitions, starts, ends) and
positions two arrays (partitions, offsets), each checked once as a whole; an ``OffsetRange`` is
made only when a caller iterates. Plain JSON arrays of integers rather than base64 of packed
int64: about as small for real offsets (a 7-10 digit offset and its comma against 10.7 base64
characters), readable by an operator with ``jq`` and ``pipeline-lib snapshots``, no byte order
to get wrong, and decoded by the standard library's C parser.

Format 1 (before this module) wrote the same data as objects; ``legacy_shapes`` turns a dump
back into that form, so a plan or manifest read from format 1 keeps its digest, checksum and bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple, overload

from pydantic import BeforeValidator, GetCoreSchemaHandler, PlainSerializer
from pydantic_core import core_schema

FORMAT_VERSION = 2  # positions and ranges as integer columns
LEGACY_FORMAT = 1  # positions and ranges as one JSON object per partition
FORMATS = (LEGACY_FORMAT, FORMAT_VERSION)


def check_format(value: int, what: str) -> int:
    """``value`` if this release reads that format, else ValueError naming it."""
    if value not in FORMATS:
        raise ValueError(f"{what} has format_version {value!r}; this release reads formats {FORMATS}")
    return value


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records ``[start, end)`` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        where = f"{self.topic}[{self.partition}]"
        for name in ("partition", "start", "end"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{where}: {name} must be an integer >= 0, not {value!r}")
        if self.end < self.start:
            raise ValueError(f"{where}: end {self.end} < start {self.start}")

    @property
    def size(self) -> int:
        """Offsets in the range (records, unless compaction or markers left gaps)."""
        return self.end - self.start


def _ints(values: Any, name: str) -> tuple[int, ...]:
    if not isinstance(values, list | tuple) or not all(type(v) is int and v >= 0 for v in values):
        raise ValueError(f"{name} must be a list of integers >= 0")
    return tuple(values)


class RangeBlock(NamedTuple):
    """One topic's consecutive ranges as parallel columns."""

    topic: str
    partitions: tuple[int, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]

    @classmethod
    def checked(cls, topic: Any, partitions: Any, starts: Any, ends: Any, where: str) -> RangeBlock:
        """A block from stored or computed columns, every column checked once; ValueError names ``where``."""
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"{where}: topic must be a non-empty string, not {topic!r}")
        columns = (
            _ints(c, f"{where}.{n}") for c, n in ((partitions, "partitions"), (starts, "starts"), (ends, "ends"))
        )
        block = cls(topic, *columns)
        if not len(block.partitions) == len(block.starts) == len(block.ends):
            raise ValueError(
                f"{where} ({topic}): partitions, starts and ends differ in length "
                f"({len(block.partitions)}, {len(block.starts)}, {len(block.ends)})"
            )
        for p, s, e in zip(block.partitions, block.starts, block.ends):
            if e < s:  # guard: range-block-end-before-start
                raise ValueError(f"{where}: {topic}[{p}]: end {e} < start {s}")
        return block


class OffsetRanges(Sequence[OffsetRange]):
    """An immutable sequence of ranges held as one ``RangeBlock`` per run of the same topic, in
    their order. Behaves as a list of ``OffsetRange`` for callers (iteration, ``len``, indexing,
    equality with a list); stored as the blocks' columns."""

    __slots__ = ("_blocks", "_len", "_records")

    def __init__(self, blocks: Iterable[RangeBlock] = ()) -> None:
        self._blocks = tuple(b for b in blocks if b.partitions)
        self._len = sum(len(b.partitions) for b in self._blocks)
        self._records: int | None = None

    @classmethod
    def of(cls, ranges: Iterable[OffsetRange]) -> OffsetRanges:
        """Ranges already made (and checked) one by one, grouped into blocks by runs of a topic."""
        runs: list[tuple[str, list[int], list[int], list[int]]] = []
        for r in ranges:
            if not runs or runs[-1][0] != r.topic:
                runs.append((r.topic, [], [], []))
            _, partitions, starts, ends = runs[-1]
            partitions.append(r.partition)
            starts.append(r.start)
            ends.append(r.end)
        return cls(RangeBlock(t, tuple(p), tuple(s), tuple(e)) for t, p, s, e in runs)

    @classmethod
    def columns(cls, topic: str, partitions: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> OffsetRanges:
        """One topic's ranges from parallel columns, checked once."""
        return cls([RangeBlock.checked(topic, list(partitions), list(starts), list(ends), "ranges")])

    @classmethod
    def coerce(cls, value: Any, where: str = "ranges") -> OffsetRanges:
        """``value`` as ranges: the type itself, ``OffsetRange`` objects, format 2's blocks
        (``{"topic", "partitions", "starts", "ends"}``) or format 1's objects
        (``{"topic", "partition", "start", "end"}``). ValueError names the entry at fault."""
        if isinstance(value, OffsetRanges):
            return value
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where} must be a list of range blocks, not {type(value).__name__}")
        if all(isinstance(r, OffsetRange) for r in value):
            return cls.of(value)
        if value and isinstance(value[0], Mapping) and "partitions" in value[0]:
            blocks = []
            for i, b in enumerate(value):
                if not isinstance(b, Mapping) or set(b) != {"topic", "partitions", "starts", "ends"}:
                    raise ValueError(f"{where}[{i}] must have exactly topic, partitions, starts and ends")
                blocks.append(RangeBlock.checked(b["topic"], b["partitions"], b["starts"], b["ends"], f"{where}[{i}]"))
            return cls(blocks)
        ranges = []
        for i, r in enumerate(value):  # format 1: an object per range
            if not isinstance(r, Mapping) or set(r) != {"topic", "partition", "start", "end"}:
                raise ValueError(f"{where}[{i}] must have exactly topic, partition, start and end")
            try:
                ranges.append(OffsetRange(r["topic"], r["partition"], r["start"], r["end"]))
            except ValueError as exc:
                raise ValueError(f"{where}[{i}]: {exc}") from None
        return cls.of(ranges)

    @property
    def blocks(self) -> tuple[RangeBlock, ...]:
        """The columns, one block per run of the same topic."""
        return self._blocks

    @property
    def records(self) -> int:
        """Offsets over all ranges, summed once."""
        if self._records is None:
            self._records = sum(sum(b.ends) - sum(b.starts) for b in self._blocks)
        return self._records

    def to_json(self) -> list[dict[str, Any]]:
        """Format 2: a block of columns per run of the same topic."""
        return [
            {"topic": b.topic, "partitions": list(b.partitions), "starts": list(b.starts), "ends": list(b.ends)}
            for b in self._blocks
        ]

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[OffsetRange]:
        for b in self._blocks:
            topic = b.topic
            for p, s, e in zip(b.partitions, b.starts, b.ends):
                yield OffsetRange(topic, p, s, e)

    @overload
    def __getitem__(self, index: int) -> OffsetRange: ...
    @overload
    def __getitem__(self, index: slice) -> list[OffsetRange]: ...
    def __getitem__(self, index: int | slice) -> OffsetRange | list[OffsetRange]:
        if isinstance(index, slice):
            return list(self)[index]
        i = index + self._len if index < 0 else index
        if not 0 <= i < self._len:
            raise IndexError("range index out of range")
        for b in self._blocks:
            if i < len(b.partitions):
                return OffsetRange(b.topic, b.partitions[i], b.starts[i], b.ends[i])
            i -= len(b.partitions)
        raise AssertionError("unreachable")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OffsetRanges):
            return self._blocks == other._blocks
        if isinstance(other, list | tuple):
            return list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._blocks)

    def __repr__(self) -> str:
        return f"OffsetRanges({list(self)!r})"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.coerce,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda v: cls.coerce(v).to_json()),
        )


def positions_in(value: Any) -> Any:
    """Format 2's ``{"partitions": [...], "offsets": [...]}`` as a dict; anything else (a dict,
    format 1's object keyed by partition) as it is, for pydantic's own ``dict[int, int]`` check."""
    if isinstance(value, Mapping) and "partitions" in value:
        if set(value) != {"partitions", "offsets"}:
            raise ValueError("positions must have exactly partitions and offsets")
        partitions, offsets = value["partitions"], value["offsets"]
        if not isinstance(partitions, list | tuple) or not isinstance(offsets, list | tuple):
            raise ValueError("positions: partitions and offsets must be lists of integers")
        if len(partitions) != len(offsets):
            raise ValueError(f"positions: {len(partitions)} partitions but {len(offsets)} offsets")
        out = dict(zip(partitions, offsets))
        if len(out) != len(partitions):
            raise ValueError("positions: a partition is listed twice")
        return out
    return value


def positions_out(value: Mapping[int, int]) -> dict[str, list[int]]:
    """Format 2: the partitions in order and their offsets, so equal positions give equal bytes."""
    partitions = sorted(value)
    return {"partitions": partitions, "offsets": [value[p] for p in partitions]}


def _legacy_positions(value: Any) -> Any:
    if isinstance(value, Mapping) and set(value) == {"partitions", "offsets"}:
        return {str(p): o for p, o in zip(value["partitions"], value["offsets"])}
    return value


def _legacy_ranges(value: Any) -> Any:
    if not isinstance(value, list):
        return value
    return [
        {"topic": b["topic"], "partition": p, "start": s, "end": e}
        for b in value
        for p, s, e in zip(b["partitions"], b["starts"], b["ends"])
    ]


def legacy_shapes(data: dict[str, Any]) -> dict[str, Any]:
    """A format-2 dump of a plan, manifest, lineage or second-topic cut in format 1's shapes:
    positions and stops keyed by partition, ranges and lost data one object per range."""
    out = dict(data)
    for key in ("positions", "stop_offsets"):
        if key in out:
            out[key] = _legacy_positions(out[key])
    for key in ("ranges", "data_lost"):
        if key in out:
            out[key] = _legacy_ranges(out[key])
    for key in ("lineage", "second_topic"):
        if isinstance(out.get(key), dict):
            out[key] = legacy_shapes(out[key])
    return out


# A partition -> offset mapping in memory, format 2's two columns when written.
Positions = Annotated[dict[int, int], BeforeValidator(positions_in), PlainSerializer(positions_out)]
