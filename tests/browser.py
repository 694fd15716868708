"""Drive headless Chromium through the DevTools protocol over a pipe, with the standard library only.

    with Chromium() as browser:
        page = browser.open(Path("report.html"), width=1400, height=2000)
        page.evaluate("document.title")
        png = page.screenshot(height=2400)
        page.errors        # uncaught exceptions, console.error/assert, error log entries
        page.requests      # every URL the page asked for (file: and data: only, for a page with no network)

`--remote-debugging-pipe` makes Chromium read commands on fd 3 and write answers on fd 4,
each one JSON message ended by a NUL byte. Used by tests/test_report.py (marked `browser`);
`CHROMIUM` is Debian's binary, which those tests need (skipped without it).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--disable-extensions", "--mute-audio", "--remote-debugging-pipe"]


class DevToolsError(RuntimeError):
    pass


class Chromium:
    def __init__(self, binary: Path = CHROMIUM, timeout_s: float = 60.0):
        self.binary, self.timeout_s = binary, timeout_s
        self._next_id = 0
        self._buffer = b""
        self.events: list[dict] = []

    def __enter__(self) -> "Chromium":
        self._profile = tempfile.TemporaryDirectory(prefix="mc-chromium-")
        cmd_r, self._cmd_w = os.pipe()       # we write commands; Chromium reads them on fd 3
        self._resp_r, resp_w = os.pipe()     # Chromium writes answers on fd 4

        def child_fds() -> None:             # runs in the child before exec: place the pipe ends
            # through fds above 9 first: a pipe end may already be 3 or 4, and dup2 onto itself
            # would leave it close-on-exec
            high_r, high_w = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(resp_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        # stderr to a file: Chromium's chatter (D-Bus, GPU) must never fill a pipe nobody reads
        self._log = open(Path(self._profile.name) / "stderr.txt", "w+b")
        self._proc = subprocess.Popen([str(self.binary), *FLAGS, f"--user-data-dir={self._profile.name}/profile",
                                       "about:blank"], preexec_fn=child_fds, close_fds=False,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log)
        os.close(cmd_r)
        os.close(resp_w)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._proc.poll() is None:
                self.send("Browser.close")
        except (DevToolsError, OSError):
            pass
        finally:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()            # our own child, by its handle
                self._proc.wait()
            self._log.close()
            os.close(self._cmd_w)
            os.close(self._resp_r)
            self._profile.cleanup()

    # ------------------------------------------------------------------ the protocol
    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DevToolsError("no answer from Chromium in time")
            ready, _, _ = select.select([self._resp_r], [], [], left)
            if ready:
                chunk = os.read(self._resp_r, 1 << 20)
                if not chunk:
                    self._log.seek(0)
                    err = self._log.read().decode(errors="replace")[-2000:]
                    raise DevToolsError(f"Chromium closed the pipe (exit {self._proc.poll()}): {err}")
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str) -> dict:
        deadline = time.monotonic() + self.timeout_s
        seen = 0
        while True:
            for e in self.events[seen:]:
                if e.get("method") == method and e.get("sessionId") == session:
                    return e
            seen = len(self.events)
            self.events.append(self._read_message(deadline))

    def open(self, path: Path, width: int, height: int) -> "Page":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        self.send("Page.navigate", {"url": path.resolve().as_uri()}, session)
        self.wait_event("Page.loadEventFired", session)
        return Page(self, session, width)


class Page:
    def __init__(self, browser: Chromium, session: str, width: int):
        self.browser, self.session, self.width = browser, session, width

    def evaluate(self, expression: str) -> Any:
        result = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                   self.session)
        if "exceptionDetails" in result:
            raise DevToolsError(f"script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, height: int) -> bytes:
        clip = {"x": 0, "y": 0, "width": self.width, "height": height, "scale": 1}
        data = self.browser.send("Page.captureScreenshot",
                                 {"format": "png", "clip": clip, "captureBeyondViewport": True}, self.session)
        return base64.b64decode(data["data"])

    def _mine(self, method: str) -> list[dict]:
        return [e["params"] for e in self.browser.events if e.get("method") == method
                and e.get("sessionId") == self.session]

    @property
    def errors(self) -> list[str]:
        out = [f"exception: {e['exceptionDetails'].get('text')} {e['exceptionDetails'].get('exception', {})}"
               for e in self._mine("Runtime.exceptionThrown")]
        out += [f"console.{e['type']}: {[a.get('value', a.get('description')) for a in e.get('args', [])]}"
                for e in self._mine("Runtime.consoleAPICalled") if e["type"] in ("error", "assert")]
        out += [f"log {e['entry'].get('source')}: {e['entry'].get('text')} {e['entry'].get('url', '')}"
                for e in self._mine("Log.entryAdded") if e["entry"].get("level") == "error"]
        out += [f"request failed: {e.get('errorText')}" for e in self._mine("Network.loadingFailed")]
        return out

    @property
    def requests(self) -> list[str]:
        return [e["request"]["url"] for e in self._mine("Network.requestWillBeSent")]
