"""The Pipelines page in the Airflow UI, rendered by headless Chromium and used there as a user
would (real clicks and typing over the DevTools protocol): the page's links, refresh, the
confirmation every restore asks (naming what it fences and discards), a restore that keeps the
pipeline continuous and is followed to its state, and the page at 1024 and 800 px and in
Airflow's dark mode (screenshots checked by assertions). On the deployment test_airflow.py's runs
left (the ``airflow`` fixture of conftest.py, one for the tier).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from pipeline_lib.checkpoint.inspect import list_snapshots
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.settings import ConnectionSettings
from tests.airflow.airflow_jobs import (
    DAG,
    FRAME,
    JOB,
    REPO,
    SCREENSHOT,
    SECTION,
    STORE,
    button,
    live_cell,
    status,
)
from tests.airflow.browser import HeadlessChromium
from tests.support import wait_for

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]  # Airflow end to end: see test_airflow.py


def test_the_pipelines_page_in_the_airflow_ui(airflow):
    verify_run = airflow.trigger("pipeline_verify", {"jobs": [JOB]})  # its findings show on the page
    assert airflow.wait_for_run("pipeline_verify", verify_run, timeout=180) == "success"
    [(pipeline_id, counts)] = airflow.xcom("pipeline_verify", verify_run, "verify").items()
    assert pipeline_id == f"{JOB}/main" and counts["checked"] > 0 and counts["bad"] == 0, counts
    answer = airflow.request("GET", "/pipeline-lib/")
    html = answer.text
    assert JOB in html and "STOPPED" in html and "Trigger restore" in html
    assert f"UTC: ok ({counts['checked']} checked)" in html
    # only Airflow's own UI may frame it (the iframe test below shows 'self' keeps that working)
    assert answer.headers["Content-Security-Policy"] == "frame-ancestors 'self'"
    for docs in ("/pipeline-lib/docs", "/pipeline-lib/redoc", "/pipeline-lib/openapi.json"):
        assert airflow.request("GET", docs, expect=None).status_code == 404, docs
    assert "last relaunch at" in html  # the recovery record
    overview = airflow.get("/pipeline-lib/api/overview")
    [pipeline] = overview["jobs"][0]["pipelines"]
    assert pipeline["status"] == "STOPPED" and pipeline["lag"] == 0 and pipeline["history"]
    plugins = airflow.get("/api/v2/plugins")["plugins"]
    assert [v["url_route"] for p in plugins for v in p["external_views"]] == ["pipelines"]

    SCREENSHOT.parent.mkdir(exist_ok=True)
    shot = Path(tempfile.mkdtemp()) / "page.png"
    with HeadlessChromium() as browser:
        browser.screenshot(f"{airflow.base_url}/plugin/pipelines", shot, window="1500,900", budget_ms=20_000)
        dom = browser.dump_dom(f"{airflow.base_url}/pipeline-lib/", budget_ms=10_000)
    assert JOB in dom and "STOPPED" in dom  # what the browser rendered, not only what the server sent
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000  # a rendered page, not a blank one
    shutil.copy(shot, SCREENSHOT)


def test_the_pipelines_page_used_in_the_browser(airflow, stack_env):
    snapshots = SnapshotStore.open(STORE, JOB, "main", ConnectionSettings.from_env(stack_env))
    listed = list_snapshots(snapshots)
    head = next(r for r in listed if r["head"])
    runs_before = len(airflow.dag_runs(DAG))
    with HeadlessChromium() as browser, browser.page(f"{airflow.base_url}/plugin/pipelines") as page:
        page.wait_for(
            f"!!(document.querySelector('iframe[title=Pipelines]') && {FRAME} && {SECTION} && "
            f"{SECTION}.querySelector('form.restore'))",
            90,
            "the Pipelines page in its iframe",
        )

        # the history: every snapshot the store lists, each with its key count
        rows = page.evaluate(
            f"Array.from({SECTION}.querySelectorAll('details tr'), r => Array.from(r.cells, "
            "c => c.textContent.trim())).slice(1)"
        )
        assert [(r[0], r[4]) for r in rows] == [(s["snapshot_id"], str(s["keys"])) for s in listed]
        assert live_cell(page, "epoch") == str(head["epoch"])

        # start over asks first, naming what it discards; cancelled, nothing is triggered
        form = f"{SECTION}.querySelector('form.restore')"
        page.evaluate(f"{form}.restore.value = 'none'")
        page.click(f"{form}.querySelector('button[type=submit]')")
        question = page.wait_for(
            f"!{SECTION}.querySelector('.confirm').hidden && {SECTION}.querySelector('.confirm').innerText",
            10,
            "the start-over question",
        )
        assert f"latest {head['snapshot_id']}, epoch {head['epoch']}" in question and "retracts every epoch" in question
        page.click(button("Cancel", SECTION))
        assert page.evaluate(f"{SECTION}.querySelector('.msg').textContent") == "start over cancelled"

        # the page refreshes itself and keeps a choice being made
        page.evaluate(f"{form}.restore.value = {listed[-1]['snapshot_id']!r}")
        judged = page.evaluate(f"{FRAME}.querySelector('[data-live=sub]').textContent")
        page.wait_for(f"{FRAME}.querySelector('[data-live=sub]').textContent !== {judged!r}", 60, "a refresh")
        assert page.evaluate(f"{form}.restore.value") == listed[-1]["snapshot_id"]

        # a restore from the page asks first; the pipeline was last run continuously, and stays so
        page.evaluate(f"{form}.restore.value = 'latest'")
        page.click(f"{form}.querySelector('button[type=submit]')")
        question = page.wait_for(
            f"!{SECTION}.querySelector('.confirm').hidden && {SECTION}.querySelector('.confirm').innerText",
            10,
            "the restore question",
        )
        assert "Nothing committed is discarded" in question and "mode continuous" in question, question
        assert "fences it" not in question  # the pipeline is STOPPED: nothing runs to be fenced
        page.click(button("Restore", SECTION))
        page.wait_for(f"!!{SECTION}.querySelector('.msg a')", 30, "the triggered run's link")
        run_id = page.evaluate(f"{SECTION}.querySelector('.msg a').textContent").removeprefix("run ")
        assert run_id.startswith("pipelines_page__main__latest__")
        conf = airflow.dag_run(DAG, run_id)["conf"]
        assert conf["reason"] == "Pipelines page: restore latest of pipeline main" and conf["mode"] == "continuous"
        running = wait_for(
            lambda: (
                (s := status(stack_env))
                and s.state == "RUNNING"
                and s.launch.launched_by == f"airflow:{DAG}/{run_id}"
                and s
            ),
            240,
            "the restored stream",
        )
        assert running.launch.mode == "forever"
        page.wait_for(f"{SECTION}.querySelector('.msg').dataset.state === 'running'", 60, "the page to show it running")

        # a second restore while it runs: the question names the attempt it fences; cancelled
        page.wait_for(
            f"{FRAME}.querySelector('[data-live=\"{JOB}/main/status\"]').innerText.includes('RUNNING')",
            60,
            "the page to show RUNNING",
        )
        page.click(f"{form}.querySelector('button[type=submit]')")
        question = page.wait_for(
            f"!{SECTION}.querySelector('.confirm').hidden && {SECTION}.querySelector('.confirm').innerText",
            10,
            "the fencing question",
        )
        assert f"Attempt {running.attempt} is RUNNING" in question and "fences it" in question, question
        page.click(button("Cancel", SECTION))
        assert page.evaluate(f"{SECTION}.querySelector('.msg').textContent") == "restore cancelled"

        # the current run and its log are linked from the status; the log link opens the task in Airflow
        page.click(f"{SECTION}.querySelector('[data-run-links] a:last-child')")
        page.wait_for(
            f"decodeURIComponent(location.pathname) === '/dags/{DAG}/runs/{run_id}/tasks/run_job'",
            30,
            "the Airflow UI to open the run's task log",
        )
        airflow.request("PATCH", f"/api/v2/dags/{DAG}/dagRuns/{run_id}", json={"state": "failed"})  # stop the stream
        stopped = wait_for(lambda: (s := status(stack_env)) and s.state != "RUNNING" and s, 120, "the stream to stop")
        assert stopped.state == "STOPPED", stopped
        assert len(airflow.dag_runs(DAG)) == runs_before + 1

        # back on the page: the DAG link opens the DAG in Airflow
        page.goto(f"{airflow.base_url}/plugin/pipelines")
        page.wait_for(f"!!({FRAME} && {SECTION} && {SECTION}.querySelector('form.restore'))", 90, "the Pipelines page")
        shown = page.wait_for(
            f"(t => t.includes('STOPPED') && t)({FRAME}.querySelector('[data-live=\"{JOB}/main/status\"]').innerText)",
            60,
            "the page to show STOPPED",
        )
        assert f"airflow:{DAG}/{run_id}" in shown, shown
        page.click(f"{SECTION}.querySelector('a[data-airflow-link]')")
        page.wait_for(f"location.pathname === '/dags/{DAG}'", 30, "the Airflow UI to open the DAG")


def _mean_luminance(png: Path, box: tuple[int, int, int, int]) -> float:
    from PIL import Image, ImageStat

    with Image.open(png) as image:
        return ImageStat.Stat(image.convert("L").crop(box)).mean[0]


def test_the_pipelines_page_fits_narrow_windows_and_follows_airflow_s_dark_mode(airflow, tmp_path):
    """At 1024 and 800 px every field of the job's pipeline, the restore button above all, lies
    inside the frame, where a click reaches it; with Airflow's theme set to dark, the page is dark."""
    restore = f"{SECTION}.querySelector('form.restore button[type=submit]')"
    (REPO / "results").mkdir(exist_ok=True)
    inside = (
        f"(() => {{ const frame = document.querySelector('iframe[title=Pipelines]'), doc = {FRAME}, "
        f"width = doc.documentElement.clientWidth; "
        f"const cells = Array.from({SECTION}.querySelectorAll('tr[data-pipeline] > td')); "
        "const cut = cells.filter(c => c.getBoundingClientRect().right > width + 1).length; "
        f"const b = {restore}; b.scrollIntoView({{block: 'center'}}); const r = b.getBoundingClientRect(); "
        "const hit = doc.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2) === b; "
        "const f = frame.getBoundingClientRect(); "
        "return {cut, hit, scroll: doc.documentElement.scrollWidth - width, "
        "box: [f.left + r.left, f.top + r.top, f.left + r.right, f.top + r.bottom]}; })()"
    )
    for width in (1024, 800):
        with (
            HeadlessChromium() as browser,
            browser.page(f"{airflow.base_url}/plugin/pipelines", window=f"{width},800") as page,
        ):
            page.wait_for(
                f"!!(document.querySelector('iframe[title=Pipelines]') && {FRAME} && {SECTION} && {restore})",
                90,
                "the Pipelines page",
            )
            seen = page.evaluate(inside)
            assert seen["cut"] == 0 and seen["scroll"] <= 0 and seen["hit"], (width, seen)
            shot = page.screenshot(tmp_path / f"page-{width}.png")
            left, top, right, bottom = (round(v) for v in seen["box"])
            assert 0 <= left < right <= width and bottom > top
            # the button is drawn where the DOM says: its box is not the page's plain background
            from PIL import Image

            with Image.open(shot) as image:
                colours = image.convert("RGB").crop((left, top, right, bottom)).getcolors(1 << 16) or []
            assert len(colours) > 4, (width, len(colours))
            shutil.copy(shot, REPO / "results" / f"pipelines-page-{width}.png")

    with HeadlessChromium() as browser, browser.page(f"{airflow.base_url}/plugin/pipelines") as page:
        page.evaluate("localStorage.setItem('theme', 'dark')")  # what Airflow's own theme switch stores
        page.goto(f"{airflow.base_url}/plugin/pipelines")
        page.wait_for(
            f"document.documentElement.classList.contains('dark') && {FRAME} && {SECTION} && "
            f"{FRAME}.documentElement.dataset.theme === 'dark'",
            90,
            "the page in Airflow's dark mode",
        )
        frame = page.evaluate(
            "(() => { const r = document.querySelector('iframe[title=Pipelines]')"
            ".getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; })()"
        )
        shot = page.screenshot(tmp_path / "dark.png")
        box = tuple(round(v) for v in frame)
        assert _mean_luminance(shot, box) < 80, "the page inside Airflow's dark UI is not dark"  # white is 255
        shutil.copy(shot, REPO / "results" / "pipelines-page-dark.png")
