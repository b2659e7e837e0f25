"""Headless Chromium for tests, driven over the DevTools protocol (``websocket-client``).

A :class:`Browser` starts ``/usr/bin/chromium`` (Debian's package, installed by ``.ci/run``)
with a fresh profile and no network services, opens pages, collects every console message,
uncaught exception and failed resource load, evaluates JavaScript in the page (to inspect the
DOM) and takes full-page screenshots, in the light or the dark colour scheme.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("ZARR_SKIP_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


def missing() -> str | None:
    """Why no browser test can run here, or ``None``."""
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; .ci/run installs it as root)"
    try:
        import websocket  # noqa: F401
    except ImportError:
        return "websocket-client is not installed (pip install -e '.[test]')"
    return None


class Browser:
    """One headless Chromium and one page in it; use as a context manager."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self._id = 0

    def __enter__(self) -> Browser:
        import websocket

        self._profile = tempfile.mkdtemp(prefix="zs-chromium-")
        self._log = open(Path(self._profile) / "chromium.log", "w")  # noqa: SIM115 - closed in __exit__
        self._proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        port = self._port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=self.timeout) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        self._ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=self.timeout)
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        return self

    def _port(self) -> int:
        """The DevTools port Chromium chose: the first line of ``DevToolsActivePort`` in its profile."""
        active = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline and self._proc.poll() is None:
            lines = active.read_text().splitlines() if active.exists() else []
            if len(lines) >= 2:
                return int(lines[0])
            time.sleep(0.05)
        log = (Path(self._profile) / "chromium.log").read_text(errors="replace")
        raise RuntimeError(f"chromium did not start its DevTools server (exit {self._proc.poll()}):\n{log[-3000:]}")

    def __exit__(self, *exc: object) -> None:
        try:
            self._ws.close()
        finally:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._log.close()
            shutil.rmtree(self._profile, ignore_errors=True)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its result (events on the way are kept)."""
        self._id += 1
        self._ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for e in self.events:
                if e["method"] == method:
                    self.events.remove(e)
                    return e
            msg = json.loads(self._ws.recv())
            if "method" in msg:
                self.events.append(msg)
        raise TimeoutError(method)

    def open(
        self, path: Path, *, dark: bool = False, width: int = 1280, height: int = 900, scripts: bool = True
    ) -> None:
        """Load ``path`` in the given colour scheme (with JavaScript off unless ``scripts``) and
        wait for its load event."""
        self.events.clear()
        self.call("Emulation.setScriptExecutionDisabled", value=not scripts)
        scheme = "dark" if dark else "light"
        self.call("Emulation.setEmulatedMedia", features=[{"name": "prefers-color-scheme", "value": scheme}])
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", url=path.resolve().as_uri())
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (beyond the viewport)."""
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def problems(self) -> list[str]:
        """Console messages, uncaught exceptions and log errors (failed loads) seen so far."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled":
                out.append(f"console.{p.get('type')}: " + " ".join(str(a.get("value")) for a in p.get("args", [])))
            elif e["method"] == "Runtime.exceptionThrown":
                out.append(f"exception: {p.get('exceptionDetails', {}).get('exception', {}).get('description')}")
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                out.append(f"log {p['entry'].get('level')}: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out
