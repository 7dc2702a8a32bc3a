"""A light check of Spark DDL schema strings ("user string, amount long"), done without a JVM.

Spark parses the schema for real when the job starts; this only catches the mistakes a user
makes most (typos in type names, missing types, duplicate columns) while the spec is loaded.
"""

from __future__ import annotations

import re

PRIMITIVE_TYPES = {
    "string", "varchar", "char", "long", "bigint", "int", "integer", "short", "smallint",
    "byte", "tinyint", "double", "float", "real", "boolean", "bool", "binary", "date",
    "timestamp", "timestamp_ntz", "decimal",
}
_NAME = re.compile(r"^(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)$")


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in schema {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced brackets in schema {text!r}")
    parts.append("".join(current))
    return parts


def parse_schema_ddl(ddl: str) -> list[tuple[str, str]]:
    """Return [(column, type)] or raise ValueError naming the bad column."""
    fields: list[tuple[str, str]] = []
    for raw in _split_top_level(ddl):
        item = raw.strip()
        if not item:
            raise ValueError(f"empty column in schema {ddl!r}")
        pieces = item.split(None, 1)
        if len(pieces) != 2:
            raise ValueError(f"column {item!r} needs a type, e.g. '{item} string'")
        name, dtype = pieces[0], pieces[1].strip()
        if not _NAME.match(name):
            raise ValueError(f"column name {name!r} is not valid")
        name = name.strip("`")
        base = re.split(r"[<(\s]", dtype, maxsplit=1)[0].lower()
        if base not in PRIMITIVE_TYPES | {"array", "map", "struct"}:
            raise ValueError(f"column {name!r} has unknown type {dtype!r}")
        if any(name == existing for existing, _ in fields):
            raise ValueError(f"column {name!r} appears twice")
        fields.append((name, dtype))
    return fields
