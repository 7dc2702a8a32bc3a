"""A task of ours that hangs says where it is: with ``PIPELINE_TASK_STACKS_AFTER=<seconds>`` in the
task's environment, each such interval that passes before the task's code returns, every
thread's Python stack is written to the task's stderr, which Airflow keeps in the task log.

``faulthandler`` does the writing from C, without a thread of ours and without the GIL, so it
works while the task is stuck on a lock, a socket or an import. Off unless the variable is set
(the test deployments set it; a production deployment may, to debug a stuck task).
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from pipeline_lib.errors import ConfigError

ENV_TASK_STACKS_AFTER = "PIPELINE_TASK_STACKS_AFTER"
STDERR = 2  # the task process's stderr, which the task supervisor reads into the task log


def positive_seconds(name: str, environ: Mapping[str, str] | None = None) -> float | None:
    """The seconds the environment variable ``name`` holds (None: unset or blank); ConfigError
    names it when it is not a positive number."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ConfigError(f"{name} must be a positive number of seconds, got {raw!r}")
    return seconds


def stacks_after(environ: Mapping[str, str] | None = None) -> float | None:
    """The interval ``PIPELINE_TASK_STACKS_AFTER`` asks for (None: unset)."""
    return positive_seconds(ENV_TASK_STACKS_AFTER, environ)


@contextmanager
def stacks_if_stuck() -> Iterator[None]:
    """Within the block, dump every thread's stack each ``PIPELINE_TASK_STACKS_AFTER`` seconds."""
    seconds = stacks_after()
    if seconds is None:
        yield
        return
    faulthandler.dump_traceback_later(seconds, repeat=True, file=STDERR)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
