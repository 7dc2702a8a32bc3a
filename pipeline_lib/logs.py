"""Logging set-up for the CLI: rich output on stderr, with secrets scrubbed from every record."""

from __future__ import annotations

import logging

from rich.console import Console
from rich.logging import RichHandler

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
        """Scrub secrets from the formatted message; never drops a record (always True)."""
        if self.secrets:
            record.msg, record.args = scrub(record.getMessage(), self.secrets), None
        return True


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with each scrubbable secret value replaced by ``***``."""
    for secret in scrubbable(secrets):
        text = text.replace(secret, "***")
    return text


def setup_logging(console: Console, secrets: list[str], verbose: bool = False) -> None:
    """Rich output on a terminal; plain one-line records otherwise (logs, CI, Airflow), so a
    message is never wrapped across lines where people and tools grep for it."""
    handler: logging.Handler
    if console.is_terminal:
        handler = RichHandler(console=console, show_path=False, rich_tracebacks=False, markup=False)
        fmt = "%(message)s"
    else:
        handler = logging.StreamHandler(console.file)
        fmt = "%(asctime)s %(levelname)s %(message)s"
    handler.addFilter(ScrubSecrets(secrets))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=fmt,
                        handlers=[handler], force=True)
    for noisy in ("kafka", "py4j", "urllib3", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING if verbose else logging.ERROR)
