"""The CLI disables pydantic's plugin look-up before its first model, unless the user set the variable."""

from __future__ import annotations

import ast
from pathlib import Path

import pipeline_lib.cli
from pipeline_lib.plugin_env import VARIABLE, skip_plugin_lookup


def test_an_unset_variable_disables_every_plugin():
    environ: dict[str, str] = {}
    skip_plugin_lookup(environ)
    assert environ == {VARIABLE: "__all__"}


def test_a_users_value_is_kept_the_empty_string_too():
    for value in ("", "logfire", "1"):
        environ = {VARIABLE: value}
        skip_plugin_lookup(environ)
        assert environ == {VARIABLE: value}


def test_the_cli_sets_it_before_it_imports_anything_else():
    tree = ast.parse(Path(pipeline_lib.cli.__file__).read_text())
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    first = [n for n in imports if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")][0]
    assert isinstance(first, ast.Import) and [a.name for a in first.names] == ["pipeline_lib.plugin_env"]
