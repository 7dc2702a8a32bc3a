"""Sinks: where each committed epoch's output lands."""

from pipeline_lib.sink.files_sink import FilesSink

__all__ = ["FilesSink"]
