"""No two test files share a basename across tests/ folders: the folders are not packages, so
pytest imports each test file by its basename and stops the whole run at the second one
("import file mismatch"), in whichever tier collects both."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_has_a_basename_of_its_own() -> None:
    places: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        places[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: sorted(paths) for name, paths in places.items() if len(paths) > 1}
    assert not shared, f"test files with the same basename (rename one): {shared}"
