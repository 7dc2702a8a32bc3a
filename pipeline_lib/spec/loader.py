"""Load a YAML job spec and turn validation failures into one readable message.

Every error names the file, and the line where the YAML gives one: a YAML error by its mark, a
field error by walking the YAML nodes along the field's path (a missing field: its parent's line).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails
from yaml.nodes import MappingNode, Node, SequenceNode

from pipeline_lib.errors import SpecError
from pipeline_lib.spec.models import FieldsError, JobSpec

_CONNECTION_HINT = {"bootstrap", "bootstrap_servers", "endpoint", "access_key", "secret_key", "password"}
Loc = tuple[str | int, ...]


def _child(node: Node, part: str | int) -> tuple[Node, Node] | None:
    """(the node that names ``part``, its value) under ``node``, or None if the YAML lacks it."""
    if isinstance(node, MappingNode):
        for key, value in node.value:
            if getattr(key, "value", None) == str(part):
                return key, value
    elif isinstance(node, SequenceNode) and str(part).isdigit() and int(part) < len(node.value):
        item = node.value[int(part)]
        return item, item
    return None


def line_of(root: Node | None, loc: Loc) -> int | None:
    """The 1-based line of the deepest node of ``root`` along ``loc`` (a key's own line for a field)."""
    if root is None:
        return None
    node: Node = root
    line: int = root.start_mark.line + 1  # yaml has no type information: its marks are Any
    for part in loc:
        if part == "[key]":  # an invalid mapping key: its line is the current one
            continue
        found = _child(node, part)
        if found is None:
            break
        named, node = found
        line = named.start_mark.line + 1
    return line


def _dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc)


def _fields_involved(err: ErrorDetails) -> list[Loc]:
    """The full paths of the fields a FieldsError names, most telling first (none for other errors)."""
    cause = (err.get("ctx") or {}).get("error")
    if not isinstance(cause, FieldsError):
        return []
    return [tuple(err["loc"]) + tuple(field.split(".")) for field in cause.fields]


def _where(err: ErrorDetails) -> tuple[str, list[Loc]]:
    """What an error line names, and the paths whose YAML line it shows. An error names its field or
    section; a check of the job as a whole names the fields it involves (its location is empty)."""
    loc, fields = tuple(err["loc"]), _fields_involved(err)
    if loc:
        return _dotted(loc), fields + [loc]
    return ", ".join(_dotted(p) for p in fields) or "(top level)", fields


def _message(err: ErrorDetails) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden" and str(err["loc"][-1]) in _CONNECTION_HINT:
        return msg + " (connection settings come from PIPELINE_* environment variables, not the spec)"
    if err["type"] == "extra_forbidden":
        return "unknown field"
    return msg


def _format_errors(source: str, exc: ValidationError, root: Node | None) -> str:
    lines = [f"{source}: invalid job spec"]
    for err in exc.errors():
        where, paths = _where(err)
        line = next((n for n in (line_of(root, p) for p in paths) if n is not None), None)
        at = f"{source}:{line}: " if line is not None else ""
        lines.append(f"  {at}{where}: {_message(err)}")
    return "\n".join(lines)


def parse_spec(data: object, source: str = "<spec>", root: Node | None = None) -> JobSpec:
    """Validate ``data`` (a parsed spec); ``root``, the YAML node it was read from, gives lines."""
    if data is None:
        raise SpecError(
            f"{source}: the spec is empty; a job spec is a YAML mapping with at least name, source, sink and checkpoint"
        )
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a job spec is a YAML mapping, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(source, exc, root)) from None


def _yaml_error(source: str, exc: yaml.YAMLError) -> SpecError:
    """``file:line:column: not valid YAML: problem`` (PyYAML's own text names ``<unicode string>``)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    detail = f" ({context} at line {context_mark.line + 1})" if context and context_mark is not None else ""
    return SpecError(f"{where}: not valid YAML: {problem}{detail}")


def read_yaml(text: str, source: str) -> tuple[object, Node | None]:
    """The document of ``text`` and its node tree, from one parse."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        return (loader.construct_document(root) if root is not None else None), root
    except yaml.YAMLError as exc:
        raise _yaml_error(source, exc) from None
    finally:
        loader.dispose()


def load_spec(path: str | Path) -> JobSpec:
    """Load and validate a spec file; a SpecError points at the YAML line of each problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read spec: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: cannot read spec: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise SpecError(
            f"{path}: the file is empty; a job spec is a YAML mapping with at least name, source, sink and checkpoint"
        )
    data, root = read_yaml(text, str(path))
    return parse_spec(data, str(path), root)
