"""The commit protocol's safety lines, each as a mutant that removes it (see tools/mutation.py).

The library marks a mutant's line with ``# guard: <id>`` (on each statement, for a mutant that
changes several). ``original`` is Python source matched by its syntax tree, never its text: either
the marked statements themselves, which ``replacement`` replaces, or an expression occurring once
in the marked statement (a compound statement's header), which ``replacement`` replaces. So the
library can be formatted freely. The unit tests must fail for every mutant; ``removes`` says which
guarantee would be lost.
``tests``: the unit test files that kill it, run first (the commit protocol's files when empty);
the rest of the unit tier runs only if they do not, so a mutant that only another file kills is
still caught, at the cost of a second pytest run.
When the code changes so that a marker is missing or ``original`` does not match, the runner stops
and says the list is stale: update the mutant with the code, never drop it silently.

The list is split by the guarantee its mutants protect, one module each; ``MUTANTS`` joins them.
"""

from . import (
    commit,
    expiry_aggregates,
    joins,
    kafka_read,
    kafka_sink,
    owners,
    planning,
    process_state,
    repair,
    restore,
    tables,
    windows,
)
from .model import Mutant

__all__ = ["MUTANTS", "Mutant"]

MUTANTS: list[Mutant] = [
    *commit.MUTANTS,
    *restore.MUTANTS,
    *planning.MUTANTS,
    *owners.MUTANTS,
    *repair.MUTANTS,
    *kafka_read.MUTANTS,
    *tables.MUTANTS,
    *process_state.MUTANTS,
    *expiry_aggregates.MUTANTS,
    *windows.MUTANTS,
    *kafka_sink.MUTANTS,
    *joins.MUTANTS,
]
