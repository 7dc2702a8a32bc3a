"""Record decoding on the Kafka source's read path: pure logic."""

from __future__ import annotations

import pytest

from pipeline_lib.errors import RecordError
from pipeline_lib.execution.record_decoding import JsonRecordDecoder

BIG = b"1" * 5000


@pytest.mark.parametrize("value,reason", [
    (b'{"user":"\\ud800"}', "field 'user': string with a lone surrogate"),
    (b'{"user":"\xed\xa0\x80"}', "field 'user': string with a lone surrogate"),
    (b'{"user":"a","amount":' + BIG + b'}', "malformed JSON: Exceeds the limit (4300 digits)"),
    (b'{"e":' + b"[" * 1200 + b"]" * 1200 + b'}', "malformed JSON: maximum recursion depth exceeded"),
])
def test_values_that_used_to_crash_the_task_are_bad_records(value, reason):
    """Valid JSON that Spark cannot hold (a lone surrogate failed the Arrow conversion) and JSON that
    json.loads refuses with other errors than JSONDecodeError: now named bad records, like the rest."""
    with pytest.raises(RecordError) as info:
        JsonRecordDecoder([("user", "string"), ("amount", "bigint")]).decode("payments", 3, 1234, value)
    assert str(info.value).startswith(f"bad record at payments[3]@1234: {reason}")
