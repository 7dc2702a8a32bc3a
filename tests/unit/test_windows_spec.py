"""Event time in specs: the windowed form an outside test uses loads as written; watermarks,
windows, emit modes and the new aggregates are refused with the field and the reason."""

from __future__ import annotations

import copy

import pytest
import yaml

from pipeline_lib.errors import SpecError
from pipeline_lib.spec import parse_spec
from pipeline_lib.spec.durations import parse_duration_ms

CLICKS = yaml.safe_load(
    """
name: clicks
source:
  kafka:
    topic: clicks
    format: json
    schema: "page string, user string, ms long, ts timestamp"
    watermark: {column: ts, delay: "2 minutes"}
state:
  aggregate:
    key: [page]
    window: {column: ts, size: "1 minute"}
    values:
      n: count(*)
      users: count_distinct(user)
      mean_ms: avg(ms)
    emit: final
sink: {files: {path: "s3://results/clicks"}}
checkpoint: {store: "s3://checkpoints/clicks"}
"""
)


def changed(path: str, value) -> dict:
    spec = copy.deepcopy(CLICKS)
    *parents, last = path.split(".")
    node = spec
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return spec


def test_the_documented_windowed_form_loads():
    spec = parse_spec(CLICKS)
    agg = spec.state.aggregate
    assert spec.source.kafka.watermark.delay_ms == 120_000
    assert (agg.window.kind, agg.window.size_ms, agg.window.slide_ms) == ("tumbling", 60_000, 60_000)
    assert agg.state_key() == ["page", "window_start", "window_end"]
    assert list(agg.state_functions()) == ["n", "users", "mean_ms__sum", "mean_ms__count"]
    assert agg.output_columns() == ["page", "window_start", "window_end", "n", "users", "mean_ms"]


def test_hopping_and_session_windows_load():
    hopping = parse_spec(changed("state.aggregate.window", {"column": "ts", "size": "1 minute", "slide": "30 seconds"}))
    assert hopping.state.aggregate.window.kind == "hopping"
    session = parse_spec(changed("state.aggregate.window", {"column": "ts", "gap": "5 minutes"}))
    assert (session.state.aggregate.window.kind, session.state.aggregate.window.gap_ms) == ("session", 300_000)


def test_avg_without_a_window_is_a_running_aggregate():
    spec = changed("state.aggregate.window", KeyError)
    spec["state"]["aggregate"]["values"] = {"mean_ms": "avg(ms)"}
    spec["state"]["aggregate"]["emit"] = "updates"
    assert parse_spec(spec).state.aggregate.derived


@pytest.mark.parametrize(
    "path,value,expected",
    [
        (
            "source.kafka.watermark",
            {"column": "page", "delay": "1 minute"},
            "watermark column 'page' is not a timestamp",
        ),
        ("source.kafka.watermark", {"column": "nope", "delay": "1 minute"}, "watermark column 'nope' is not a column"),
        ("source.kafka.watermark", {"column": "ts", "delay": "2 fortnights"}, "source.kafka.watermark.delay"),
        ("source.kafka.watermark", {"column": "ts"}, "source.kafka.watermark.delay"),
        ("source.kafka.watermark", KeyError, "set the source's watermark"),
        ("state.aggregate.window", {"column": "ms", "size": "1 minute"}, "is not the source's watermark column"),
        ("state.aggregate.window", {"column": "ts"}, "either size"),
        ("state.aggregate.window", {"column": "ts", "size": "1 minute", "gap": "1 minute"}, "either size"),
        ("state.aggregate.window", {"column": "ts", "gap": "1 minute", "slide": "1 minute"}, "slide needs size"),
        ("state.aggregate.window", {"column": "ts", "size": "1 minute", "slide": "7 seconds"}, "must divide size"),
        ("state.aggregate.window", {"column": "ts", "size": "0 seconds"}, "more than zero"),
        ("state.aggregate.window", {"column": "ts", "size": "1 minute", "every": "1"}, "every: unknown field"),
        ("state.aggregate.emit", "sometimes", "state.aggregate.emit"),
        ("state.aggregate.window", KeyError, "needs a window"),
        ("state.aggregate.values", {"window_end": "count(*)"}, "window's output columns"),
        ("state.aggregate.values", {"x": "avg(*)"}, "avg(*) is not defined"),
        ("state.aggregate.values", {"m": "avg(ms)", "m__sum": "sum(ms)"}, "clash with the sum and count"),
    ],
)
def test_bad_event_time_names_field_and_reason(path, value, expected):
    with pytest.raises(SpecError) as info:
        parse_spec(changed(path, value))
    assert expected in str(info.value)


def test_session_windows_need_emit_final():
    spec = changed("state.aggregate.window", {"column": "ts", "gap": "5 minutes"})
    spec["state"]["aggregate"]["emit"] = "updates"
    with pytest.raises(SpecError, match="session windows need emit: final"):
        parse_spec(spec)


def test_count_distinct_needs_a_window():
    spec = changed("state.aggregate.window", KeyError)
    spec["state"]["aggregate"]["emit"] = "updates"
    with pytest.raises(SpecError, match="count_distinct keeps every value seen"):
        parse_spec(spec)


@pytest.mark.parametrize(
    "text,ms",
    [
        ("2 minutes", 120_000),
        ("30 seconds", 30_000),
        ("1 hour", 3_600_000),
        ("500 ms", 500),
        ("1 d", 86_400_000),
        ("1.5 minutes", 90_000),
    ],
)
def test_durations(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["2", "minutes", "0.5 ms", "-1 minute", "1 fortnight", "", "0 seconds"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="is not a duration|whole number of milliseconds|more than zero"):
        parse_duration_ms(text)
