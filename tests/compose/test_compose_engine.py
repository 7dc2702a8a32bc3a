"""docker-compose.yml run for real: images built, ``docker compose up`` by a Docker engine, a job
killed with SIGKILL inside the scheduler container and relaunched by ``pipeline_recovery``.

The machine cannot pull images, so the official base images are local stand-ins of the same names
(docker/standins/, how each differs: docs/compose.md); the project's Dockerfiles and the compose
file are the users'. Every service runs on the host's network with its ports moved to free ones
and the service names resolving to 127.0.0.1 (tests/compose/host_network.py). The scenario is the
compose-parity test's (tests/stack/test_compose_parity.py): 160,000 payments through the host
listener, ``pipeline__spend-per-user`` triggered through the api-server's REST API, its driver's
process group SIGKILLed in the scheduler container after a committed epoch, the run LOST,
``pipeline_recovery`` relaunching it, the job's Delta table equal to plain Python's totals, read
by delta-rs on the host and by DuckDB in the scheduler container (``python -m
pipeline_lib.table_query``). On the way, the job
is seen running in user, PID and mount namespaces of its own inside the scheduler container
(job_isolation.py), which the scheduler's ``security_opt`` makes possible; a second test shows that
without those options the same image cannot isolate a job, and why.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import create_topic, payment_events, produce_json
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import load_spec
from tests.compose.compose_stack import ComposeStack, running_stack
from tests.compose_recovery import assert_exact_spend, assert_queried_spend, relaunched_by_recovery
from tests.support import wait_for

pytestmark = [pytest.mark.compose, pytest.mark.full, pytest.mark.slow, pytest.mark.timeout(5400)]

REPO = Path(__file__).resolve().parents[2]
SPEC = load_spec(REPO / "dags" / "pipelines" / "spend-per-user.yaml")
JOB, DAG = SPEC.name, f"pipeline__{SPEC.name}"
EVENTS, USERS = 160_000, 2_000  # eight epochs of the spec's 20,000 records: the kill lands in the run
SCHEDULER = "airflow-scheduler"
NAMESPACES = ("pid", "user", "mnt")
# Run in the scheduler container: the namespaces of the container (this process's own), of the
# job's holder (unshare, the pid its STATUS records: in the new user and mount namespaces, its PID
# namespace the container's) and of its child (job_init, the new PID namespace's first process).
_NAMESPACES_OF = """
import json, os, sys
holder = int(sys.argv[1])
def ppid(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])
children = [int(p) for p in os.listdir("/proc") if p.isdigit() and ppid(int(p)) == holder]
ns = lambda pid: {n: os.readlink(f"/proc/{pid}/ns/{n}") for n in sys.argv[2:]}
print(json.dumps({"container": ns(os.getpid()), "holder": ns(holder), "job": [ns(c) for c in children],
                  "job_cmdline": [open(f"/proc/{c}/cmdline").read().split(chr(0))[:4] for c in children]}))
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeStack]:
    with running_stack(tmp_path_factory.mktemp("compose")) as stack:
        print("the stack is up:", ", ".join(f"{k} {v:.0f} s" for k, v in stack.timings.items()))
        yield stack
    print("torn down:", ", ".join(f"{k} {v:.0f} s" for k, v in stack.timings.items()))


def job_settings(stack: ComposeStack) -> ConnectionSettings:
    """The job's own MinIO user, as the scheduler's connection names it, on the host's port."""
    env = stack.dotenv
    return ConnectionSettings.from_env(
        {
            "PIPELINE_S3_ENDPOINT": f"http://127.0.0.1:{stack.port(9000)}",
            "PIPELINE_S3_ACCESS_KEY": env["PIPELINE_S3_SPEND_PER_USER_ACCESS_KEY"],
            "PIPELINE_S3_SECRET_KEY": env["PIPELINE_S3_SPEND_PER_USER_SECRET_KEY"],
            "PIPELINE_S3_REGION": env["PIPELINE_S3_REGION"],
        }
    )


def status(settings: ConnectionSettings):
    return SnapshotStore.open(SPEC.checkpoint.store, JOB, "main", settings).read_status()


def test_the_compose_job_survives_a_killed_driver_in_the_scheduler_container(stack: ComposeStack) -> None:
    airflow, settings = stack.airflow, job_settings(stack)
    assert airflow is not None
    host_bootstrap = f"127.0.0.1:{stack.port(19092)}"  # the EXTERNAL listener (compose: localhost:19092)
    events = payment_events(EVENTS, USERS, seed=22)
    topic = SPEC.source.kafka.topic
    create_topic(host_bootstrap, topic, 2)
    produce_json(host_bootstrap, topic, events)
    for dag_id in (DAG, "pipeline_recovery"):
        airflow.wait_for_dag(dag_id, timeout=300)
        airflow.unpause(dag_id)

    started = time.monotonic()
    run_id = airflow.trigger(DAG, {"mode": "until_caught_up", "lease_seconds": 4})
    running = wait_for(
        lambda: (s := status(settings)) and s.state == "RUNNING" and s.epoch >= 1 and s,
        900,
        "the run to commit epoch 1",
        interval=1,
    )
    assert running.launch.launched_by == f"airflow:{DAG}/{run_id}"
    print(f"triggered to epoch {running.epoch} committed: {time.monotonic() - started:.1f} s")

    # The job in the scheduler container runs in namespaces of its own (job_isolation.py).
    seen = json.loads(stack.exec(SCHEDULER, "python", "-c", _NAMESPACES_OF, str(running.pid), *NAMESPACES).stdout)
    print("namespaces of the scheduler container, the job's holder and the job:", json.dumps(seen))
    assert len(seen["job"]) == 1, seen
    [job_ns] = seen["job"]
    assert "pipeline_lib.orchestration.job_init" in seen["job_cmdline"][0], seen
    for name in NAMESPACES:
        assert job_ns[name] != seen["container"][name], f"the job shares the scheduler container's {name} namespace"

    assert not stack.non_loopback_sockets(), stack.non_loopback_sockets()  # the job, Spark and every service

    # SIGKILL to the driver's process group (the holder, the job, its JVM and Python workers).
    stack.exec(
        SCHEDULER,
        "python",
        "-c",
        "import os, signal, sys; os.killpg(os.getpgid(int(sys.argv[1])), 9)",
        str(running.pid),
    )
    assert airflow.wait_for_run(DAG, run_id, timeout=300) == "failed"
    log = airflow.task_log(DAG, run_id, "run_job")
    master = f"spark://spark-master:{stack.port(7077)}"
    assert "launching: " in log and "spark-submit" in log and f"--master {master}" in log, log[-3000:]
    assert "cannot isolate the job" not in log and "PIPELINE_JOB_ISOLATION=off" not in log, log[-3000:]
    wait_for(lambda: status(settings).observed(dt.datetime.now(dt.UTC))[0] == "LOST", 120, "LOST", interval=1)

    relaunch, summary = relaunched_by_recovery(airflow, DAG, JOB, recovery_timeout=600, run_timeout=900)
    assert_exact_spend(settings, SPEC.sink.path, events)  # the Delta table, read by delta-rs on the host
    # A second engine inside the stack, the command docs/compose.md gives: DuckDB over the table in
    # the scheduler container, with the job's S3 connection the container holds.
    query = stack.exec(
        SCHEDULER,
        "python",
        "-m",
        "pipeline_lib.table_query",
        "/opt/airflow/dags/pipelines/spend-per-user.yaml",
        timeout=300,
    )
    assert_queried_spend(query.stdout, events)
    final = status(settings)
    assert final.state == "STOPPED" and final.attempt == running.attempt + 1

    # the Pipelines page, served by the api-server container with its own read-only MinIO user
    overview = airflow.get("/pipeline-lib/api/overview", params={"lag": "false"})
    [job] = [j for j in overview["jobs"] if j["name"] == JOB]
    [view] = job["pipelines"]
    assert (view["status"], view["latest_snapshot"]) == ("STOPPED", summary["last_snapshot"]), view
    secrets = [
        v
        for k, v in stack.dotenv.items()
        if k.endswith(("PASSWORD", "SECRET_KEY", "_KEY", "SECRET")) and "ACCESS_KEY" not in k
    ]
    for text in (log, airflow.task_log(DAG, relaunch, "run_job"), json.dumps(summary), query.stdout + query.stderr):
        assert not any(s in text for s in secrets)
    assert not stack.non_loopback_sockets(), stack.non_loopback_sockets()


# util-linux's unshare with the namespaces job_isolation.py asks for.
_UNSHARE = ["--user", "--map-current-user", "--pid", "--mount", "--fork", "--mount-proc", "true"]
APPARMOR = Path("/sys/module/apparmor/parameters/enabled")
_PROBE = "from pipeline_lib.orchestration.job_isolation import unshare_prefix; print(unshare_prefix() is not None)"


def test_the_scheduler_isolates_jobs_only_with_its_security_options(stack: ComposeStack) -> None:
    """The scheduler's image, run by this engine as the airflow user: with the compose file's
    ``security_opt`` the job launcher's probe finds working namespaces; without them, or without
    all but one of them, it does not, and unshare says why (printed: docs/compose.md quotes it)."""
    scheduler = stack.services[SCHEDULER]
    image, options = scheduler["image"], scheduler["security_opt"]

    def run(*args: str, entrypoint: str, security: list[str]) -> tuple[int, str]:
        done = stack.engine.docker(
            "run",
            "--rm",
            "--network",
            "host",
            "--entrypoint",
            entrypoint,
            *(f"--security-opt={o}" for o in security),
            image,
            *args,
            check=False,
            timeout=300,
        )
        return done.returncode, (done.stdout + done.stderr).strip()

    assert run("-c", _PROBE, entrypoint="python", security=options) == (0, "True")
    assert run(*_UNSHARE, entrypoint="unshare", security=options) == (0, "")
    assert run("-c", _PROBE, entrypoint="python", security=[]) == (0, "False")
    for left_out in [options, *([o] for o in options)]:
        kept = [o for o in options if o not in left_out]
        code, why = run(*_UNSHARE, entrypoint="unshare", security=kept)
        print(f"security_opt {kept}: unshare exit {code}: {why or '(nothing)'}")
        if left_out == ["apparmor=unconfined"] and not APPARMOR.is_file():
            assert code == 0, why  # a kernel without AppArmor: Docker applies no profile to leave out
        else:
            assert code != 0, f"unshare works without {left_out}"
