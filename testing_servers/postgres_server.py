"""A real PostgreSQL server on 127.0.0.1, as the compose stack's ``postgres`` service runs it.

The compose stack's Airflow keeps its metadata in PostgreSQL; a test of that stack without Docker
needs the same server, started from the machine's own packages (Debian's ``postgresql``). Like
the ``postgres`` image, it makes ``user`` the superuser with ``password`` (checked on TCP, trusted
on the unix socket) and creates the database ``db``. ``initdb`` refuses to run as root, so as root
the server runs as the packages' ``postgres`` user. The data directory and the socket live in a
fresh directory under the system's temporary folder (readable by that user, unlike pytest's); the
server is stopped by PID.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline_lib.localstack.ports import LOCALHOST, free_port
from pipeline_lib.localstack.processes import StackError, start_daemon, stop_pid, wait_until_ready

PACKAGE_ROOT = Path("/usr/lib/postgresql")  # Debian's packages: /usr/lib/postgresql/<major>/bin
RUN_AS_WHEN_ROOT = ("postgres", "nobody")  # the first of these users that exists


def bin_dir() -> Path:
    """The newest installed major's ``bin`` (``$PIPELINE_PG_BINDIR`` wins), with initdb in it."""
    if override := os.environ.get("PIPELINE_PG_BINDIR"):
        return Path(override)
    majors = sorted(
        (p for p in PACKAGE_ROOT.glob("*/bin") if (p / "initdb").is_file()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not majors:
        raise StackError(
            f"PostgreSQL is not installed (no {PACKAGE_ROOT}/<major>/bin/initdb): apt-get install postgresql"
        )
    return majors[-1]


@dataclass(frozen=True)
class PostgresServer:
    """A running server: where clients connect, as whom, and what stops it."""

    root: Path  # data directory, socket and log below it
    port: int
    pid: int
    binary: str
    version: str  # e.g. "15.18"
    user: str
    db: str

    @property
    def log_path(self) -> Path:
        """The server's log (quoted when it fails to start)."""
        return self.root / "postgres.log"


def _owner() -> pwd.struct_passwd | None:
    """Whom the server runs as: None (this user) unless this is root."""
    if os.geteuid() != 0:
        return None
    for name in RUN_AS_WHEN_ROOT:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise StackError(f"running as root, and none of the users {RUN_AS_WHEN_ROOT} exists for PostgreSQL")


def _run(argv: list[str], owner: pwd.struct_passwd | None, what: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
        user=owner.pw_uid if owner else None,
        group=owner.pw_gid if owner else None,
        extra_groups=[] if owner else None,
        cwd="/",
    )
    if done.returncode != 0:
        raise StackError(f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def start_postgres(user: str, password: str, db: str, *, timeout: float = 120.0) -> PostgresServer:
    """initdb a fresh cluster, start it on a free 127.0.0.1 port and create ``db``; return once
    ``pg_isready`` answers for ``user`` and ``db``. On failure the server is stopped."""
    bindir = bin_dir()
    owner = _owner()
    root = Path(tempfile.mkdtemp(prefix="pipeline-postgres-"))
    if owner is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    pwfile = root / "pwfile"
    pwfile.write_text(password + "\n")  # initdb reads the superuser's password here: never on argv
    if owner is not None:
        os.chown(pwfile, owner.pw_uid, owner.pw_gid)
    pwfile.chmod(0o600)
    try:
        _run(
            [
                str(bindir / "initdb"),
                "-D",
                str(root / "data"),
                "-U",
                user,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--no-instructions",
            ],
            owner,
            "initdb",
        )
    finally:
        pwfile.unlink(missing_ok=True)
    # "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)" -> "15.18"
    answer = _run([str(bindir / "postgres"), "--version"], owner, "postgres --version")
    version = re.sub(r"^.*\) ", "", answer).split()[0]
    port = free_port()
    binary = str(bindir / "postgres")
    log_path = root / "postgres.log"
    if owner is not None:
        log_path.touch()
        os.chown(log_path, owner.pw_uid, owner.pw_gid)
    pid = start_daemon(
        [binary, "-D", str(root / "data"), "-p", str(port), "-k", str(root), "-c", f"listen_addresses={LOCALHOST}"],
        log_path,
        user=owner.pw_name if owner else None,
    )
    server = PostgresServer(root, port, pid, binary, version, user, db)
    try:
        isready = [str(bindir / "pg_isready"), "-h", LOCALHOST, "-p", str(port), "-U", user]
        wait_until_ready(
            pid,
            binary,
            lambda: subprocess.run([*isready, "-d", "postgres"], capture_output=True, timeout=10).returncode == 0,
            what=f"PostgreSQL {version}",
            log_path=log_path,
            timeout=timeout,
        )
        _run([str(bindir / "createdb"), "-h", str(root), "-p", str(port), "-U", user, db], owner, f"createdb {db}")
        _run([*isready, "-d", db], owner, "pg_isready")
    except BaseException:
        stop_postgres(server)
        raise
    return server


def stop_postgres(server: PostgresServer) -> bool:
    """SIGTERM (a smart shutdown), SIGKILL after a while, then remove its directory; False if it
    was not running."""
    stopped = stop_pid(server.pid, server.binary, timeout=30)
    shutil.rmtree(server.root, ignore_errors=True)
    return stopped
