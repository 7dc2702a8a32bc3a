"""What every part of the job spec shares: strict models, name patterns, locations, and the
error that names the fields a check across fields involves."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from pipeline_lib.storage.uri import parse_location

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # matched whole: $ would let a trailing newline in
TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
# The columns a Kafka source adds to each record's fields (kafka_source.METADATA_DDL, same order),
# and those a tolerant source adds to a bad record's row: no schema field may take these names.
METADATA_COLUMNS = ("_topic", "_partition", "_offset", "_timestamp_ms", "_timestamp", "_key", "_headers")
ERROR_COLUMNS = ("_error", "_raw")


class FieldsError(ValueError):
    """A check across fields failed. It carries the fields involved (dotted paths, relative to the
    model that checks them, most telling first): the loader shows the line of the first, and for a
    check of the job itself, whose location is empty, names them all instead of "(top level)"."""

    def __init__(self, message: str, *fields: str):
        super().__init__(message)
        self.fields = fields


class StrictModel(BaseModel):
    """Unknown fields are errors (a typo must not be ignored) and a loaded spec cannot change."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _valid_location(value: str) -> str:
    parse_location(value)
    return value


LocationUri = Annotated[str, AfterValidator(_valid_location)]


def check_key_columns(keys: list[str]) -> list[str]:
    """Key columns are plain column names, none repeated (a pydantic field validator's body)."""
    for k in keys:
        if not IDENTIFIER.fullmatch(k):
            raise ValueError(f"key column {k!r} is not a plain column name")
    if len(set(keys)) != len(keys):
        raise ValueError("key columns repeat")
    return keys
