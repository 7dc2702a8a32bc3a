"""A check of Spark DDL schema strings ("user string, amount long"), done without a JVM.

Spark parses the schema for real when the job starts; this parser follows Spark's grammar for a
schema (``name type``, ``name: type``, backquoted names, ``NOT NULL``, ``COMMENT '...'``, nested
``array``/``map``/``struct``, every type name Spark knows) so that a spec is refused at load time
only for what Spark refuses too: a misspelt type, a missing type, unbalanced brackets. It is a
little stricter in four places: a column name appears twice or is empty (neither names one JSON
field), a type is ``char``/``varchar`` (Spark parses them, but a DataFrame's schema cannot hold
them), or the schema holds a SQL comment (``--`` would also comment out the metadata columns
appended to it). A collation's name and a time's precision are left to Spark.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Type names without parameters, lowercase (Spark matches them case-insensitively).
PRIMITIVE_TYPES = {
    "boolean",
    "tinyint",
    "byte",
    "smallint",
    "short",
    "int",
    "integer",
    "bigint",
    "long",
    "float",
    "real",
    "double",
    "date",
    "timestamp_ntz",
    "timestamp_ltz",
    "binary",
    "void",
    "variant",
}
DECIMAL_TYPES = {"decimal", "dec", "numeric"}
CHAR_TYPES = {"char", "character", "varchar"}
MAX_DECIMAL_PRECISION = 38
YEAR_MONTH = ("year", "month")
DAY_TIME = ("day", "hour", "minute", "second")
_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<word>[A-Za-z0-9_]+)
  | (?P<punct>[<>(),:])
""",
    re.VERBOSE | re.DOTALL,
)


# A parsed type: (lowercase type name, *parameters), e.g. ("long",), ("decimal", 10, 2),
# ("array", element), ("map", key, value), ("struct", (Column, ...)), ("string", "collate").
TypeTree = tuple[Any, ...]


@dataclass(frozen=True)
class Column:
    """One column (or struct field) of a schema: its name, its type as written and as parsed,
    whether it may be null (no ``NOT NULL``) and whether it carries a ``COMMENT``."""

    name: str
    dtype: str
    tree: TypeTree
    nullable: bool = True
    commented: bool = False


@dataclass(frozen=True)
class _Token:
    kind: str  # quoted | string | word | punct | end
    text: str
    pos: int


def _tokenize(ddl: str) -> list[_Token]:
    tokens, pos = [], 0
    while pos < len(ddl):
        match = _TOKEN.match(ddl, pos)
        if match is None:
            raise ValueError(
                f"unexpected {ddl[pos]!r} at position {pos} of schema {ddl!r} (a column name with "
                "characters other than letters, digits and _ is backquoted: `my-col`)"
            )
        if match.lastgroup != "space":
            tokens.append(_Token(match.lastgroup or "", match.group(), pos))
        pos = match.end()
    tokens.append(_Token("end", "", len(ddl)))
    return tokens


class _Parser:
    """Recursive descent over the tokens of one schema string; ValueError names what is wrong."""

    def __init__(self, ddl: str):
        self.ddl, self.tokens, self.i = ddl, _tokenize(ddl), 0

    # -- tokens -----------------------------------------------------------------------------
    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i = min(self.i + 1, len(self.tokens) - 1)
        return token

    def at_word(self, *words: str) -> bool:
        token = self.peek()
        return token.kind == "word" and token.text.lower() in words

    def at(self, punct: str) -> bool:
        token = self.peek()
        return token.kind == "punct" and token.text == punct

    def expect(self, punct: str, what: str) -> None:
        if not self.at(punct):
            raise self.error(f"expected {punct!r} {what}")
        self.take()

    def expect_word(self, *words: str) -> str:
        if not self.at_word(*words):
            raise self.error(f"expected {' or '.join(w.upper() for w in words)}")
        return self.take().text.lower()

    def error(self, problem: str) -> ValueError:
        token = self.peek()
        found = "the end" if token.kind == "end" else repr(token.text)
        return ValueError(f"{problem} at {found} (position {token.pos}) of schema {self.ddl!r}")

    # -- grammar ----------------------------------------------------------------------------
    def columns(self) -> list[Column]:
        fields = [self.column()]
        while self.at(","):
            self.take()
            fields.append(self.column())
        if self.peek().kind != "end":
            raise self.error("expected ',' or the end of the schema")
        return fields

    def column(self) -> Column:
        """``name [:] type [NOT NULL] [COMMENT 'text']``, in a schema or a struct's fields."""
        token = self.peek()
        if token.kind == "end" or self.at(","):
            raise self.error("expected a column name")
        name = self.name()
        if self.at(":"):
            self.take()
        if self.peek().kind == "end" or self.at(",") or self.at(">"):
            raise ValueError(f"column {name!r} needs a type, e.g. '{name} string'")
        start = self.peek().pos
        tree = self.data_type(name)
        dtype = self.ddl[start : self.peek().pos].strip()
        nullable, commented = True, False
        if self.at_word("not"):
            self.take()
            self.expect_word("null")
            nullable = False
        if self.at_word("comment"):
            self.take()
            if self.peek().kind != "string":
                raise self.error("expected a quoted comment after COMMENT")
            while self.peek().kind == "string":
                self.take()
            commented = True
        return Column(name, dtype, tree, nullable, commented)

    def name(self) -> str:
        token = self.peek()
        if token.kind == "quoted":
            name = token.text[1:-1].replace("``", "`")
        elif token.kind == "word" and not token.text.isdigit():
            name = token.text
        else:
            raise self.error("expected a column name (backquote a name with other characters: `my col`)")
        self.take()
        if not name:
            raise ValueError(f"a column name is empty in schema {self.ddl!r}")
        return name

    def data_type(self, column: str) -> TypeTree:
        token = self.peek()
        if token.kind != "word":
            raise self.error(f"expected the type of column {column!r}")
        word = self.take().text.lower()
        if word in PRIMITIVE_TYPES:
            return (word,)
        nested = {
            "array": self.array_type,
            "map": self.map_type,
            "struct": self.struct_type,
            "decimal": self.decimal_type,
            "dec": self.decimal_type,
            "numeric": self.decimal_type,
            "string": self.string_type,
            "timestamp": self.timestamp_type,
            "interval": self.interval_type,
            "time": self.time_type,
        }
        if word in nested:
            return nested[word](column)
        if word in CHAR_TYPES:
            raise ValueError(
                f"column {column!r} has type {token.text!r}: Spark accepts char and varchar only in "
                "table schemas, not in a DataFrame's; use string"
            )
        raise ValueError(f"column {column!r} has unknown type {token.text!r} in schema {self.ddl!r}")

    def array_type(self, column: str) -> TypeTree:
        self.expect("<", "after ARRAY")
        element = self.data_type(column)
        self.expect(">", "to close ARRAY<")
        return ("array", element)

    def map_type(self, column: str) -> TypeTree:
        self.expect("<", "after MAP")
        key = self.data_type(column)
        self.expect(",", "between a MAP's key and value types")
        value = self.data_type(column)
        self.expect(">", "to close MAP<")
        return ("map", key, value)

    def struct_type(self, column: str) -> TypeTree:
        self.expect("<", "after STRUCT")
        fields = []
        if not self.at(">"):
            fields.append(self.column())
            while self.at(","):
                self.take()
                fields.append(self.column())
        self.expect(">", "to close STRUCT<")
        return ("struct", tuple(fields))

    def integers(self, most: int) -> list[int]:
        """``(n[, m])``, if present: at most ``most`` integers."""
        if not self.at("("):
            return []
        self.take()
        values = []
        while True:
            token = self.peek()
            if token.kind != "word" or not token.text.isdigit():
                raise self.error("expected a number")
            values.append(int(self.take().text))
            if not self.at(",") or len(values) == most:
                break
            self.take()
        self.expect(")", "to close the type's parameters")
        return values

    def decimal_type(self, column: str) -> TypeTree:
        values = self.integers(2)
        precision = values[0] if values else 10
        scale = values[1] if len(values) > 1 else 0
        if precision > MAX_DECIMAL_PRECISION:
            raise ValueError(f"column {column!r}: decimal precision {precision} exceeds {MAX_DECIMAL_PRECISION}")
        if scale > precision:
            raise ValueError(f"column {column!r}: decimal scale {scale} exceeds its precision {precision}")
        return ("decimal", precision, scale)

    def time_type(self, column: str) -> TypeTree:
        self.integers(1)
        return ("time",)

    def string_type(self, column: str) -> TypeTree:
        if self.at_word("collate"):  # the collation's name is Spark's to check
            self.take()
            if self.peek().kind not in ("word", "quoted"):
                raise self.error("expected a collation name after COLLATE")
            self.take()
            return ("string", "collate")
        return ("string",)

    def timestamp_type(self, column: str) -> TypeTree:
        """``timestamp``, ``timestamp without time zone`` or ``timestamp with local time zone``."""
        if self.at_word("without"):
            self.take()
            kind = "timestamp_ntz"
        elif self.at_word("with"):
            self.take()
            self.expect_word("local")
            kind = "timestamp_ltz"
        else:
            return ("timestamp",)  # which of the two is the session's spark.sql.timestampType
        self.expect_word("time")
        self.expect_word("zone")
        return (kind,)

    def interval_type(self, column: str) -> TypeTree:
        """``interval``, ``interval UNIT`` or ``interval UNIT to LATER_UNIT`` within year-month or
        day-time units."""
        if not self.at_word(*YEAR_MONTH, *DAY_TIME):
            return ("interval",)
        start = self.take().text.lower()
        if not self.at_word("to"):
            return ("interval",)
        self.take()
        units = YEAR_MONTH if start in YEAR_MONTH else DAY_TIME
        later = units[units.index(start) + 1 :]
        if not later:
            raise self.error(f"an INTERVAL {start.upper()} has no TO")
        self.expect_word(*later)
        return ("interval",)


def parse_schema_columns(ddl: str) -> list[Column]:
    """The schema's columns with their parsed types, or ValueError naming the bad column or position."""
    fields = _Parser(ddl).columns()
    seen: set[str] = set()
    for column in fields:
        if column.name in seen:
            raise ValueError(f"column {column.name!r} appears twice")
        seen.add(column.name)
    return fields


def parse_schema_ddl(ddl: str) -> list[tuple[str, str]]:
    """Return [(column, type)] or raise ValueError naming the bad column or position."""
    return [(c.name, c.dtype) for c in parse_schema_columns(ddl)]
