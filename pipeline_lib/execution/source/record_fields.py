"""Single fields of a Kafka v2 record, read one byte at a time: varints, and headers (read on
demand for the ``_headers`` column, skipped while a batch is decoded). The batch decoder
(kafka_batches) decodes the common fields of every record at once with NumPy; these are the
per-record steps it leaves to Python, each bounded by the record's end."""

from __future__ import annotations

MAX_VARINT_BYTES = 10  # a 64-bit varint


class Corrupt(Exception):
    """A record whose bytes do not add up; ``index`` or ``offset_delta`` names which record."""

    def __init__(self, reason: str, index: int | None = None, offset_delta: int | None = None):
        super().__init__(reason)
        self.reason, self.index, self.offset_delta = reason, index, offset_delta


def read_headers(data: bytes, pos: int) -> list[tuple[bytes, bytes | None]]:
    """The (key, value) headers of the record whose header count starts at ``pos`` (a null value: None)."""
    raw, pos = varint_at(data, pos, len(data), "header count")
    headers = []
    for _ in range((raw >> 1) ^ -(raw & 1)):
        parts = []
        for part in ("header key", "header value"):
            raw, pos = varint_at(data, pos, len(data), part)
            length = (raw >> 1) ^ -(raw & 1)
            parts.append(data[pos : pos + length] if length >= 0 else None)
            pos += max(length, 0)
        headers.append((parts[0] or b"", parts[1]))
    return headers


def skip_headers(data: bytes, pos: int, count: int, end: int, offset_delta: int) -> int:
    """Where ``count`` headers starting at ``pos`` end; Corrupt if one is negative or runs past ``end``."""
    for _ in range(count):
        for part in ("header key", "header value"):
            raw, pos = varint_at(data, pos, end, part, offset_delta=offset_delta)
            length = (raw >> 1) ^ -(raw & 1)
            if length < (0 if part == "header key" else -1):
                raise Corrupt(f"negative {part} size {length}", offset_delta=offset_delta)
            pos += max(length, 0)
            if pos > end:
                raise Corrupt(f"{part} runs past its record", offset_delta=offset_delta)
    return pos


def varint_at(data: bytes, pos: int, end: int, field: str, **where: int) -> tuple[int, int]:
    """One varint (before zigzag decoding) read one byte at a time; ``where`` names the record."""
    value, shift = 0, 0
    for _ in range(MAX_VARINT_BYTES):
        if pos >= end:
            break
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise Corrupt(f"bad varint in {field}", **where)
