"""The spec of a stream-static join: ``- join: {table, format, on, how}`` as a transform.

Each epoch joins its rows with one pinned version of the table (plan.table_pins): the Parquet
files with their sizes and version tokens (S3 ETags), or a Delta table's version, saved in the
epoch's plan, so a replay or a repair joins with the same rows.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pipeline_lib.spec.base import LocationUri, StrictModel, check_key_columns


def on_from_yaml(cls: type, data: object) -> object:
    """YAML 1.1 (PyYAML) reads an unquoted ``on`` key as the boolean true: take it as ``on``."""
    if isinstance(data, dict) and True in data and "on" not in data:
        return {("on" if k is True else k): v for k, v in data.items()}
    return data


class JoinSpec(StrictModel):
    """``table``: a folder of Parquet files (every file whose path has no part starting with
    ``_`` or ``.``) or a Delta table's root; ``on``: columns of both the rows and the table, equal
    in a match; ``how``: ``inner`` drops rows without a match, ``left`` keeps them with nulls."""

    table: LocationUri
    format: Literal["parquet", "delta"] = "parquet"
    on: Annotated[list[str], Field(min_length=1)]
    how: Literal["inner", "left"] = "inner"

    _on = field_validator("on")(check_key_columns)

    _yaml_on = model_validator(mode="before")(on_from_yaml)

    @property
    def location(self) -> str:
        """The table's location, without a trailing slash: the key of its pin in a plan."""
        return self.table.rstrip("/")
