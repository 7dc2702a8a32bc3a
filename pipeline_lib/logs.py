"""Logging set-up for the CLI: rich output on stderr, with secrets scrubbed from every record.

A secret leaks in more shapes than its plain text: a client library puts it in a URL
(percent-encoded), a JSON body (escaped), an exception's ``repr`` or a base64 header, and a
traceback shows all of them. ``scrub`` masks each of those forms, and ``ScrubSecrets`` scrubs a
record's traceback as well as its message.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import logging
import re
from typing import TYPE_CHECKING
from urllib.parse import quote, quote_plus

if TYPE_CHECKING:  # rich loads with the CLI's logging, not in every worker that scrubs a secret
    from rich.console import Console

# A value shorter than this is not a credential worth hiding, and masking it corrupts ordinary text.
MIN_SECRET_LENGTH = 8


def scrubbable(secrets: list[str]) -> list[str]:
    """The values worth masking: at least MIN_SECRET_LENGTH characters. An access key ``main``
    would otherwise turn every "pipeline main" of a message into "pipeline ***"."""
    return [s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH]


class ScrubSecrets(logging.Filter):
    """Replace known secret values in a record's final message: a last line of defence for
    third-party libraries that put request details in their exceptions."""

    def __init__(self, secrets: list[str]):
        super().__init__()
        self.secrets = scrubbable(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        """Scrub secrets from the formatted message and from its traceback and stack (which the
        handler's formatter would otherwise render from ``exc_info`` after this filter); never
        drops a record (always True)."""
        if not self.secrets:
            return True
        record.msg, record.args = scrub(record.getMessage(), self.secrets), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            # The scrubbed text replaces exc_info, so that no handler renders the original again.
            record.exc_text, record.exc_info = scrub(record.exc_text, self.secrets), None
        if record.stack_info:
            record.stack_info = scrub(record.stack_info, self.secrets)
        return True


def secret_forms(secret: str) -> list[str]:
    """The shapes ``secret`` takes in text, longest first: as it is, URL-encoded (``quote`` with
    and without ``/`` safe, ``quote_plus``, percent escapes in either case), JSON-escaped (with
    and without ``ensure_ascii``), as the inside of its ``repr``, and base64 of the secret alone
    (standard and URL-safe, with and without padding)."""
    raw = secret.encode("utf-8", "surrogatepass")
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1], repr(secret)[1:-1]}
    for encoded in (quote(secret, safe=""), quote(secret), quote_plus(secret)):
        forms |= {encoded, re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), encoded)}
    for b64 in (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()):
        forms |= {b64, b64.rstrip("=")}
    return sorted(forms, key=lambda form: (-len(form), form))


@functools.lru_cache(maxsize=64)
def _pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    forms = {form for secret in secrets for form in secret_forms(secret)}
    if not forms:
        return None
    return re.compile("|".join(re.escape(form) for form in sorted(forms, key=lambda f: (-len(f), f))))


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every form (``secret_forms``) of each scrubbable secret replaced by ``***``."""
    pattern = _pattern(tuple(scrubbable(secrets)))
    return text if pattern is None else pattern.sub("***", text)


class JsonLines(logging.Formatter):
    """One JSON object per record (``--log-format json``), for log pipelines that parse fields:
    time, level, logger, message, the record's ``fields`` (e.g. an epoch's figures) and its
    traceback. Records reach it already scrubbed (ScrubSecrets runs first). The standard
    library's json suffices: a record has a handful of fields and no nesting to configure."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        data = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(getattr(record, "fields", None) or {})
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            data["exception"] = record.exc_text
        return json.dumps(data, ensure_ascii=False, default=str)


def setup_logging(console: Console, secrets: list[str], verbose: bool = False, log_format: str = "text") -> None:
    """Rich output on a terminal; plain one-line records otherwise (logs, CI, Airflow), so a
    message is never wrapped across lines where people and tools grep for it; with
    ``log_format="json"``, one JSON object per line."""
    handler: logging.Handler
    if log_format == "json":
        handler = logging.StreamHandler(console.file)
        handler.setFormatter(JsonLines())
        fmt = None
    elif console.is_terminal:
        from rich.logging import RichHandler

        handler = RichHandler(console=console, show_path=False, rich_tracebacks=False, markup=False)
        fmt = "%(message)s"
    else:
        handler = logging.StreamHandler(console.file)
        fmt = "%(asctime)s %(levelname)s %(message)s"
    handler.addFilter(ScrubSecrets(secrets))
    if fmt is not None:
        handler.setFormatter(logging.Formatter(fmt))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)
    for noisy in ("kafka", "py4j", "urllib3", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING if verbose else logging.ERROR)
