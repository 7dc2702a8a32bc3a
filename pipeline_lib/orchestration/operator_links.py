"""The run_job task's extra links (Airflow shows them as buttons on the task instance).

Airflow 3 stores each link's URL as an XCom when the task ends, so it is computed in the task's
process from the api-server's configured base URL (``[api] base_url``).
"""

from __future__ import annotations

from urllib.parse import quote

from airflow.sdk import BaseOperatorLink


def _base_url() -> str:
    from airflow.configuration import conf

    return (conf.get("api", "base_url", fallback="") or "").rstrip("/")


class PipelinesPageLink(BaseOperatorLink):
    """The job on the Pipelines page (its section, opened by the page's own ``?job=``)."""

    name = "Pipelines page"

    def get_link(self, operator, *, ti_key) -> str:
        """``<base>/pipeline-lib/?job=<job>#job-<job>``."""
        job = quote(str(getattr(operator, "job_name", "") or ""), safe="")
        return f"{_base_url()}/pipeline-lib/?job={job}#job-{job}"
