"""Run a spec's transforms and aggregate, or a ``python:`` hook, over in-memory records: no Kafka,
no S3, no cluster (Spark in local mode), for a user's unit tests.

    from pipeline_lib.testing import run_on_records
    run = run_on_records("jobs/spend.yaml", [{"user": "a", "amount": 5}, {"user": "a", "amount": 7}])
    assert run.table() == [{"user": "a", "total": 12, "n": 2}]

``run_on_records`` (testing.runner) says what is the job's own code and what differs from a run.
"""

from pipeline_lib.testing.records import Record
from pipeline_lib.testing.runner import RecordsRun, run_on_records

__all__ = ["Record", "RecordsRun", "run_on_records"]
