"""Headless Chromium for the tests of pages served by Airflow: a screenshot (PNG) and the DOM
after the page's scripts ran, from one throwaway browser profile.

    with HeadlessChromium() as browser:
        browser.screenshot(f"{server.base_url}/plugin/pipelines", tmp_path / "page.png")
        dom = browser.dump_dom(f"{server.base_url}/pipeline-lib/")

Each call is one ``chromium --headless`` process, run to its end (``--virtual-time-budget`` lets
the page's scripts and requests finish first). This module holds no project-specific logic.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

_COMMON = ["--headless", "--no-sandbox", "--disable-gpu"]


class HeadlessChromium:
    def __init__(self, executable: str = "chromium", timeout: float = 120):
        self.executable, self.timeout = executable, timeout
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-profile-")

    def __enter__(self) -> HeadlessChromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._profile.cleanup()

    def screenshot(self, url: str, path: Path, window: str = "1500,900", budget_ms: int = 20_000) -> Path:
        """Render ``url`` in a ``window``-sized viewport and write it to ``path`` as PNG."""
        self._run([*_COMMON, "--disable-quic", "--no-first-run", "--disable-background-networking",
                   "--disable-component-update", "--disable-sync", f"--user-data-dir={self._profile.name}",
                   f"--window-size={window}", f"--virtual-time-budget={budget_ms}", f"--screenshot={path}", url],
                  text=False)
        return path

    def dump_dom(self, url: str, budget_ms: int = 10_000) -> str:
        """The page's DOM as the browser rendered it (scripts run), serialized as HTML."""
        return self._run([*_COMMON, "--no-first-run", f"--user-data-dir={self._profile.name}",
                          f"--virtual-time-budget={budget_ms}", "--dump-dom", url], text=True).stdout

    def _run(self, args: list[str], text: bool) -> subprocess.CompletedProcess:
        return subprocess.run([self.executable, *args], check=True, capture_output=True, text=text,
                              timeout=self.timeout)
