"""Standing mutation check of the commit protocol: every safety line in tools/mutants.py, removed
one at a time, must make the unit tests fail.

Each mutant runs in a copy of the working tree's files (tracked, and untracked ones git does not
ignore, so new tests count before they are committed), with ``PYTHONPATH`` pointing at the copy: the venv's editable
install points at the checkout, which must never be the code under test. So first the unmutated
copy must pass (a broken baseline would "kill" every mutant), a canary mutant that breaks an
import must fail, and ``pipeline_lib`` must be imported from the copy.

    python tools/mutation.py [-j 2] [--timeout 300] [--only ID[,ID...]] [--list] [--every-failure]

Prints one line per mutant (killed or SURVIVED, seconds, the first failing test, or with
``--every-failure`` every failing test of a whole run) and a summary with the wall time; exits 1
if a mutant survived, a mutant's original text is stale, or the baseline is broken.
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

from mutants import MUTANTS, Mutant  # noqa: E402

# test_mutants_listed checks that each mutant's line is in the code, so it fails under every
# mutant: it must not count as the test that kills one.
# The whole unit tier in two stages: a mutant's own test files (``Mutant.tests``; the commit
# protocol's files when it names none), then, only for a mutant they did not kill, the rest.
# Collecting the whole tier imports Airflow and more and costs about as much as running the first
# stage, and the first stage kills nearly every mutant.
FIRST = ["tests/unit/test_commit_protocol_commit.py", "tests/unit/test_commit_protocol_restore.py",
         "tests/unit/test_commit_protocol_keys.py", "tests/unit/test_commit_protocol_sink.py",
         "tests/unit/test_start_over.py", "tests/unit/test_epoch_commit_order.py"]
UNIT_FILES = FIRST + sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "unit").glob("test_*.py")
                            if str(p.relative_to(REPO)) not in FIRST and p.name != "test_mutants_listed.py")
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
CANARY = Mutant("canary-broken-import", "pipeline_lib/plan/keygroups.py", "import zlib\n",
                "import zlib\nraise ImportError('mutation canary: this copy is the code under test')\n",
                "(not a safety line: proves the tests run the copy, not the checkout)")


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


def first_stage(mutant: Mutant | None) -> list[str]:
    """The test files a mutant's run starts with: its own, else the commit protocol's."""
    return list(mutant.tests) if mutant is not None and mutant.tests else FIRST


def stale(mutant: Mutant) -> str | None:
    """Why ``mutant`` cannot be applied to the checkout's file, or None."""
    path = REPO / mutant.file
    if not path.is_file():
        return f"{mutant.file} does not exist"
    missing = [t for t in mutant.tests if t not in UNIT_FILES]
    if missing:
        return f"its test files {missing} are not unit test files of this checkout"
    count = path.read_text().count(mutant.original)
    return None if count == 1 else f"its original text occurs {count} times in {mutant.file} (must be once)"


def make_copy(files: list[str], mutant: Mutant | None) -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"mutation-{mutant.id if mutant else 'baseline'}-"))
    root.chmod(0o755)  # readable as the checkout is: a test may import the copy as another user
    for rel in files:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)
    if mutant is not None:
        path = root / mutant.file
        text = path.read_text()
        assert text.count(mutant.original) == 1, f"{mutant.id}: stale"
        path.write_text(text.replace(mutant.original, mutant.replacement))
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


def run_tests(files: list[str], mutant: Mutant | None, timeout: float, stop_at_first: bool = True) -> Outcome:
    """The unit tests in a fresh copy of ``files`` with ``mutant`` applied (None: unmutated):
    with ``stop_at_first``, the mutant's first stage (``first_stage``) and then the rest of the
    tier, stopping at the first failure; otherwise the whole tier in one run, naming every failing test."""
    name = mutant.id if mutant is not None else "baseline"
    started = time.monotonic()
    root = make_copy(files, mutant)
    try:
        first = first_stage(mutant)
        stages = [first, [f for f in UNIT_FILES if f not in first]] if stop_at_first else [UNIT_FILES]
        output = ""
        for stage, test_files in enumerate(stages):
            command = [sys.executable, *PYTEST, *test_files, f"--basetemp={root}/.pytest-tmp{stage}"]
            if not stop_at_first:
                command.remove("-x")
            proc = subprocess.Popen(command, cwd=root, env=env_for(root), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
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
    root = make_copy(files, None)
    try:
        out = subprocess.run([sys.executable, "-c", "import pipeline_lib; print(pipeline_lib.__file__)"], cwd="/",
                             env=env_for(root), capture_output=True, text=True, check=True).stdout.strip()
        return None if Path(out).resolve().is_relative_to(root.resolve()) else out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-j", "--jobs", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per mutant's test run (default 300)")
    parser.add_argument("--only", action="append", default=[], help="run only these mutant ids (comma-separated)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--markdown", action="store_true",
                        help="print the mutants as the Markdown table of docs/reliability.md and exit")
    parser.add_argument("--every-failure", action="store_true",
                        help="run the whole suite for each mutant (no -x) and name every failing test")
    args = parser.parse_args(argv)

    if args.markdown:
        print("| mutant | file | the guarantee it removes |\n|---|---|---|")
        for m in MUTANTS:
            print(f"| `{m.id}` | `{Path(m.file).name}` | {m.removes} |")
        return 0
    if args.list:
        for m in MUTANTS:
            print(f"{m.id:40} {m.file:51} {m.removes}")
        return 0
    ids = [m.id for m in MUTANTS]
    if len(set(ids)) != len(ids):
        print("mutation: duplicate mutant ids in tools/mutants.py", file=sys.stderr)
        return 1
    wanted = {i for item in args.only for i in item.split(",") if i}
    unknown = wanted - set(ids)
    if unknown:
        print(f"mutation: unknown mutant id(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 1
    problems = [(m.id, why) for m in MUTANTS if (why := stale(m)) is not None]
    problems += [(CANARY.id, why)] if (why := stale(CANARY)) is not None else []
    if problems:
        print("mutation: the mutant list is stale (update tools/mutants.py with the code):", file=sys.stderr)
        for mid, why in problems:
            print(f"  {mid}: {why}", file=sys.stderr)
        return 1
    selected = [m for m in MUTANTS if not wanted or m.id in wanted]

    wall = time.monotonic()
    files = repo_files()
    elsewhere = imported_from_copy(files)
    if elsewhere is not None:
        print(f"mutation: the copy imports pipeline_lib from {elsewhere}, not from the copy", file=sys.stderr)
        return 1
    print(f"mutation: {len(selected)} mutant(s), {args.jobs} at a time, {len(files)} files copied per run", flush=True)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        baseline = pool.submit(run_tests, files, None, args.timeout)
        canary = pool.submit(run_tests, files, CANARY, args.timeout)
        base, broken = baseline.result(), canary.result()
        print(f"{'baseline':40} {'FAILED' if base.failed else 'passed':9} {base.seconds:6.1f}s  the unmutated copy",
              flush=True)
        print(f"{CANARY.id:40} {'killed' if broken.failed else 'SURVIVED':9} {broken.seconds:6.1f}s  {broken.detail}",
              flush=True)
        if base.failed:
            print(f"mutation: the unmutated copy fails its tests; fix that first:\n{base.output}", file=sys.stderr)
            return 1
        if not broken.failed or "mutation canary" not in broken.output:
            print("mutation: the canary (a copy whose keygroups module cannot be imported) did not fail on its own "
                  "error: the tests do not run the copy", file=sys.stderr)
            return 1
        outcomes: list[Outcome] = []
        runs = [pool.submit(run_tests, files, m, args.timeout, not args.every_failure) for m in selected]
        for future in as_completed(runs):
            o = future.result()
            outcomes.append(o)
            print(f"{o.name:40} {'killed' if o.failed else 'SURVIVED':9} {o.seconds:6.1f}s  {o.detail}", flush=True)
    survivors = sorted(o.name for o in outcomes if not o.failed)
    print(f"\nmutation: {len(outcomes) - len(survivors)} killed, {len(survivors)} survived of {len(outcomes)} "
          f"in {time.monotonic() - wall:.0f}s wall time")
    removes = {m.id: m for m in MUTANTS}
    for mid in survivors:
        print(f"  SURVIVED {mid}: {removes[mid].file}: {removes[mid].removes}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
