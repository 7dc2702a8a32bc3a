"""Decompress a Kafka batch's records with a cap on what comes out.

kafka-python decompresses a batch whole, whatever it expands to: a few kilobytes of gzip can
claim gigabytes. Here every codec Kafka defines (gzip, snappy, lz4, zstd) is read through its
library's streaming or length-checked interface and stops once the output passes ``limit``, so a
hostile or corrupt batch costs at most ``limit`` bytes before it is refused. The libraries are
kafka-python's own optional codecs (its extras ``snappy``, ``lz4``, ``zstd`` in pyproject.toml);
tests/unit/test_batch_decompression.py checks the output against kafka-python's decoders.
"""

from __future__ import annotations

import gzip
import io
import struct
import zlib

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = range(5)
CODEC_NAMES = {CODEC_GZIP: "gzip", CODEC_SNAPPY: "snappy", CODEC_LZ4: "lz4", CODEC_ZSTD: "zstd"}
_EXTRA = {CODEC_SNAPPY: ("cramjam", "snappy"), CODEC_LZ4: ("lz4.frame", "lz4"), CODEC_ZSTD: ("zstandard", "zstd")}
_XERIAL_MAGIC = b"\x82SNAPPY\x00"  # the block framing of the Java client's snappy (xerial)
_CHUNK = 1 << 20


class DecompressionError(Exception):
    """The batch's records could not be decompressed: unknown codec, corrupt data, or an output
    over the cap. The caller names the batch (topic, partition, offset)."""


def decompress(codec: int, data: bytes | memoryview, limit: int) -> bytes:
    """The decompressed bytes of ``data``, at most ``limit`` of them (DecompressionError beyond)."""
    if codec not in CODEC_NAMES:
        raise DecompressionError(f"unknown compression codec {codec}")
    name = CODEC_NAMES[codec]
    try:
        if codec == CODEC_GZIP:
            out = _gzip(data, limit)
        elif codec == CODEC_SNAPPY:
            out = _snappy(memoryview(data), limit)
        elif codec == CODEC_LZ4:
            out = _lz4(bytes(data), limit)
        else:
            out = _zstd(bytes(data), limit)
    except DecompressionError:
        raise
    except ImportError as exc:
        module, extra = _EXTRA[codec]
        raise DecompressionError(f"{name} batches need {module}: pip install 'kafka-python[{extra}]'") from exc
    except (OSError, EOFError, ValueError, RuntimeError, zlib.error, struct.error, MemoryError) as exc:
        raise DecompressionError(f"{name} data is corrupt: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # the codecs' own error classes (cramjam, lz4, zstandard) share no base
        raise DecompressionError(f"{name} data is corrupt: {type(exc).__name__}: {exc}") from None
    if len(out) > limit:
        raise _too_big(name, limit)
    return out


def _too_big(name: str, limit: int) -> DecompressionError:
    return DecompressionError(f"{name} data decompresses to more than {limit} bytes (the per-batch cap)")


def _gzip(data: bytes | memoryview, limit: int) -> bytes:
    """GzipFile reads every member, as kafka-python does, and ``read(n)`` never returns more."""
    with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as reader:
        return reader.read(limit + 1)


def _snappy(data: memoryview, limit: int) -> bytes:
    """Raw snappy, or xerial's framing of raw blocks; each block's length header is checked
    against what the cap leaves before the block is decompressed (it sizes the allocation)."""
    import cramjam

    if len(data) > 16 and data[: len(_XERIAL_MAGIC)] == _XERIAL_MAGIC:
        blocks, pos = [], 16
        while pos < len(data):
            if pos + 4 > len(data):
                raise DecompressionError("snappy data is corrupt: a block length is cut short")
            (size,) = struct.unpack_from(">i", data, pos)
            if size < 0 or pos + 4 + size > len(data):
                raise DecompressionError(f"snappy data is corrupt: block of {size} bytes past the end")
            blocks.append(data[pos + 4 : pos + 4 + size])
            pos += 4 + size
    else:
        blocks = [data]
    out: list[bytes] = []
    total = 0
    for block in blocks:
        total += int(cramjam.snappy.decompress_raw_len(block))
        if total > limit:
            raise _too_big("snappy", limit)
        out.append(bytes(cramjam.snappy.decompress_raw(block)))
    return b"".join(out)


def _lz4(data: bytes, limit: int) -> bytes:
    """LZ4 frames (what Kafka writes since message format v1), one ``max_length`` step at a time."""
    import lz4.frame  # type: ignore[import-untyped]

    decompressor = lz4.frame.LZ4FrameDecompressor()
    out, total, pending = [], 0, data
    while not decompressor.eof:
        chunk = decompressor.decompress(pending, max_length=min(_CHUNK, limit + 1 - total))
        pending = b""
        out.append(chunk)
        total += len(chunk)
        if total > limit:
            raise _too_big("lz4", limit)
        if not chunk and decompressor.needs_input:
            raise DecompressionError("lz4 data is corrupt: the frame is cut short")
    return b"".join(out)


def _zstd(data: bytes, limit: int) -> bytes:
    """zstd frames read as a stream (across frames, as kafka-python does); the window a frame may
    ask for is bounded too, since it is allocated before any output."""
    import zstandard

    window = 1 << min(27, max(20, limit.bit_length()))
    reader = zstandard.ZstdDecompressor(max_window_size=window).stream_reader(io.BytesIO(data), read_across_frames=True)
    out: list[bytes] = []
    total = 0
    with reader:
        while True:
            chunk = reader.read(min(_CHUNK, limit + 1 - total))
            if not chunk:
                return b"".join(out)
            out.append(chunk)
            total += len(chunk)
            if total > limit:
                raise _too_big("zstd", limit)
