"""Start, watch and stop the stack's daemons — always by PID, never by name.

Daemons run in their own session (so a Ctrl+C in the parent's terminal does not reach them
and the CLI can exit while they keep running), log to a file in the data dir, and are
identified later by PID *plus* the binary in ``/proc/PID/cmdline`` (``ps`` where there is no
/proc, as on macOS), so that a recycled PID belonging to some other program is never signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pipeline_lib.errors import PipelineError

# Popen objects of daemons started by this Python process: kept so that we can reap them
# (no zombies, no "subprocess still running" warnings) when we stop them ourselves.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_PROC = Path("/proc")


class StackError(PipelineError):
    """A local-stack process could not be started, reached or stopped."""


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, or a note that there is none."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def start_daemon(
    argv: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
) -> int:
    """Start ``argv`` detached (new session), stdout+stderr appended to ``log_path``; return its PID.
    ``user``: run it as that user (and its group), for a server that refuses to run as root."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
                user=user,
                group=None if user is None else _group_of(user),
                extra_groups=None if user is None else [],
            )
        except OSError as exc:
            raise StackError(f"cannot start {argv[0]}: {exc}") from exc
    _CHILDREN[proc.pid] = proc
    return proc.pid


def _group_of(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_gid


def _cmdline(pid: int, binary: str) -> list[str] | None:
    if not _PROC.is_dir():
        return _ps_cmdline(pid, binary)
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _ps_cmdline(pid: int, binary: str) -> list[str] | None:
    """argv[0] from ``ps`` (one string: a path with spaces is recognised only as ``binary`` itself)."""
    try:
        out = subprocess.run(
            ["ps", "-p", str(pid), "-o", "command="], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not out:
        return None
    return [binary] if out == binary or out.startswith(binary + " ") else out.split()[:1]


def pid_alive(pid: int | None, binary: str) -> bool:
    """True if ``pid`` runs and its argv[0] is ``binary`` (same path or same file name).

    For our own children the Popen status decides (an unreaped child keeps its PID, and
    /proc/PID/cmdline is briefly empty while exec completes). Zombies count as dead.
    """
    if not pid or pid <= 0:
        return False
    proc = _CHILDREN.get(pid)
    if proc is not None:
        if proc.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    argv = _cmdline(pid, binary)
    if not argv:
        return False
    return argv[0] == binary or Path(argv[0]).name == Path(binary).name


def wait_until_ready(
    pid: int, binary: str, ready: Callable[[], bool], *, what: str, log_path: Path, timeout: float
) -> float:
    """Poll ``ready()`` until it returns True; return the seconds it took.

    Raises StackError with the log tail if the process dies or ``timeout`` passes. Exceptions
    from ``ready()`` mean "not yet"; the last one is quoted in the error.
    """
    start = time.monotonic()
    delay, last_error = 0.02, ""
    while True:
        if not pid_alive(pid, binary):
            raise StackError(
                f"{what} (pid {pid}) exited during start-up; last lines of {log_path}:\n{log_tail(log_path)}"
            )
        try:
            if ready():
                return time.monotonic() - start
        except Exception as exc:  # any failure just means "not ready yet"
            last_error = f"{type(exc).__name__}: {exc}"
        if time.monotonic() - start > timeout:
            raise StackError(
                f"{what} (pid {pid}) not ready after {timeout:.0f}s"
                f"{' (' + last_error + ')' if last_error else ''}; last lines of {log_path}:\n"
                f"{log_tail(log_path)}"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def _wait_gone(pid: int, binary: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid, binary):
            return True
        time.sleep(0.05)
    return not pid_alive(pid, binary)


def _signal(pid: int, sig: signal.Signals) -> None:
    """Signal the process group the daemon leads (its own session), else the process alone."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_pid(pid: int | None, binary: str, *, timeout: float = 15.0) -> bool:
    """SIGTERM, wait up to ``timeout`` s, then SIGKILL. False if it was not running.

    Does nothing unless ``pid`` still runs ``binary`` (PID-reuse safety).
    """
    if not pid_alive(pid, binary):
        return False
    assert pid is not None
    _signal(pid, signal.SIGTERM)
    if not _wait_gone(pid, binary, timeout):
        _signal(pid, signal.SIGKILL)
        if not _wait_gone(pid, binary, 10.0):
            raise StackError(f"{binary} (pid {pid}) survived SIGKILL")
    proc = _CHILDREN.pop(pid, None)
    if proc is not None:
        proc.wait()
    return True
