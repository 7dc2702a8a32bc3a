"""The secret scrubber masks every shape a secret takes in text (plain, URL-encoded, JSON-escaped,
repr, base64), in messages and in the tracebacks that go through logging, leaves values shorter
than MIN_SECRET_LENGTH alone, and STATUS failure reasons are scrubbed before they are stored.
Pure logic, and a real (local-directory) snapshot store."""

from __future__ import annotations

import base64
import io
import json
import logging
from urllib.parse import quote, quote_plus

import pytest
from rich.console import Console

from pipeline_lib.checkpoint.manifest import LaunchInfo
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.execution.runtime.lifecycle import Lifecycle
from pipeline_lib.logs import MIN_SECRET_LENGTH, scrub, setup_logging
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store

# Characters that each encoding changes: '/', '+', '=', ' ', quotes, a backslash, a non-ASCII letter.
SECRET = "Sk/3+x=y z\"q'w\\é-0123"
ACCESS = "pipeline-access-key"


def leaked_forms(secret: str) -> dict[str, str]:
    """How the review found secrets leaking: each encoding a library or a traceback applies."""
    raw = secret.encode()
    return {
        "plain": secret,
        "quote": quote(secret),
        "quote safe=''": quote(secret, safe=""),
        "quote_plus": quote_plus(secret),
        "json": json.dumps(secret)[1:-1],
        "json ascii=False": json.dumps(secret, ensure_ascii=False)[1:-1],
        "repr": repr(secret),
        "base64": base64.b64encode(raw).decode(),
        "base64 urlsafe": base64.urlsafe_b64encode(raw).decode(),
        "base64 unpadded": base64.b64encode(raw).decode().rstrip("="),
    }


def assert_clean(text: str, *secrets: str) -> None:
    for secret in secrets:
        for name, form in leaked_forms(secret).items():
            assert form not in text, f"the {name} form of a secret is in {text!r}"


@pytest.mark.parametrize("name", list(leaked_forms(SECRET)))
def test_each_form_of_a_secret_is_scrubbed(name):
    form = leaked_forms(SECRET)[name]
    text = f"GET http://s3:9000/b?X-Key={form}&next=1 failed: {{'token': {form}}}"
    scrubbed = scrub(text, [SECRET])
    assert_clean(scrubbed, SECRET)
    assert "***" in scrubbed and scrubbed.startswith("GET http://s3:9000/b?X-Key=") and scrubbed.endswith("}")


def test_every_form_of_an_ascii_key_is_scrubbed_and_the_rest_of_the_line_kept():
    line = " | ".join(leaked_forms(ACCESS).values())
    scrubbed = scrub(line, [ACCESS])
    assert_clean(scrubbed, ACCESS)
    assert scrubbed == " | ".join("'***'" if name == "repr" else "***" for name in leaked_forms(ACCESS))


def test_values_shorter_than_the_minimum_are_left_alone_in_every_form():
    short = "p/+ e=" + "x" * (MIN_SECRET_LENGTH - 7)
    assert len(short) == MIN_SECRET_LENGTH - 1
    line = " | ".join(leaked_forms(short).values()) + " pipeline_lib"
    assert scrub(line, [short, "pipe"]) == line


@pytest.fixture
def logged():
    """Logging as the CLI sets it up (a plain handler: the console is not a terminal); the root
    logger is put back afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    buffer = io.StringIO()
    setup_logging(Console(file=buffer, force_terminal=False), [SECRET, ACCESS, "short"])
    try:
        yield buffer
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_a_traceback_logged_with_exc_info_is_scrubbed(logged):
    log = logging.getLogger("pipeline_lib.test")
    try:
        try:
            raise KeyError(SECRET)  # its repr goes into the traceback
        except KeyError as exc:
            raise ValueError(f"request to http://s3/?k={quote_plus(SECRET)}&a={ACCESS} failed") from exc
    except ValueError:
        log.exception("upload of %s failed", json.dumps({"key": SECRET}))
    log.warning("stack of %s", ACCESS, stack_info=True)
    text = logged.getvalue()
    assert "Traceback (most recent call last)" in text and "ValueError: request to http://s3/?k=***&a=***" in text
    assert "KeyError: '***'" in text and 'upload of {"key": "***"} failed' in text
    assert "Stack (most recent call last)" in text and "stack of ***" in text
    assert_clean(text, SECRET, ACCESS)


def test_a_failure_reason_is_scrubbed_before_it_is_stored(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_S3_ACCESS_KEY", ACCESS)
    monkeypatch.setenv("PIPELINE_S3_SECRET_KEY", SECRET)
    snapshots = SnapshotStore(open_store(f"file://{tmp_path}/ckpt", ConnectionSettings()), "job", "main")
    lifecycle = Lifecycle(snapshots, 1, LaunchInfo(mode="forever", parallelism=1), lease_seconds=3600)
    lifecycle.schedule(0, 1, 60)
    # A secret straddling the length cut: cutting first would keep its first characters.
    reason = f"S3 said {json.dumps(SECRET)[1:-1]} for {quote(ACCESS)}; " + "x" * (1000 - 46) + SECRET
    lifecycle.fail(reason)
    status = snapshots.read_status()
    assert status.state == "FAILED" and status.reason.startswith("S3 said *** for ***; xxx")
    assert status.reason.endswith("x***")
    assert_clean(status.reason, SECRET, ACCESS)
    assert SECRET[:5] not in status.reason
