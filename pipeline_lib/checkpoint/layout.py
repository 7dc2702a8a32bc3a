"""Where each object of a job lives inside its checkpoint store.

Every pipeline of a job has a folder of its own, ``pipelines/<pipeline>/``, holding:

    STATUS                                lifecycle record (SCHEDULING / RUNNING / … + reason, lease)
    RECOVERY                              what the recovery DAG did: relaunch claims, budget, backoff
    VERIFIED                              what the last scheduled verification found (a report)
    HEAD                                  head pointer (moved by compare-and-swap = the commit)
    attempts/<n>                          one object per run attempt, created exclusively
    plans/<epoch>.json                    the epoch's offset ranges, written before it runs
    manifests/<snapshot id>.json          immutable snapshot manifests
    state/<snapshot id>/<flow>/kg-<a>-<b>.pack  the state files (one Parquet file per key-group span)
                                          that snapshot rewrote, back to back, spans within [a, b);
                                          later snapshots reference a span's bytes while unchanged
    state/<snapshot id>/<flow>/kg-<a>-<b>-t<n>.pack  the same, written by an owner task (attempt n)
"""

from __future__ import annotations

PIPELINES_PREFIX = "pipelines/"
HEAD_KEY = "HEAD"
STATUS_KEY = "STATUS"
RECOVERY_KEY = "RECOVERY"
VERIFIED_KEY = "VERIFIED"
ATTEMPTS_PREFIX = "attempts/"
PLANS_PREFIX = "plans/"
MANIFESTS_PREFIX = "manifests/"
STATE_PREFIX = "state/"


def attempt_key(attempt: int) -> str:
    """The attempt's claim object; zero-padded so that a listing sorts attempts by number."""
    return f"{ATTEMPTS_PREFIX}{attempt:09d}"


def plan_key(epoch: int) -> str:
    """The epoch's saved plan; zero-padded so that a listing sorts plans by epoch."""
    return f"{PLANS_PREFIX}{epoch:010d}.json"


def manifest_key(snapshot_id: str) -> str:
    """The immutable manifest of ``snapshot_id``."""
    return f"{MANIFESTS_PREFIX}{snapshot_id}.json"


def pipeline_root(pipeline: str) -> str:
    """The folder of one pipeline inside the job's checkpoint store."""
    return f"{PIPELINES_PREFIX}{pipeline}"


def state_pack_key(snapshot_id: str, flow: str, start: int, end: int, task_attempt: int | None = None) -> str:
    """The pack of ``flow``'s state files that ``snapshot_id`` wrote, spans within [start, end);
    an owner task's (``task_attempt`` given) ends ``-t<task attempt>``, so that two attempts of
    one owner task never write the same object."""
    attempt = "" if task_attempt is None else f"-t{task_attempt}"
    return f"{STATE_PREFIX}{snapshot_id}/{flow}/kg-{start:05d}-{end:05d}{attempt}.pack"


def snapshot_of_state_key(key: str) -> str:
    """The snapshot whose folder holds the state object ``key`` (for garbage collection)."""
    return key[len(STATE_PREFIX) :].split("/", 1)[0]


def epoch_of_snapshot(snapshot_id: str) -> int:
    """The epoch a snapshot id names (ids are ``<epoch>-a<attempt>``)."""
    return int(snapshot_id.split("-", 1)[0])
