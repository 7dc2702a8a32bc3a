"""The Spark settings a run request may change: an allowlist of resource and scheduling settings.

A run request (Airflow's trigger form, a REST ``conf``, anything Airflow passes from a DAG run) is
untrusted input. Spark settings are code in disguise (``extraJavaOptions`` runs commands,
``spark.jars`` and ``spark.plugins`` load classes, ``spark.executorEnv.LD_PRELOAD`` loads a library),
so a run may set only how much it uses and how it is scheduled, each value checked for its kind and
range. Specs and the CLI's ``--conf`` are the operator's and are not limited by this list.

The same list is enforced three times: as the trigger form's JSON schema, by the DAG's
``check_params`` task (``LaunchRequest``), and by ``pipeline-lib run --run-conf`` in the launched job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Sizes as Spark reads them (k, m, g, t; an optional b), whole: a trailing newline does not pass.
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_MEMORY = re.compile(r"([0-9]{1,7})([kmgt])b?", re.IGNORECASE)
_WHOLE = re.compile(r"[0-9]{1,7}")
_BOOLEAN = ("true", "false")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# JSON-schema patterns (ECMA); (?![\s\S]) is the end of the text, as in spark_settings.CONF_KEY.
_SCHEMA_PATTERNS = {
    "memory": r"^[0-9]{1,7}[kmgtKMGT][bB]?(?![\s\S])",
    "whole": r"^[0-9]{1,7}(?![\s\S])",
    "boolean": r"^(true|false)(?![\s\S])",
    "name": r"^[A-Za-z0-9_.-]{1,64}(?![\s\S])",
}


@dataclass(frozen=True)
class Allowed:
    """One setting a run may change: its kind (``whole``, ``memory``, ``boolean`` or ``name``) and
    bounds (a whole number's, or a size's in bytes)."""

    kind: str
    low: int = 0
    high: int = 0

    def words(self) -> str:
        """What the setting takes, in words, for the form's description and for refusals."""
        if self.kind == "boolean":
            return "true or false"
        if self.kind == "name":
            return "a name of 1 to 64 letters, digits, '_', '.' or '-'"
        if self.kind == "memory":
            return f"a size from {_size_words(self.low)} to {_size_words(self.high)}, like 2g or 512m"
        return f"a whole number from {self.low} to {self.high}"

    def check(self, key: str, value: str) -> str:
        """``value`` if it is of this kind and within bounds; ValueError in words otherwise."""
        if self.kind == "boolean":
            ok = value in _BOOLEAN
        elif self.kind == "name":
            ok = _NAME.fullmatch(value) is not None
        elif self.kind == "memory":
            found = _MEMORY.fullmatch(value)
            ok = found is not None and self.low <= int(found[1]) * _UNITS[found[2].lower()] <= self.high
        else:
            ok = _WHOLE.fullmatch(value) is not None and self.low <= int(value) <= self.high
        if not ok:
            raise ValueError(f"Spark setting {key} takes {self.words()}, not {value!r}")
        return value


def _size_words(size: int) -> str:
    for unit in "tgmk":
        if size >= _UNITS[unit] and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)


_GIB, _MIB, _TIB = _UNITS["g"], _UNITS["m"], _UNITS["t"]
ALLOWED: dict[str, Allowed] = {
    "spark.cores.max": Allowed("whole", 1, 4096),
    "spark.driver.cores": Allowed("whole", 1, 64),
    "spark.executor.cores": Allowed("whole", 1, 256),
    "spark.executor.instances": Allowed("whole", 1, 1000),
    "spark.driver.memory": Allowed("memory", 512 * _MIB, _TIB),
    "spark.executor.memory": Allowed("memory", 512 * _MIB, _TIB),
    "spark.executor.memoryOverhead": Allowed("memory", 64 * _MIB, _TIB),
    "spark.driver.maxResultSize": Allowed("memory", _MIB, 64 * _GIB),
    "spark.sql.shuffle.partitions": Allowed("whole", 1, 100_000),
    "spark.default.parallelism": Allowed("whole", 1, 100_000),
    "spark.dynamicAllocation.enabled": Allowed("boolean"),
    "spark.dynamicAllocation.minExecutors": Allowed("whole", 0, 1000),
    "spark.dynamicAllocation.initialExecutors": Allowed("whole", 0, 1000),
    "spark.dynamicAllocation.maxExecutors": Allowed("whole", 1, 1000),
    "spark.scheduler.pool": Allowed("name"),  # the FAIR pool the job's pipelines share (default: one pool each)
}


def allowed_words() -> str:
    """Every setting a run may change with what it takes, one clause each."""
    return "; ".join(f"{key}: {allowed.words()}" for key, allowed in ALLOWED.items())


def check_run_setting(key: str, value: Any) -> str:
    """``value`` if a run may set ``key`` to it; ValueError saying in words what is allowed."""
    allowed = ALLOWED.get(key) if isinstance(key, str) else None
    if allowed is None:
        raise ValueError(
            f"Spark setting {key!r} is not one a run may change. A run may change only its resources "
            f"and scheduling ({', '.join(ALLOWED)}); set anything else in the job's spec"
        )
    if not isinstance(value, str):
        raise ValueError(f"Spark setting {key} takes a string: {allowed.words()}")
    return allowed.check(key, value)


def check_run_settings(settings: Mapping[str, Any]) -> dict[str, str]:
    """Every item of ``settings`` checked by ``check_run_setting``, in order."""
    return {key: check_run_setting(key, value) for key, value in settings.items()}


def parse_run_settings(items: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` items of ``run --run-conf``, each checked; ValueError names a bad item."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--run-conf {item!r} is not KEY=VALUE")
        out[key] = check_run_setting(key, value)
    return out


def run_settings_schema() -> dict[str, Any]:
    """The trigger form's JSON schema of ``spark_conf``: exactly the allowlisted keys, each value by
    a pattern of its kind (ranges are checked by ``check_run_setting`` in ``check_params``)."""
    return {
        "type": "object",
        "title": "Spark settings",
        "additionalProperties": False,
        "properties": {
            key: {"type": "string", "pattern": _SCHEMA_PATTERNS[allowed.kind], "description": allowed.words()}
            for key, allowed in ALLOWED.items()
        },
    }
