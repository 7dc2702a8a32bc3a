"""The launched job sees no process but its own: its own user, PID and mount namespaces.

An Airflow deployment keeps its secrets (the Fernet key, the JWT and API secrets, the metadata
DB's URL) in its processes' environments, and a process can read ``/proc/<pid>/environ`` of every
process of its user (root: of every process). A spec's Python hook runs inside the job, so the
job is started by ``unshare`` in a new PID namespace with a ``/proc`` of its own: the scheduler,
the dag-processor, the task runner, every other process of the host is absent from it. The new
user namespace takes the host's capabilities away from a job launched by root as well, so it cannot
mount the host's ``/proc`` back or enter another namespace; its files are still the worker's user's.

Required of the deployment: Linux, util-linux's ``unshare``, and user namespaces (the kernel's
default; ``user.max_user_namespaces`` > 0, and no ``kernel.unprivileged_userns_clone=0`` or
AppArmor rule against them for a non-root worker). Where they are missing the launch is refused,
naming this; an operator who accepts the risk sets ``PIPELINE_JOB_ISOLATION=off`` in the worker's
environment (never from a run request), and each launch then logs a warning.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping

from pipeline_lib.errors import PipelineError

log = logging.getLogger(__name__)
ENV_JOB_ISOLATION = "PIPELINE_JOB_ISOLATION"
MODES = ("namespaces", "off")
INIT_MODULE = "pipeline_lib.orchestration.job_init"
# Read by execution.runtime.lifecycle.host_pid; named here too so the launcher imports the
# standard library alone (an isolating launcher may run without the job's dependencies).
ENV_HOST_PID = "PIPELINE_HOST_PID"
# --fork: the job is the new PID namespace's first process; --kill-child: it dies with unshare.
_NAMESPACES = ("--pid", "--mount", "--fork", "--mount-proc", "--kill-child")


def isolation_mode(env: Mapping[str, str] | None = None) -> str:
    """The worker's ``PIPELINE_JOB_ISOLATION``: ``namespaces`` (the default) or ``off``."""
    mode = (os.environ if env is None else env).get(ENV_JOB_ISOLATION, "namespaces").strip() or "namespaces"
    if mode not in MODES:
        raise PipelineError(f"{ENV_JOB_ISOLATION}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


@functools.cache
def unshare_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` command line that works on this host (tried once with ``true``), or None.
    ``--map-current-user`` keeps the worker's user name inside; older util-linux lacks it, and
    ``--map-root-user`` is the fallback (uid 0 inside the namespace, the worker's user outside)."""
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return None
    for mapping in ("--map-current-user", "--map-root-user"):
        prefix = (unshare, "--user", mapping, *_NAMESPACES)
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return None


def isolated(command: list[str], python: str = sys.executable, env: Mapping[str, str] | None = None) -> list[str]:
    """``command`` run in namespaces of its own under ``job_init`` (which reaps orphans and passes
    signals on, as a namespace's first process must), with ``PIPELINE_HOST_PID`` naming ``unshare``
    (the job's STATUS records it); PipelineError where that cannot be done."""
    if isolation_mode(env) == "off":
        log.warning(
            "%s=off: the job runs in the worker's PID namespace and can read the environment of every "
            "process of its user, Airflow's included",
            ENV_JOB_ISOLATION,
        )
        return command
    prefix = unshare_prefix()
    if prefix is None:
        raise PipelineError(
            "cannot isolate the job: it needs Linux, util-linux's unshare and user namespaces (see docs/security.md, "
            f"'The job cannot read Airflow's secrets'). Without them a job's code could read Airflow's secrets from "
            f"other processes. To run jobs anyway, accepting that, set {ENV_JOB_ISOLATION}=off in the worker's "
            "environment"
        )
    # sh records its own pid, which exec hands on to unshare: the host's pid of the job's holder.
    return ["/bin/sh", "-c", f'{ENV_HOST_PID}=$$ exec "$@"', "sh", *prefix, python, "-m", INIT_MODULE, *command]


def wait_status(returncode: int, command: list[str]) -> int:
    """The job's return code as if it had not been isolated: ``job_init`` reports a job killed by
    signal N as 128 + N, which becomes -N, as ``subprocess`` reports a killed child."""
    if INIT_MODULE in command and 128 < returncode < 128 + 65:
        return 128 - returncode
    return returncode
