"""Helpers shared by the tests that start services: run the real CLI in its own process group
(CliRun, run_cli), wait for a condition, write specs, read results, check that a fenced attempt
left the committed output as its successor committed it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import yaml

import pipeline_lib
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import SuccessMarker
from pipeline_lib.sink.table_reader import read_upsert_table
from pipeline_lib.storage import open_store


class CliRun:
    """``pipeline-lib ARGS`` (``python -m pipeline_lib``) started the way a user's shell starts it:
    in a session and process group of its own, so that the runner, its Spark JVM and its Python
    workers are killed as one. stderr goes to ``stderr_path`` (a pipe nobody reads can fill and
    block the run), stdout to ``stdout_path`` if given, else nowhere.

        run = CliRun(["run", str(spec)], env, tmp_path / "run.log")
        try:
            run.until(lambda: "epoch 2 committed" in run.stderr(), 120, "epoch 2")
            assert run.wait(240) == 0, run.stderr()[-3000:]
        finally:
            run.kill()  # a no-op once it has exited
    """

    def __init__(self, args: list[str], env: dict, stderr_path: Path, stdout_path: Path | None = None):
        self.args, self.stderr_path, self.stdout_path = list(args), Path(stderr_path), stdout_path
        with (
            self.stderr_path.open("w") as err,
            open(stdout_path, "w") if stdout_path is not None else nullcontext(subprocess.DEVNULL) as out,
        ):
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipeline_lib", *self.args],
                env=env,
                text=True,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        """The runner's PID, which is also its process group's and session's id."""
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stdout(self) -> str:
        return Path(self.stdout_path).read_text(errors="replace") if self.stdout_path is not None else ""

    def until(self, predicate, timeout: float, what: str, interval: float = 0.2):
        """``wait_for`` while this run lives: a run that has exited fails at once, and a timeout
        fails, with the run's exit code and the tail of its stderr, the evidence a bare timeout
        would hide."""

        def ready():
            exited = self.proc.poll() is not None  # before the predicate: all it wrote is visible
            value = predicate()
            if not value and exited:
                raise AssertionError(
                    f"pipeline-lib {' '.join(self.args)} exited ({self.proc.returncode}) "
                    f"before {what}; stderr:\n{self.stderr()[-3000:]}"
                )
            return value

        try:
            return wait_for(ready, timeout, what, interval)
        except AssertionError as timed_out:
            if "timed out" not in str(timed_out):
                raise
            raise AssertionError(f"{timed_out}; run stderr:\n{self.stderr()[-3000:]}") from None

    def wait(self, timeout: float = 240) -> int:
        """The exit code; after ``timeout`` seconds the group is killed and the test fails."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"pipeline-lib {' '.join(self.args)} timed out after {timeout}s; stderr:\n{self.stderr()[-3000:]}"
            ) from None

    def kill(self) -> None:
        """SIGKILL the whole process group if the runner still runs, and wait until every process
        of the group is gone. Idempotent."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)
            _wait_group_gone(self.proc.pid)


def run_cli(
    args: list[str], env: dict, timeout: float = 300, kill_when: str | None = None, kill_delay: float = 0.0
) -> subprocess.CompletedProcess:
    """Run ``pipeline-lib ARGS`` to its end (a CliRun) and return its exit code, stdout and stderr.

    With ``kill_when``, SIGKILL the whole group (runner, Spark JVM, Python workers) once a
    stderr line starts with that text, after ``kill_delay`` seconds."""
    with tempfile.TemporaryDirectory(prefix="pipeline-lib-cli-") as logs:
        run = CliRun(args, env, Path(logs) / "stderr", Path(logs) / "stdout")
        try:
            if kill_when is None:
                run.wait(timeout)
            else:
                run.until(
                    lambda: any(line.startswith(kill_when) for line in run.stderr().splitlines()),
                    timeout,
                    f"a stderr line starting with {kill_when!r}",
                    interval=0.02,
                )
                time.sleep(kill_delay)
                run.kill()
        finally:
            run.kill()
        return subprocess.CompletedProcess(args, run.returncode, run.stdout(), run.stderr())


def _wait_group_gone(pgid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"process group {pgid} still alive after SIGKILL")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    """Poll ``predicate`` until it returns something truthy (and return that), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


spend_spec = spend_job_spec  # the tests' short name for the sample job's spec


def write_spec(directory: Path, spec: dict) -> Path:
    path = directory / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def result_table(env: dict, sink: str) -> dict[str, dict]:
    table = read_upsert_table(open_store(sink, ConnectionSettings.from_env(env)), ["user"])
    return {k[0]: {"user": v["user"], "total": v["total"], "n": v["n"]} for k, v in table.items()}


def assert_committed_output_intact(
    settings: ConnectionSettings,
    name: str,
    sink: str,
    store: str,
    *,
    epochs: int,
    held_epoch: int,
    successor_attempt: int,
    status_attempt: int,
) -> None:
    """After a zombie attempt held in ``held_epoch`` was fenced: HEAD holds epochs 1..``epochs``,
    the successor's snapshots from the held epoch on, STATUS is attempt ``status_attempt``'s and
    STOPPED, and every epoch's marker lists exactly the parts its committed manifest lists, all
    present with their sizes and nothing else in the epoch's folder."""
    snapshots = SnapshotStore.open(store, name, "main", settings)
    head, _ = snapshots.read_head()
    assert head is not None and head.latest is not None and head.latest.epoch == epochs
    assert [e.epoch for e in head.history] == list(range(epochs, 0, -1))
    assert all(e.snapshot_id.endswith(f"-a{successor_attempt}") for e in head.history if e.epoch >= held_epoch), (
        head.history
    )
    status = snapshots.read_status()
    assert status is not None and (status.attempt, status.state) == (status_attempt, "STOPPED"), status
    out = open_store(sink, settings)
    for entry in head.history:
        committed = snapshots.load_manifest(entry.snapshot_id, entry.manifest_sha256).flows[name].sink
        marker = SuccessMarker.model_validate_json(out.get(committed.marker))
        assert marker.files == committed.files, f"epoch {entry.epoch}: the marker no longer lists the committed parts"
        for ref in marker.files:
            assert out.size(ref.key) == ref.bytes, f"epoch {entry.epoch}: listed part {ref.key} damaged"
        present = out.list(f"epoch={entry.epoch}/")
        assert sorted(present) == sorted([f.key for f in marker.files] + [committed.marker]), present


def dead_letters_written(runner, epoch: int, bad):
    """The dead-letter parts a read task of ``epoch`` writes of the bad records ``bad`` (an
    Arrow table), with the runner's own task writer: what the runner's commit then receives."""
    from pipeline_lib.sink.task_parts import TaskParts

    dead_letters = runner.task_writers(epoch).dead_letters
    parts = TaskParts(dead_letters, bad_records=True)
    parts.add(bad)
    return parts.finish()


def library_at_another_version(root: Path, version: str) -> Path:
    """A real copy of this library under ``root`` whose ``__version__`` is ``version``: put first
    on the Python workers' path, it makes the start-up's version check fail for real."""
    shutil.copytree(
        Path(pipeline_lib.__file__).parent, root / "pipeline_lib", ignore=shutil.ignore_patterns("__pycache__")
    )
    init = root / "pipeline_lib" / "__init__.py"
    text = init.read_text()
    assert f'__version__ = "{pipeline_lib.__version__}"' in text
    init.write_text(text.replace(f'__version__ = "{pipeline_lib.__version__}"', f'__version__ = "{version}"'))
    return root
