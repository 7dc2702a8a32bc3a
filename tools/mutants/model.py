"""What a mutant is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """One safety line removed: ``file``'s statement(s) marked ``# guard: <id>`` mutated."""

    id: str
    file: str
    original: str
    replacement: str
    removes: str
    tests: tuple[str, ...] = ()
