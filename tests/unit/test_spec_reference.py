"""docs/spec.md documents exactly the fields of the spec models: a field added to a model and not
to the reference fails here, and so does a documented field that no model has."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from pipeline_lib.spec.models import JobSpec

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "spec.md"
TABLE_HEADER = "| field | type | default | meaning |"
TOP_LEVEL = "Top level"


def nested_models(annotation: object, suffix: str = "") -> typing.Iterator[tuple[type[BaseModel], str]]:
    """The models inside a field's type, each with how it sits under the field: ``[]`` for a list item,
    ``.<name>`` for a mapping value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, suffix
        return
    origin = typing.get_origin(annotation)
    for i, arg in enumerate(typing.get_args(annotation)):
        step = "[]" if origin is list else ".<name>" if origin is dict and i == 1 else ""
        yield from nested_models(arg, suffix + step)


def model_fields() -> dict[tuple[str, str], object]:
    """(section, field) -> default of every field reachable from JobSpec. A model is documented in
    the section where it is first reached (``source`` for SourceSpec, not ``sources.<name>``)."""
    fields: dict[tuple[str, str], object] = {}
    sections: dict[type[BaseModel], str] = {JobSpec: ""}
    queue: list[type[BaseModel]] = [JobSpec]
    while queue:
        model = queue.pop(0)
        section = sections[model]
        for name, info in model.model_fields.items():
            key = info.alias or name
            fields[(section, key)] = info.default
            for nested, suffix in nested_models(info.annotation):
                if nested not in sections:
                    sections[nested] = (f"{section}.{key}" if section else key) + suffix
                    queue.append(nested)
    return fields


def documented_fields() -> dict[tuple[str, str], str]:
    """(section, field) -> the default cell of every row of docs/spec.md's field tables. A table
    belongs to the ``## `section` `` heading above it; ``## Top level`` is the job itself."""
    rows: dict[tuple[str, str], str] = {}
    section: str | None = None
    in_table = False
    for line in REFERENCE.read_text().splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
            quoted = re.fullmatch(r"`([^`]+)`", heading)
            section = "" if heading == TOP_LEVEL else quoted.group(1) if quoted else None
            in_table = False
        elif line.strip() == TABLE_HEADER:
            assert section is not None, f"docs/spec.md: a field table under a heading that names no section: {line}"
            in_table = True
        elif in_table and line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            field = re.fullmatch(r"`([^`]+)`", cells[0])
            assert field and len(cells) == 4, f"docs/spec.md: not a | `field` | type | default | meaning | row: {line}"
            assert (section, field.group(1)) not in rows, f"docs/spec.md documents {section}.{field.group(1)} twice"
            rows[(section, field.group(1))] = cells[2]
        elif not line.startswith("|"):
            in_table = False
    return rows


def dotted(key: tuple[str, str]) -> str:
    return ".".join(part for part in key if part)


def test_every_field_is_documented_and_every_documented_field_exists():
    models, documented = model_fields(), documented_fields()
    missing = sorted(dotted(k) for k in set(models) - set(documented))
    unknown = sorted(dotted(k) for k in set(documented) - set(models))
    assert not missing, f"fields missing from docs/spec.md: {missing}"
    assert not unknown, f"docs/spec.md documents fields the spec does not have: {unknown}"


def test_documented_defaults_match_the_models():
    documented = documented_fields()
    for key, default in model_fields().items():
        cell = documented.get(key)
        if cell is None:  # missing: the test above names it
            continue
        if default is PydanticUndefined:
            assert cell == "required", f"{dotted(key)} is required, docs/spec.md says {cell!r}"
        elif default is None:
            assert cell == "unset", f"{dotted(key)} is unset by default, docs/spec.md says {cell!r}"
        elif isinstance(default, (int, str, list, dict)) and not isinstance(default, bool):
            assert cell.startswith(f"`{default}`"), f"{dotted(key)} defaults to {default!r}, docs/spec.md says {cell!r}"


def test_the_reference_stays_within_this_repository():
    text = REFERENCE.read_text()
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert all(not re.match(r"[a-z]+://|/|\.\./\.\.", link) for link in links), links
