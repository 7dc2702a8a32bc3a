"""A job's Spark settings: the spec's ``spark:`` section plus ``--conf`` overrides, as Spark config.

A spec is committed and shared, so a setting that would carry a credential (an S3 secret key, a
password, a token) is refused by name: credentials come from the environment only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline_lib.spec.models import SparkSpec

# Anchored with (?![\s\S]), the end of the text in both Python and JSON Schema (the trigger form
# uses this pattern too): Python's $ would also match before a trailing newline.
CONF_KEY = re.compile(r"^spark\.[A-Za-z0-9_.\-]+(?![\s\S])")
# Key words of settings that hold credentials (fs.s3a.secret.key, fs.s3a.access.key,
# spark.authenticate.secret, spark.ssl.keyStorePassword, ...). Matched on the lowercase key.
# Written without inline flags so that JSON Schema (Airflow's trigger form, in the browser too)
# can use it: camelCase keys are matched by their capitals; in Python it ignores case altogether.
CREDENTIAL_PATTERN = (
    r"[Ss]ecret|[Pp]assw(or)?d|[Tt]oken|[Cc]redential|"
    r"([Aa]ccess|[Pp]rivate|[Aa]pi|[Ss]ession|[Aa]ccount|[Ee]ncryption|[Ss]igning)[._-]?[Kk]ey"
)
_SECRET = re.compile(CREDENTIAL_PATTERN, re.IGNORECASE)
MEMORY = re.compile(r"[0-9]+[kmgt]?b?", re.IGNORECASE)  # matched whole (fullmatch)


def check_conf_key(key: str) -> str:
    """``key`` if it is a ``spark.*`` setting without a credential; ValueError naming it otherwise."""
    if not CONF_KEY.fullmatch(key):
        raise ValueError(f"Spark setting {key!r} is not a spark.* key")
    if _SECRET.search(key.lower()):
        raise ValueError(
            f"Spark setting {key!r} would carry a credential; set credentials in the environment "
            "(PIPELINE_* variables), never in a spec or on the command line"
        )
    return key


def parse_conf_overrides(items: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` items (``--conf``), later ones winning; ValueError names a bad item."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--conf {item!r} is not KEY=VALUE")
        out[check_conf_key(key.strip())] = value
    return out


def spark_conf(
    spark: SparkSpec | None, parallelism: int, cluster: bool, overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The Spark config of a run: FAIR scheduling (one pool per pipeline), the spec's settings,
    then ``overrides``. On a cluster ``spark.cores.max`` defaults to the parallelism, so one job
    does not take every core of a shared cluster."""
    conf = {"spark.scheduler.mode": "FAIR"}
    if cluster:
        conf["spark.cores.max"] = str(spark.cores_max if spark and spark.cores_max else parallelism)
    if spark is not None:
        named = {
            "spark.driver.memory": spark.driver_memory,
            "spark.executor.memory": spark.executor_memory,
            "spark.executor.cores": spark.executor_cores,
            "spark.driver.maxResultSize": spark.driver_max_result_size,
        }
        conf.update({key: str(value) for key, value in named.items() if value is not None})
        conf.update(spark.conf_strings())
    conf.update(overrides or {})
    return conf
