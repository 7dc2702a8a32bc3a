"""The package's import graph has no cycles between subpackages: they (and the top-level modules)
form layers, each importing only those below it. The checkout's harness packages, which the wheel
does not carry (``benchmarks``, with the soak, and ``testing_servers``), sit above the library:
they import it, it never imports them. The benchmark modules, split by job, also import each other
in one direction only.

The graph is read from the source with ``ast``: every ``import`` and ``from … import`` of
``pipeline_lib`` or a harness package, at module level or inside a function (a deferred import is still a dependency).
Imports under ``if TYPE_CHECKING:`` count between subpackages (a type named across layers ties
them) but not between modules (they never run). A failure prints the cycle with the file and
line of each import in it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "pipeline_lib"
HARNESS = ("benchmarks", "testing_servers")  # top-level packages of the checkout, not in the wheel


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (or package)
    where: str  # file:line
    typing_only: bool


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(p for top in (PACKAGE, *HARNESS) for p in (ROOT / top).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _typing_only_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports() -> Iterator[Import]:
    modules = _modules()

    def resolve(name: str) -> str | None:  # the module a dotted name is, or is inside of
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = _typing_only_lines(tree)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]  # a name may be a submodule
            else:
                continue
            targets = {resolve(name) for name in names if name.split(".")[0] in (PACKAGE, *HARNESS)} - {None, module}
            for target in sorted(targets):
                yield Import(module, target, f"{path.relative_to(ROOT)}:{node.lineno}", node.lineno in typing_only)


def layer_of(module: str) -> str:
    """``pipeline_lib.checkpoint.manifest`` -> ``checkpoint``; a top-level module is its own layer,
    so is each harness package (``benchmarks.throughput`` -> ``benchmarks``)."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return parts[0]
    return parts[1] if len(parts) > 1 else PACKAGE


def find_cycle(edges: dict[str, dict[str, list[Import]]]) -> list[str] | None:
    """A cycle of the graph as its nodes, the first repeated at the end; None if it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def describe(cycle: list[str], edges: dict[str, dict[str, list[Import]]]) -> str:
    lines = [" -> ".join(cycle)]
    for a, b in zip(cycle, cycle[1:]):
        lines += [f"  {a} -> {b}:"] + [f"    {i.where}: {i.source} imports {i.target}" for i in edges[a][b]]
    return "\n".join(lines)


def graph(of, typing_imports: bool) -> dict[str, dict[str, list[Import]]]:
    edges: dict[str, dict[str, list[Import]]] = {}
    for imp in _imports():
        a, b = of(imp.source), of(imp.target)
        if a != b and (typing_imports or not imp.typing_only):
            edges.setdefault(a, {}).setdefault(b, []).append(imp)
    return edges


def test_the_graph_sees_module_and_function_level_imports():
    found = {(i.source, i.target) for i in _imports()}
    assert ("pipeline_lib.execution.runtime.runner_planning", "pipeline_lib.checkpoint.epoch_commit") in found
    assert ("pipeline_lib.api.run", "pipeline_lib.execution.runtime.job_runner") in found  # inside run_job
    assert ("benchmarks.commands", "benchmarks.throughput") in found  # the harness packages are read too
    assert ("benchmarks.driver_load", "testing_servers.spark_cluster") in found
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]


def test_no_cycle_between_subpackages():
    edges = graph(layer_of, typing_imports=True)
    cycle = find_cycle(edges)
    assert cycle is None, "subpackages import each other round a loop:\n" + describe(cycle, edges)


EXECUTION_LAYERS = ("source", "engine", "state", "runtime")  # execution's packages, lowest first


def test_execution_packages_import_only_those_below_them():
    """The Kafka source needs no Spark glue, the glue no keyed state, and only the runtime knows them all."""
    rank = {package: i for i, package in enumerate(EXECUTION_LAYERS)}
    inside = f"{PACKAGE}.execution."
    upward = [
        f"{i.where}: {i.source} imports {i.target}"
        for i in _imports()
        if i.source.startswith(inside)
        and i.target.startswith(inside)
        and rank[i.source.split(".")[2]] < rank[i.target.split(".")[2]]
    ]
    assert not upward, "an execution package imports one above it:\n" + "\n".join(upward)


def test_the_cli_is_the_top_layer():
    """Only ``python -m pipeline_lib`` imports the CLI: a module below it that needs the CLI's file
    (the launcher's spark-submit) finds it without importing every command."""
    importers = sorted(
        {i.where for i in _imports() if i.target == f"{PACKAGE}.cli" and i.source != f"{PACKAGE}.__main__"}
    )
    assert not importers, f"{PACKAGE}.cli is imported by {importers}"


def test_the_library_imports_no_harness_package():
    """The wheel carries ``pipeline_lib`` alone: an import of ``benchmarks`` or ``testing_servers`` in
    it would fail in every installation (``pipeline-lib bench`` loads the checkout's benchmarks by
    name, bench_command.py, and says what to do when they are not there)."""
    found = sorted(
        f"{i.where}: {i.source} imports {i.target}"
        for i in _imports()
        if i.source.split(".")[0] == PACKAGE and i.target.split(".")[0] in HARNESS
    )
    assert not found, "the library imports the harness:\n" + "\n".join(found)
    servers = sorted(
        i.where for i in _imports() if i.source.startswith("testing_servers") and i.target.startswith("benchmarks")
    )
    assert not servers, f"testing_servers imports benchmarks: {servers}"


def test_no_cycle_between_modules():
    """No two modules import each other round a loop (function-level imports count too)."""
    edges = graph(lambda module: module, typing_imports=False)
    cycle = find_cycle(edges)
    assert cycle is None, "modules import each other round a loop:\n" + describe(cycle, edges)


def test_recovery_names_the_run_modes_as_the_dag_form_does():
    """Recovery keeps its own map of run mode -> DAG param (it imports nothing of orchestration):
    it must be the trigger form's map turned round."""
    from pipeline_lib.orchestration.launch_request import MODES
    from pipeline_lib.recovery.recover import MODE_PARAM

    assert MODE_PARAM == {run_mode: param for param, run_mode in MODES.items()}
