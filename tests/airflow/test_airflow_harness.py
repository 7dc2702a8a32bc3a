"""Smoke test of the Airflow harness: real api-server, scheduler and dag-processor processes run a
throwaway TaskFlow DAG; Params are enforced by the REST API; nothing listens beyond loopback;
nothing survives stop()."""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import requests

from tests.airflow.launch import start_airflow
from tests.airflow.rest_api import AirflowApiError

# The harness itself is exercised by every test in tests/airflow; this smoke test of it is `make full`.
pytestmark = [pytest.mark.timeout(300), pytest.mark.full]

DAG_ID = "harness_smoke"
DAG_FILE = textwrap.dedent("""
    import os
    from pathlib import Path

    from airflow.sdk import Param, dag, task


    @dag(dag_id="harness_smoke", schedule=None, catchup=False,
         params={"n": Param(1, type="integer", minimum=1)})
    def harness_smoke():
        @task
        def double(params=None):
            n = params["n"]
            Path(os.environ["HARNESS_SMOKE_OUT"], f"n{n}.txt").write_text(str(n * 2))
            print(f"doubled {n}")
            return n * 2

        double()


    harness_smoke()
""")


def _ss_listeners(pids: set[int]) -> list[str]:
    """Lines of ``ss -ltnup`` whose socket belongs to one of ``pids``."""
    out = subprocess.run(["ss", "-Hltnup"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if {int(p) for p in re.findall(r"pid=(\d+)", line)} & pids]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_airflow_harness_runs_a_dag_end_to_end(tmp_path, record_property):
    dags, out = tmp_path / "dags", tmp_path / "out"
    dags.mkdir()
    out.mkdir()
    (dags / "harness_smoke.py").write_text(DAG_FILE)

    t0 = time.monotonic()
    plugins = Path(__file__).resolve().parents[2] / "plugins"  # also: the UI page needs a login
    server = start_airflow(tmp_path / "airflow", dags, plugins, {"HARNESS_SMOKE_OUT": str(out)})
    seen: dict[int, psutil.Process] = {}
    try:
        t_healthy = time.monotonic() - t0
        seen.update((p.pid, p) for p in server.harness_processes())

        server.wait_for_dag(DAG_ID, timeout=90)
        t_dag = time.monotonic() - t0
        server.unpause(DAG_ID)

        t1 = time.monotonic()
        run_id = server.trigger(DAG_ID, {"n": 3})
        assert server.wait_for_run(DAG_ID, run_id, timeout=180) == "success", server.logs_tail()
        t_run = time.monotonic() - t1

        assert server.xcom(DAG_ID, run_id, "double") == 6
        assert (out / "n3.txt").read_text() == "6"
        [ti] = server.task_instances(DAG_ID, run_id)
        assert ti["state"] == "success" and ti["try_number"] == 1
        assert "doubled 3" in server.task_log(DAG_ID, run_id, "double", ti["try_number"])
        assert [r["dag_run_id"] for r in server.dag_runs(DAG_ID)] == [run_id]

        # The REST API validates conf against the DAG's Params before creating a run.
        with pytest.raises(AirflowApiError) as bad:
            server.trigger(DAG_ID, {"n": 0})
        assert bad.value.status_code == 400
        assert re.search(r"\bn\b", bad.value.json()["detail"]), bad.value.body
        assert len(server.dag_runs(DAG_ID)) == 1

        # The Pipelines page (plugin) answers only a signed-in user.
        anonymous = requests.get(f"{server.base_url}/pipeline-lib/api/overview", timeout=30)
        assert anonymous.status_code in (401, 403), anonymous.status_code
        assert server.get("/pipeline-lib/api/overview")["jobs"] == []
        # Its restore buttons trigger runs with the browser's session cookie, as the UI's own
        # requests do: the REST API accepts that (and nothing without it).
        url = f"{server.base_url}/api/v2/dags/{DAG_ID}/dagRuns"
        body = {"logical_date": None, "conf": {"n": 4}}
        assert requests.post(url, json=body, timeout=30).status_code in (401, 403)
        by_cookie = requests.post(url, json=body, cookies={"_token": server.token()}, timeout=30)
        assert by_cookie.status_code == 200, by_cookie.text
        assert server.wait_for_run(DAG_ID, by_cookie.json()["dag_run_id"], timeout=180) == "success"

        # Every listening socket of every process the harness started is on loopback.
        procs = server.harness_processes()
        seen.update((p.pid, p) for p in procs)
        listeners = server.listening_sockets()
        assert ("127.0.0.1", server.port) in {(ip, port) for _, _, ip, port in listeners}
        assert server.non_loopback_sockets() == [], listeners
        if shutil.which("ss"):
            lines = _ss_listeners({p.pid for p in procs})
            loopback = r"\s(127\.0\.0\.1|\[::1\]):\d+\s"
            assert lines and all(re.search(loopback, ln) for ln in lines), lines
    finally:
        t2 = time.monotonic()
        server.stop()
        t_stop = time.monotonic() - t2

    server.stop()  # idempotent
    assert server.harness_processes() == []
    assert [p for p in seen.values() if _alive(p)] == []

    timings = {
        "start_to_healthy_s": round(t_healthy, 1),
        "start_to_dag_visible_s": round(t_dag, 1),
        "trigger_to_success_s": round(t_run, 1),
        "stop_s": round(t_stop, 1),
    }
    record_property("timings", timings)
    print(f"airflow harness timings: {timings}")
