"""Headless Chromium for the tests of pages served by Airflow: a screenshot (PNG) and the DOM
after the page's scripts ran, from one throwaway browser profile.

    with HeadlessChromium() as browser:
        browser.screenshot(f"{server.base_url}/plugin/pipelines", tmp_path / "page.png")
        dom = browser.dump_dom(f"{server.base_url}/pipeline-lib/")

Each call is one ``chromium --headless`` process, run to its end (``--virtual-time-budget`` lets
the page's scripts and requests finish first). This module holds no project-specific logic.
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_COMMON = ["--headless", "--no-sandbox", "--disable-gpu"]
_ON_FDS_3_AND_4 = (
    "import fcntl, os, sys; r, w = (fcntl.fcntl(int(fd), fcntl.F_DUPFD, 10) for fd in sys.argv[1:3]); "
    "os.dup2(r, 3); os.dup2(w, 4); os.execvp(sys.argv[3], sys.argv[3:])"
)


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
        self._run(
            [
                *_COMMON,
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={self._profile.name}",
                f"--window-size={window}",
                f"--virtual-time-budget={budget_ms}",
                f"--screenshot={path}",
                url,
            ],
            text=False,
        )
        return path

    def dump_dom(self, url: str, budget_ms: int = 10_000) -> str:
        """The page's DOM as the browser rendered it (scripts run), serialized as HTML."""
        return self._run(
            [
                *_COMMON,
                "--no-first-run",
                f"--user-data-dir={self._profile.name}",
                f"--virtual-time-budget={budget_ms}",
                "--dump-dom",
                url,
            ],
            text=True,
        ).stdout

    def page(self, url: str, window: str = "1500,900") -> DevToolsPage:
        """A page at ``url`` to click and type in (see DevToolsPage); close it, or use ``with``."""
        return DevToolsPage(self.executable, self._profile.name, url, window, self.timeout)

    def _run(self, args: list[str], text: bool) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.executable, *args], check=True, capture_output=True, text=text, timeout=self.timeout
        )


class DevToolsPage:
    """One page of a headless Chromium driven over the DevTools protocol (``--remote-debugging-pipe``:
    no port is opened), for tests that click and type as a user does: ``Input.dispatchMouseEvent``
    is a real click, with the user activation that sandboxes and popup blockers look at.

        with HeadlessChromium() as browser, browser.page(url) as page:
            page.wait_for("document.querySelector('iframe')", what="the iframe")
            page.click("document.querySelector('iframe').contentDocument.querySelector('a')")
            page.wait_for("location.pathname.startsWith('/dags/')", what="the DAG page")

    Expressions run in the top frame; a same-origin iframe's elements are reached through its
    ``contentDocument``. JavaScript dialogs are answered with ``dialog_answer`` and kept in
    ``dialogs``; pages opened by the page (new tabs) are kept in ``opened``; console messages in
    ``console``."""

    def __init__(self, executable: str, profile: str, url: str, window: str, timeout: float):
        self.timeout = timeout
        self.dialogs: list[str] = []
        self.dialog_answer = True
        self.opened: list[str] = []
        self.console: list[str] = []
        self._next_id = 0
        self._buffer = b""
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        width, height = (int(x) for x in window.split(","))
        # Chromium reads commands on fd 3 and writes answers on fd 4: a small Python exec-wrapper puts
        # the pipes there (a preexec_fn is unsafe in a process with threads; sh takes no fd above 9).
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _ON_FDS_3_AND_4,
                str(to_child_r),
                str(from_child_w),
                executable,
                *_COMMON,
                "--remote-debugging-pipe",
                "--no-first-run",
                "--disable-sync",
                "--disable-background-networking",
                "--disable-component-update",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(to_child_r, from_child_w),
            start_new_session=True,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        try:
            target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            self._call("Target.setDiscoverTargets", {"discover": True})
            for domain in ("Page", "Runtime"):
                self._call(f"{domain}.enable", session=self._session)
            self._call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=self._session,
            )
            self.goto(url)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> DevToolsPage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the browser (its own session and process group) and close the pipes."""
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._proc.wait(timeout=30)
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass

    # ---------------------------------------------------------------- what a test uses
    def goto(self, url: str) -> None:
        """Load ``url`` in the page and wait for its load event."""
        self._call("Page.navigate", {"url": url}, session=self._session)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'", what=f"{url} to load")

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the top frame (promises are awaited)."""
        result = self._call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=self._session,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise RuntimeError(
                f"{expression!r} threw: {details.get('exception', {}).get('description') or details.get('text')}"
            )
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None, what: str = "") -> Any:
        """Poll ``expression`` until it is truthy and return its value; a navigation in between is
        waited out. TimeoutError names ``what`` (or the expression)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.evaluate(expression)
            except RuntimeError as exc:  # e.g. the context went away with a navigation
                last = exc
            else:
                if last:
                    return last
            time.sleep(0.25)
        raise TimeoutError(f"waited {timeout or self.timeout:.0f}s for {what or expression}; last: {last!r}")

    def click(self, element: str, settle: float = 10.0) -> None:
        """A real left click in the middle of ``element`` (a JavaScript expression for an Element, also
        one inside same-origin iframes), scrolled into view first. The click waits until the element
        stands still and is the one under that point: a dialog that is still opening or re-laying out
        would otherwise take the click somewhere else, and on a loaded machine that is a lost click."""
        locate = f"""(() => {{
            const el = {element};
            if (!el) throw new Error("no element to click");
            el.scrollIntoView({{block: "center"}});
            const r = el.getClientRects()[0] || el.getBoundingClientRect();  // a wrapped link: its first line
            let x = r.left + r.width / 2, y = r.top + r.height / 2, win = el.ownerDocument.defaultView;
            const hit = el.contains(el.ownerDocument.elementFromPoint(x, y));
            while (win.frameElement) {{
                const f = win.frameElement.getBoundingClientRect();
                x += f.left + win.frameElement.clientLeft; y += f.top + win.frameElement.clientTop;
                win = win.parent;
            }}
            return [x, y, hit];
        }})()"""
        deadline = time.monotonic() + settle
        previous = None
        while True:
            x, y, hit = self.evaluate(locate)
            if (hit and previous == (x, y)) or time.monotonic() > deadline:
                break
            previous = (x, y)
            time.sleep(0.1)
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self._call(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 0 if kind == "mouseMoved" else 1},
                session=self._session,
            )

    def type_text(self, text: str) -> None:
        """Type ``text`` into the focused element, as a keyboard would insert it."""
        self._call("Input.insertText", {"text": text}, session=self._session)

    def press(self, key: str, code: str, key_code: int) -> None:
        """Press and release one key (e.g. ``"Tab", "Tab", 9``)."""
        for kind in ("keyDown", "keyUp"):
            self._call(
                "Input.dispatchKeyEvent",
                {"type": kind, "key": key, "code": code, "windowsVirtualKeyCode": key_code},
                session=self._session,
            )

    def screenshot(self, path: Path) -> Path:
        """The page as it is now, as PNG."""
        data = self._call("Page.captureScreenshot", {"format": "png"}, session=self._session)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    # ---------------------------------------------------------------- the protocol
    def _call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline, method)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)

    def _event(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Page.javascriptDialogOpening":
            self.dialogs.append(params.get("message", ""))
            message = {
                "id": 0,
                "method": "Page.handleJavaScriptDialog",
                "params": {"accept": self.dialog_answer},
                "sessionId": event.get("sessionId"),
            }
            os.write(self._to_child, json.dumps(message).encode() + b"\0")
        elif method == "Target.targetCreated":
            info = params.get("targetInfo", {})
            if info.get("type") == "page" and info.get("openerId"):
                self.opened.append(info.get("url", ""))
        elif method == "Runtime.consoleAPICalled":
            self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))

    def _read(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise TimeoutError(f"Chromium did not answer {waiting_for} in {self.timeout:.0f}s")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium exited while answering {waiting_for}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)
