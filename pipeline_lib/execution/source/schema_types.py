"""A source's Spark schema built in Python from its DDL, without a round trip to the JVM.

Start-up needs the source's ``StructType`` before it can choose the epoch's path and start the
first epoch's read; asking Spark to parse the DDL puts a JVM call on that path. The spec's
parser (spec.schema_ddl) already reads Spark's grammar, so its parse is turned into PySpark's
types here, for the types whose meaning it knows exactly: every primitive, decimals, strings
without a collation, the timestamps, arrays, maps and structs, ``NOT NULL``. Anything else (a
comment, a collation, an interval, a time) gives None, and the caller asks Spark. The e2e test
``test_schema_types`` checks the result equal to Spark's own parse for every schema it accepts.
"""

from __future__ import annotations

from pyspark.sql import types as T

from pipeline_lib.spec.schema_ddl import Column, TypeTree, parse_schema_columns

PRIMITIVES: dict[str, T.DataType] = {
    "boolean": T.BooleanType(),
    "tinyint": T.ByteType(),
    "byte": T.ByteType(),
    "smallint": T.ShortType(),
    "short": T.ShortType(),
    "int": T.IntegerType(),
    "integer": T.IntegerType(),
    "bigint": T.LongType(),
    "long": T.LongType(),
    "float": T.FloatType(),
    "real": T.FloatType(),
    "double": T.DoubleType(),
    "date": T.DateType(),
    "timestamp_ntz": T.TimestampNTZType(),
    "timestamp_ltz": T.TimestampType(),
    "binary": T.BinaryType(),
    "void": T.NullType(),
    "variant": T.VariantType(),
}


class _LeftToSpark(Exception):
    """A part of the schema whose type only Spark should decide."""


def python_schema(ddl: str, timestamp_ntz: bool = False) -> T.StructType | None:
    """Spark's schema for ``ddl``, or None when Spark must parse it (see the module docstring).
    ``timestamp_ntz``: the session's ``spark.sql.timestampType`` is TIMESTAMP_NTZ, which a plain
    ``timestamp`` then means. A schema Spark refuses raises ValueError, as the spec's check does."""
    try:
        return T.StructType([_field(c, timestamp_ntz) for c in parse_schema_columns(ddl)])
    except _LeftToSpark:
        return None


def _field(column: Column, ntz: bool) -> T.StructField:
    if column.commented:
        raise _LeftToSpark("a comment")
    return T.StructField(column.name, _type(column.tree, ntz), column.nullable)


def _type(tree: TypeTree, ntz: bool) -> T.DataType:
    kind = tree[0]
    if kind in PRIMITIVES:
        return PRIMITIVES[kind]
    if kind == "timestamp":
        return T.TimestampNTZType() if ntz else T.TimestampType()
    if kind == "string" and len(tree) == 1:
        return T.StringType()
    if kind == "decimal":
        return T.DecimalType(tree[1], tree[2])
    if kind == "array":
        return T.ArrayType(_type(tree[1], ntz), True)
    if kind == "map":
        return T.MapType(_type(tree[1], ntz), _type(tree[2], ntz), True)
    if kind == "struct":
        return T.StructType([_field(c, ntz) for c in tree[1]])
    raise _LeftToSpark(kind)
