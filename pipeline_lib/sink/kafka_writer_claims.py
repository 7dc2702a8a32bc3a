"""Which writer group a publish task takes: the group its Python worker kept producers for.

Spark hands a publish job's tasks to whichever Python workers are idle, so a fixed deal of groups
to tasks moves a group from one worker to another between epochs, and each move costs a new
producer per writer (``init_transactions``, which also fences the other worker's kept one). So a
task chooses its group when it runs: one its worker kept producers for, else the one it was dealt,
else any no other task of the job took. It takes a group by creating the group's claim, a
conditional create (``put_if``) in the flow's staging store, which exactly one task of the job
wins, on whichever executor it runs.

Claims only steer. What covers every partition is the driver: each task returns the group it
published, and the driver publishes any group no task returned (a failed attempt's claim, a task
that found every group taken) in a second job of the dealt groups without claims
(``uncovered``). A group published twice in one job is still published once: each writer's marker
and producer epoch decide (``kafka_writer``). Claims are a few bytes per group and job, under
``_publish_claims/epoch=<n>/`` (a name readers of the staged files skip), deleted with the staged
epoch they belong to (``kafka_staging``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pipeline_lib.storage.base import ObjectStore

CLAIMS = "_publish_claims/"

Groups = tuple[tuple[int, ...], ...]  # a flow's topic partitions dealt to tasks (``writer_groups``)


def claims_folder(epoch: int, job: str) -> str:
    """The key prefix of one publish job's claims (``job``: unique per Spark job)."""
    return f"{CLAIMS}epoch={epoch}/{job}/"


def claimed_epoch(key: str) -> int | None:
    """The epoch a claim key belongs to (None: not a claim key)."""
    if not key.startswith(CLAIMS):
        return None
    head = key[len(CLAIMS) :].partition("/")[0]
    number = head[len("epoch=") :]
    return int(number) if head.startswith("epoch=") and number.isascii() and number.isdigit() else None


@dataclass(frozen=True)
class GroupDeal:
    """What a publish task of one flow is dealt: the flow's groups, its own group's index, and
    the job's claims folder (None: publish the dealt group, claiming nothing)."""

    groups: Groups
    dealt: int
    claims: str | None


def preference(groups: Groups, dealt: int, kept: Callable[[tuple[int, ...]], int]) -> list[int]:
    """The groups in the order a task tries them: those its worker kept producers for (the most
    kept first), then the dealt one, then the others by index."""
    return sorted(range(len(groups)), key=lambda g: (-kept(groups[g]), g != dealt, g))


def take_group(store: ObjectStore, deal: GroupDeal, kept: Callable[[tuple[int, ...]], int]) -> int | None:
    """The index of the group this task publishes: the first in ``preference`` whose claim it
    wins (the groups its worker kept and the dealt one tried directly, the rest after one listing
    of the taken), or None when every group is taken. Without claims: the dealt group."""
    if deal.claims is None:
        return deal.dealt
    order = preference(deal.groups, deal.dealt, kept)
    cut = order.index(deal.dealt) + 1  # kept ones and the dealt one: likely free, tried at once
    for g in order[:cut]:
        if _claim(store, deal, g):
            return g
    taken = set(store.list(deal.claims))
    for g in order[cut:]:
        if f"{deal.claims}{g}" not in taken and _claim(store, deal, g):
            return g
    return None


def _claim(store: ObjectStore, deal: GroupDeal, group: int) -> bool:
    """Create the group's claim; False if another task created it first."""
    assert deal.claims is not None
    # exactly one task of the job wins a group: two winners would publish it side by side
    won = store.put_if(f"{deal.claims}{group}", str(deal.dealt).encode(), None)
    return won is not None  # guard: kafka-claim-exclusive


Dealt = tuple[str, GroupDeal]  # (flow, deal)


def uncovered(dealt: Iterable[Dealt], published: Iterable[tuple[str, int | None]]) -> list[Dealt]:
    """The (flow, deal) pairs whose dealt group no task of the job returned as published: the
    driver publishes them again, without claims, so every partition is covered."""
    done = set(published)
    # a group no task published is never published: its partitions would miss the epoch
    return [(flow, deal) for flow, deal in dealt if (flow, deal.dealt) not in done]  # guard: kafka-claims-cover
