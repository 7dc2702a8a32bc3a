"""What a stream-join job's sink holds, in the shape of the plain-Python reference
(tests/stream_join_reference.py): one tuple per joined row, for the one-topic and two-topic tests."""

from __future__ import annotations

from datetime import datetime

from pipeline_lib.api.tables import read_table
from pipeline_lib.settings import ConnectionSettings


def joined_rows(env: dict, sink: str) -> list[tuple]:
    """The joined rows ``sink`` holds: (order, (amount, ms), (payment amount, ms) or None), sorted."""

    def ms(text: str | None) -> int | None:
        return None if text is None else int(datetime.fromisoformat(text).timestamp() * 1000)

    rows = read_table(sink, ConnectionSettings.from_env(env))
    out = [
        (
            r["order_id"],
            (r["amount"], ms(r["ts"])),
            None if r["payment_ts"] is None else (r["payment_amount"], ms(r["payment_ts"])),
        )
        for r in rows
    ]
    return sorted(out, key=repr)
