"""Exceptions with messages meant for the person running the job."""


class PipelineError(Exception):
    """Base class: anything the CLI reports as a clean, non-zero exit."""


class SpecError(PipelineError):
    """A job spec is invalid; the message names the field path and the reason."""


class ConfigError(PipelineError):
    """Connection settings (environment) are missing or invalid."""


class RecordError(PipelineError):
    """A Kafka record could not be decoded; names topic, partition and offset."""

    def __init__(self, topic: str, partition: int, offset: int, reason: str):
        self.topic, self.partition, self.offset, self.reason = topic, partition, offset, reason
        super().__init__(f"bad record at {topic}[{partition}]@{offset}: {reason}")


class StorageError(PipelineError):
    """An object store operation failed after its retries."""


class NotFound(StorageError):
    """The object does not exist."""


class SnapshotError(PipelineError):
    """No usable snapshot could be restored."""


class TransformError(PipelineError):
    """A user transform (SQL or Python hook) failed."""


class FencedError(PipelineError):
    """Another runner committed first: this one must stop without writing anything visible."""


# The start of a DataLossError's message, and so of the FAILED reason it leaves: recovery reads it
# to leave such a pipeline to a person (a relaunch would fail the same way).
DATA_LOSS = "Kafka records were deleted before they were read"


class DataLossError(PipelineError):
    """Records a pipeline had still to read are gone from the topic (retention, DeleteRecords)
    and its source says ``on_data_loss: fail``."""
