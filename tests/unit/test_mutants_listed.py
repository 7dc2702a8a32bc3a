"""The mutation list stays usable and documented: every mutant finds its `# guard:` marker and its
original in the code it mutates (a stale one would make `make mutation` stop), every marker in the
library names a listed mutant, ids are unique, and docs/reliability.md names each."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mutation():
    """tools/mutation.py (the marker mechanism), which imports tools/mutants/ (the list)."""
    if "mutation" in sys.modules:
        return sys.modules["mutation"]
    spec = importlib.util.spec_from_file_location("mutation", ROOT / "tools" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _mutants():
    return _mutation().MUTANTS


def test_every_mutant_finds_its_marker_and_changes_its_code():
    mutation = _mutation()
    stale = {m.id: why for m in _mutants() if (why := mutation.stale(m, ROOT)) is not None}
    assert not stale, f"stale mutants (update them with the code, never drop them): {stale}"
    for mutant in _mutants():
        source = (ROOT / mutant.file).read_text()
        mutated = mutation.mutate(mutant, source)
        assert ast.dump(ast.parse(mutated)) != ast.dump(ast.parse(source)), f"mutant {mutant.id} changes nothing"


def test_every_marker_names_a_listed_mutant():
    orphans = _mutation().orphan_markers(ROOT)
    assert not orphans, f"`# guard:` markers naming no mutant of tools/mutants/: {orphans}"


SOURCE = """\
def f(a, b):
    if a and b:  # guard: m-if
        return 1
    x = g(a,
          b)  # guard: m-wrapped
    # guard: m-above
    y = h(a)
    z = 1  # guard: m-block
    w = 2  # guard: m-block
    return x + y
"""


@pytest.mark.parametrize(
    ("original", "replacement", "expected"),
    [
        ("b", "True", "    if a and (True):  # guard: m-if\n"),
        ("if a and b:\n    return 1", "pass", "    pass\n"),
    ],
)
def test_a_marker_on_a_compound_statement_selects_its_header_or_the_whole_statement(original, replacement, expected):
    mutation = _mutation()
    mutant = mutation.Mutant("m-if", "f.py", original, replacement, "")
    assert expected in mutation.mutate(mutant, SOURCE)


def test_a_marker_selects_a_wrapped_statement_and_a_comment_line_the_statement_below():
    mutation = _mutation()
    wrapped = mutation.mutate(mutation.Mutant("m-wrapped", "f.py", "g(a, b)", "g(b, a)", ""), SOURCE)
    assert "x = (g(b, a))  # guard: m-wrapped\n" in wrapped
    above = mutation.mutate(mutation.Mutant("m-above", "f.py", "y = h(a)", "y = 0", ""), SOURCE)
    assert "    # guard: m-above\n    y = 0\n" in above


def test_a_block_of_marked_statements_is_replaced_whole_and_re_indented():
    mutation = _mutation()
    mutant = mutation.Mutant("m-block", "f.py", "z = 1\nw = 2", "w = 2\nz = 1", "")
    assert "    w = 2\n    z = 1  # guard: m-block\n" in mutation.mutate(mutant, SOURCE)


@pytest.mark.parametrize(
    ("source", "original", "why"),
    [
        (SOURCE.replace("  # guard: m-if", ""), "b", "no `# guard: m-if` marker"),
        (SOURCE + "\n\nq = 1  # guard: m-if\n", "b", "not one run of consecutive statements"),
        (SOURCE, "c", "occurs 0 times"),
        (SOURCE, "if a and b:\n    return 2", "is not the statement"),
        (SOURCE.replace("x = g(a,", "x = g(a,  # guard: m-if"), "b", "marker is on 2 statements"),
    ],
)
def test_a_missing_or_moved_marker_or_a_changed_original_is_stale(source, original, why):
    mutation = _mutation()
    with pytest.raises(mutation.StaleMutant, match=why):
        mutation.mutate(mutation.Mutant("m-if", "f.py", original, "False", ""), source)


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
