"""Standing mutation check of the commit protocol: every safety line in tools/mutants/, removed
one at a time, must make the unit tests fail.

Each mutant runs in a copy of the working tree's files (tracked, and untracked ones git does not
ignore, so new tests count before they are committed), with ``PYTHONPATH`` pointing at the copy: the venv's editable
install points at the checkout, which must never be the code under test. So first the unmutated
copy must pass (a broken baseline would "kill" every mutant), a canary mutant that breaks an
import must fail, and ``pipeline_lib`` must be imported from the copy.

How a mutant finds its line: the library marks each safety line with a comment naming the
mutant, ``# guard: <mutant-id>``, so the code can be formatted freely (tools/mutant_markers.py
says which statement a marker marks and how ``Mutant.original`` is matched). An original that no
longer matches the code makes the list stale: update the mutant with the code, never drop it
silently. A marker naming no listed mutant is stale too.

    python tools/mutation.py [-j 2] [--timeout 300] [--only ID[,ID...]] [--list] [--every-failure]

Prints one line per mutant (killed or SURVIVED, seconds, the first failing test, or with
``--every-failure`` every failing test of a whole run) and a summary with the wall time; exits 1
if a mutant survived, the list is stale, or the baseline is broken.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

from mutant_markers import StaleMutant, markers, mutate  # noqa: E402
from mutants import MUTANTS, Mutant  # noqa: E402

# test_mutants_listed checks that each mutant's marker and original are in the code, so it fails
# under every mutant: it must not count as the test that kills one.
# The whole unit tier in two stages: a mutant's own test files (``Mutant.tests``; the commit
# protocol's files when it names none), then, only for a mutant they did not kill, the rest.
# Collecting the whole tier imports Airflow and more and costs about as much as running the first
# stage, and the first stage kills nearly every mutant.
FIRST = [
    "tests/unit/test_commit_protocol_commit.py",
    "tests/unit/test_commit_protocol_restore.py",
    "tests/unit/test_commit_protocol_gc.py",
    "tests/unit/test_commit_protocol_keys.py",
    "tests/unit/test_commit_protocol_sink.py",
    "tests/unit/test_start_over.py",
    "tests/unit/test_epoch_commit_order.py",
]
UNIT_FILES = FIRST + sorted(
    str(p.relative_to(REPO))
    for p in (REPO / "tests" / "unit").glob("test_*.py")
    if str(p.relative_to(REPO)) not in FIRST and p.name != "test_mutants_listed.py"
)
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
LIBRARY = "pipeline_lib"
CANARY_ID = "canary-broken-import"
CANARY_FILE = "pipeline_lib/plan/keygroups.py"
CANARY_LINE = "raise ImportError('mutation canary: this copy is the code under test')\n"


def orphan_markers(root: Path) -> list[str]:
    """Markers in the library naming no listed mutant, as ``file:line: id``."""
    listed = {m.id for m in MUTANTS}
    return [
        f"{path.relative_to(root)}:{line}: {mutant_id}"
        for path in sorted((root / LIBRARY).rglob("*.py"))
        for mutant_id, lines in markers(path.read_text()).items()
        if mutant_id not in listed
        for line in lines
    ]


def stale(mutant: Mutant, root: Path = REPO) -> str | None:
    """Why ``mutant`` cannot be applied to ``root``'s file, or None."""
    path = root / mutant.file
    if not path.is_file():
        return f"{mutant.file} does not exist"
    missing = [t for t in mutant.tests if t not in UNIT_FILES]
    if missing:
        return f"its test files {missing} are not unit test files of this checkout"
    try:
        mutate(mutant, path.read_text())
    except StaleMutant as exc:
        return str(exc)
    return None


def stale_list(mutants: list[Mutant]) -> list[str]:
    """Every reason the list does not match the code: duplicate ids, stale mutants, orphan markers."""
    ids = [m.id for m in mutants]
    problems = [f"{i}: listed twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    problems += [f"{m.id}: {why}" for m in mutants if (why := stale(m)) is not None]
    problems += [f"{where}: a marker naming no listed mutant" for where in orphan_markers(REPO)]
    return problems


# -- running the tests against a copy ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One test run: a copy of the files with one file's text replaced (``edit``), or none (the baseline)."""

    name: str
    tests: tuple[str, ...] = ()
    edit: tuple[str, str] | None = None  # (file, its mutated text)


def mutant_run(mutant: Mutant) -> Run:
    return Run(mutant.id, mutant.tests, (mutant.file, mutate(mutant, (REPO / mutant.file).read_text())))


def canary_run() -> Run:
    """Not a safety line: a module that cannot be imported proves the tests run the copy, not the checkout."""
    return Run(CANARY_ID, (), (CANARY_FILE, (REPO / CANARY_FILE).read_text() + CANARY_LINE))


@dataclass
class Outcome:
    name: str
    failed: bool  # the tests failed: a mutant is killed
    seconds: float
    detail: str
    output: str = ""


def repo_files() -> list[str]:
    def git(*args: str) -> list[str]:
        out = subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True).stdout
        return [p for p in out.decode().split("\0") if p]

    tracked = git("ls-files", "-z")
    untracked = git("ls-files", "-z", "--others", "--exclude-standard")
    return [p for p in dict.fromkeys(tracked + untracked) if (REPO / p).is_file()]


def first_stage(run: Run) -> list[str]:
    """The test files a run starts with: its own, else the commit protocol's."""
    return list(run.tests) if run.tests else FIRST


def make_copy(files: list[str], run: Run) -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"mutation-{run.name}-"))
    root.chmod(0o755)  # readable as the checkout is: a test may import the copy as another user
    for rel in files:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)
    if run.edit is not None:
        (root / run.edit[0]).write_text(run.edit[1])
    return root


def env_for(root: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PIPELINE_FAULT_POINTS", None)
    return env


def failures(output: str) -> str:
    """The failing tests named in pytest's short summary (or the last line of its output)."""
    failed = [m.group(2) for m in re.finditer(r"^(FAILED|ERROR) (\S+)", output, re.MULTILINE)]
    if failed:
        return " ".join(failed)
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1][:160] if lines else "(no output)"


def run_tests(files: list[str], run: Run, timeout: float, stop_at_first: bool = True) -> Outcome:
    """The unit tests in a fresh copy of ``files`` with ``run``'s edit: with ``stop_at_first``, the
    run's first stage (``first_stage``) and then the rest of the tier, stopping at the first
    failure; otherwise the whole tier in one run, naming every failing test."""
    name = run.name
    started = time.monotonic()
    root = make_copy(files, run)
    try:
        first = first_stage(run)
        stages = [first, [f for f in UNIT_FILES if f not in first]] if stop_at_first else [UNIT_FILES]
        output = ""
        for stage, test_files in enumerate(stages):
            command = [sys.executable, *PYTEST, *test_files, f"--basetemp={root}/.pytest-tmp{stage}"]
            if not stop_at_first:
                command.remove("-x")
            proc = subprocess.Popen(
                command,
                cwd=root,
                env=env_for(root),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            try:
                out, _ = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
                return Outcome(name, True, time.monotonic() - started, f"timed out after {timeout:g}s", output + out)
            output += out
            if proc.returncode != 0:
                return Outcome(name, True, time.monotonic() - started, failures(out), output)
        return Outcome(name, False, time.monotonic() - started, "all tests passed", output)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def imported_from_copy(files: list[str]) -> str | None:
    """Where the copy's interpreter imports pipeline_lib from, if that is not the copy."""
    root = make_copy(files, Run("import-check"))
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import pipeline_lib; print(pipeline_lib.__file__)"],
            cwd="/",
            env=env_for(root),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return None if Path(out).resolve().is_relative_to(root.resolve()) else out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-j", "--jobs", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per mutant's test run (default 300)")
    parser.add_argument("--only", action="append", default=[], help="run only these mutant ids (comma-separated)")
    parser.add_argument(
        "--list", action="store_true", help="list the mutants, check that each matches its marked code, and exit"
    )
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the mutants as the Markdown table of docs/reliability.md and exit",
    )
    parser.add_argument(
        "--every-failure",
        action="store_true",
        help="run the whole suite for each mutant (no -x) and name every failing test",
    )
    args = parser.parse_args(argv)

    if args.markdown:
        print("| mutant | file | the guarantee it removes |\n|---|---|---|")
        for m in MUTANTS:
            print(f"| `{m.id}` | `{Path(m.file).name}` | {m.removes} |")
        return 0
    if args.list:
        for m in MUTANTS:
            print(f"{m.id:40} {m.file:51} {m.removes}")
    problems = stale_list(MUTANTS)
    if problems:
        print(
            "mutation: the list is stale: update the mutant with the code, never drop it silently "
            "(tools/mutants/, the `# guard:` markers in the library):",
            file=sys.stderr,
        )
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    if args.list:
        return 0
    wanted = {i for item in args.only for i in item.split(",") if i}
    unknown = wanted - {m.id for m in MUTANTS}
    if unknown:
        print(f"mutation: unknown mutant id(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 1
    selected = [mutant_run(m) for m in MUTANTS if not wanted or m.id in wanted]

    wall = time.monotonic()
    files = repo_files()
    elsewhere = imported_from_copy(files)
    if elsewhere is not None:
        print(f"mutation: the copy imports pipeline_lib from {elsewhere}, not from the copy", file=sys.stderr)
        return 1
    print(f"mutation: {len(selected)} mutant(s), {args.jobs} at a time, {len(files)} files copied per run", flush=True)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        baseline = pool.submit(run_tests, files, Run("baseline"), args.timeout)
        canary = pool.submit(run_tests, files, canary_run(), args.timeout)
        base, broken = baseline.result(), canary.result()
        print(
            f"{'baseline':40} {'FAILED' if base.failed else 'passed':9} {base.seconds:6.1f}s  the unmutated copy",
            flush=True,
        )
        print(
            f"{CANARY_ID:40} {'killed' if broken.failed else 'SURVIVED':9} {broken.seconds:6.1f}s  {broken.detail}",
            flush=True,
        )
        if base.failed:
            print(f"mutation: the unmutated copy fails its tests; fix that first:\n{base.output}", file=sys.stderr)
            return 1
        if not broken.failed or "mutation canary" not in broken.output:
            print(
                "mutation: the canary (a copy whose keygroups module cannot be imported) did not fail on its own "
                "error: the tests do not run the copy",
                file=sys.stderr,
            )
            return 1
        outcomes: list[Outcome] = []
        runs = [pool.submit(run_tests, files, m, args.timeout, not args.every_failure) for m in selected]
        for future in as_completed(runs):
            o = future.result()
            outcomes.append(o)
            print(f"{o.name:40} {'killed' if o.failed else 'SURVIVED':9} {o.seconds:6.1f}s  {o.detail}", flush=True)
    survivors = sorted(o.name for o in outcomes if not o.failed)
    print(
        f"\nmutation: {len(outcomes) - len(survivors)} killed, {len(survivors)} survived of {len(outcomes)} "
        f"in {time.monotonic() - wall:.0f}s wall time"
    )
    removes = {m.id: m for m in MUTANTS}
    for mid in survivors:
        print(f"  SURVIVED {mid}: {removes[mid].file}: {removes[mid].removes}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
