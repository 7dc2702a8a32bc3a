"""The mutation list stays usable and documented: every mutant still matches the code it mutates
(a stale one would make `make mutation` stop), ids are unique, and docs/reliability.md names each."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _mutants():
    spec = importlib.util.spec_from_file_location("mutants", ROOT / "tools" / "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutants", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.MUTANTS


def test_every_mutant_matches_its_code_exactly_once():
    for mutant in _mutants():
        source = (ROOT / mutant.file).read_text()
        assert source.count(mutant.original) == 1, f"mutant {mutant.id} is stale: update it with {mutant.file}"
        assert mutant.replacement != mutant.original, mutant.id


def test_mutant_ids_are_unique_and_documented():
    ids = [m.id for m in _mutants()]
    assert len(ids) == len(set(ids))
    doc = (ROOT / "docs" / "reliability.md").read_text()
    missing = [i for i in ids if f"`{i}`" not in doc]
    assert not missing, f"docs/reliability.md does not list the mutants {missing}"


def test_the_test_files_a_mutant_names_are_unit_test_files():
    """A mutant's ``tests`` run first against it: a name that is not a unit test file would make
    `make mutation` stop as stale."""
    for mutant in _mutants():
        for path in mutant.tests:
            assert path.startswith("tests/unit/test_") and (ROOT / path).is_file(), f"mutant {mutant.id}: {path}"
