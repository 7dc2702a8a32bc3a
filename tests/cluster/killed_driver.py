"""A cluster run whose driver is SIGKILLed at a fault point, then the same job run again once the
cluster has ended the killed application: the sequence the cluster's crash tests share."""

from __future__ import annotations

from pathlib import Path

from tests.support import run_cli, wait_for


def killed_then_rerun(
    cluster, env: dict, spec: Path, name: str, fault: str, *rerun: str, timeout: float = 600
) -> tuple[str, str]:
    """Run ``spec`` (job ``name``) until the driver is killed at ``fault`` (``point@epoch``), wait
    for its application to end, run it again to the end (``rerun``: its extra options) from a
    restored snapshot; both runs' logs."""
    fault_log = spec.parent / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
        timeout=timeout,
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    point, epoch = fault.split("@")
    assert f"FAULT INJECTED: {point} epoch={epoch}" in fault_log.read_text()
    wait_for(
        lambda: not any(a["name"] == f"pipeline-lib:{name}" for a in cluster.state()["activeapps"]),
        60,
        "the killed driver's application to end",
    )
    restored = run_cli(["run", str(spec), "--until-caught-up", *rerun], env, timeout=timeout)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr
    return crashed.stderr, restored.stderr
