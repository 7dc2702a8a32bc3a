"""No Python module of the checkout over 400 lines (issue 33): a module that long holds more than
one job, and is split by what it does (tests by what they test, with shared fixtures in a helper
module or a conftest), never into "part 1" and "part 2".

Lines are counted as ``wc -l`` counts them. The files are those git tracks, and new ones it does
not ignore; in a copy of the checkout without git (tools/mutation.py runs the unit tests in one),
every ``*.py`` outside hidden directories, which is the same set.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 400
# file -> why it may be longer, until the reason is gone (the second test notices when it is)
EXCEPTIONS: dict[str, str] = {}


def python_files(root: Path) -> list[str]:
    """The checkout's Python files, relative to ``root``."""
    if (root / ".git").exists():
        listing = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.py"]
        out = subprocess.run(listing, cwd=root, check=True, capture_output=True).stdout
        return sorted(p for p in out.decode().split("\0") if p and (root / p).is_file())
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if not any(part.startswith(".") for part in p.relative_to(root).parts)
    )


def lines_of(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def test_no_module_is_over_400_lines():
    files = python_files(ROOT)
    assert len(files) > 100 and "tests/unit/test_module_sizes.py" in files  # the listing itself works
    long = {f: lines_of(ROOT / f) for f in files if f not in EXCEPTIONS and lines_of(ROOT / f) > LIMIT}
    assert long == {}, f"modules over {LIMIT} lines (split them by what they do): {long}"


def test_each_exception_is_still_needed():
    for name, why in EXCEPTIONS.items():
        path = ROOT / name
        assert path.is_file() and lines_of(path) > LIMIT, f"{name} is no longer over {LIMIT} lines ({why}): drop it"
