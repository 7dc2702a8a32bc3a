"""The first process of a job's PID namespace: runs the job, passes signals on, reaps orphans.

The kernel treats a PID namespace's first process as its init: signals without a handler are
ignored by it, orphans of the namespace are handed to it, and when it exits every other process of
the namespace is killed. The job (Python, Spark's JVM, its Python workers) is not written to be
an init, so this small one stands in front of it: ``python -m pipeline_lib.orchestration.job_init
COMMAND...`` exits as the job exits: its code, or 128 + N when a signal N killed it (a
namespace's init cannot be killed by a signal of its own, so the shell's convention stands in;
``job_isolation.wait_status`` reads it back).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def run(command: list[str]) -> int:
    """Run ``command``, forward FORWARDED signals to it, reap every child; the job's wait status
    as a return code (negative: killed by that signal). The handlers are in place before the job
    starts: a signal that came between the two would be dropped, as an init drops every signal it
    has no handler for; one that comes before the job exists is passed on once it does."""
    job: subprocess.Popen | None = None
    early: list[int] = []

    def forward(number: int, _frame: object) -> None:
        if job is None:
            early.append(number)
            return
        try:
            os.kill(job.pid, number)
        except ProcessLookupError:  # the job has just ended
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    job = subprocess.Popen(command)
    for number in early:
        forward(number, None)
    while True:
        try:
            pid, status = os.wait()  # the job or an orphan of the namespace
        except ChildProcessError:
            return job.returncode if job.returncode is not None else 1
        except InterruptedError:
            continue
        if pid == job.pid:
            return os.waitstatus_to_exitcode(status)


def main() -> None:
    """Exit as the job did (128 + N for a job killed by signal N)."""
    if len(sys.argv) < 2:
        sys.exit("usage: python -m pipeline_lib.orchestration.job_init COMMAND [ARG...]")
    code = run(sys.argv[1:])
    sys.exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main()
