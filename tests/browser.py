"""A headless Chromium driven through chromedriver's W3C WebDriver protocol, with
nothing but the standard library (plain HTTP and JSON): open a page, run a script in
it, wait for a condition, take a screenshot.

Debian's ``chromium`` and ``chromium-driver`` packages provide the browser and the
driver (``scripts/ensure_chromium.sh`` installs them); ``BrowserMissing`` names
what is missing, and the tests fail with it rather than skip.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

#: the flags every launch uses (headless, no sandbox as root, nothing fetched)
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking"]


class BrowserMissing(RuntimeError):
    pass


def find_chromium() -> tuple[str, str]:
    """The paths of Chromium and chromedriver; ``BrowserMissing`` names what is missing."""
    browser = os.environ.get("SPARKFILL_CHROMIUM") or next(
        (p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)
    driver = os.environ.get("SPARKFILL_CHROMEDRIVER") or shutil.which("chromedriver")
    missing = [what for what, path in (("chromium (Debian package 'chromium')", browser),
                                       ("chromedriver (Debian package 'chromium-driver')",
                                        driver)) if path is None]
    if missing:
        raise BrowserMissing(
            f"the browser tests need {' and '.join(missing)} on PATH: run "
            "scripts/ensure_chromium.sh (or apt-get install chromium chromium-driver)")
    assert browser is not None and driver is not None
    return browser, driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Browser:
    """One headless Chromium session."""

    def __init__(self, width: int = 1280, height: int = 1400) -> None:
        browser, driver = find_chromium()
        port = _free_port()
        self._driver = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        self._base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 30
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except (OSError, urllib.error.URLError):
                pass
            if time.time() > deadline or self._driver.poll() is not None:
                self._driver.kill()
                raise BrowserMissing(f"chromedriver ({driver}) did not start")
            time.sleep(0.1)
        caps = {"browserName": "chrome", "goog:chromeOptions": {
            "binary": browser, "args": [*FLAGS, f"--window-size={width},{height}"]}}
        try:
            session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
        except Exception:
            self._driver.kill()
            raise
        self._session = f"/session/{session['sessionId']}"

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self._base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"WebDriver {method} {path}: {exc.read().decode()[:2000]}") \
                from None

    def get(self, url: str) -> None:
        self._call("POST", f"{self._session}/url", {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        """The value of ``script`` (a function body: ``return ...``) in the page."""
        return self._call("POST", f"{self._session}/execute/sync",
                          {"script": script, "args": list(args)})

    def wait_for(self, script: str, timeout: float, what: str) -> Any:
        """Poll ``script`` until it returns a truthy value; fail naming ``what``."""
        deadline = time.time() + timeout
        while True:
            value = self.run(script)
            if value:
                return value
            if time.time() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.2)

    def screenshot(self, path: Path) -> Path:
        png = base64.b64decode(self._call("GET", f"{self._session}/screenshot"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        return path

    def quit(self) -> None:
        try:
            self._call("DELETE", self._session)
        except Exception:  # noqa: BLE001 - the driver goes either way
            pass
        self._driver.terminate()
        try:
            self._driver.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._driver.kill()
