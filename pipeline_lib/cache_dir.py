"""Where the library caches what it fetches or builds once per machine: jars, binaries, the
driver JVM's class archive. ``$XDG_CACHE_HOME/pipeline-lib/NAME``, ``~/.cache`` by default,
shared by every worktree and run of the machine."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(name: str) -> Path:
    """``$XDG_CACHE_HOME/pipeline-lib/NAME`` (``~/.cache`` when the variable is unset or empty)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "pipeline-lib" / name
