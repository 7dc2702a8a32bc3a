"""A user's function named in a spec as ``package.module:function``, imported where it runs (a
Python hook, a process function): one place that says, in words, what is missing."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def import_function(ref: str) -> Callable[..., Any]:
    """``package.module:function`` imported; LookupError says what is missing (the caller adds
    which spec field named it)."""
    module_name, _, name = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise LookupError(f"cannot import {module_name!r}: {exc}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise LookupError(f"{module_name} has no function {name!r}")
    return function
