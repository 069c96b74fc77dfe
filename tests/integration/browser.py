"""A headless Chromium driven over the DevTools protocol (Debian's ``chromium`` package)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


# Every element of the page, shadow roots included (Bokeh draws its widgets inside them, where
# document.querySelectorAll does not look).
DEEP_ELEMENTS = """(() => {
    const out = [];
    const walk = (root) => {
        for (const el of root.querySelectorAll("*")) {
            out.push(el);
            if (el.shadowRoot) walk(el.shadowRoot);
        }
    };
    walk(document);
    return out;
})()"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Chromium:
    def __init__(self, width: int = 1400, height: int = 1700):
        import websocket

        self.port = free_port()
        self.profile = tempfile.TemporaryDirectory(ignore_cleanup_errors=True)
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", "--disable-quic", f"--user-data-dir={self.profile.name}",
             f"--remote-debugging-port={self.port}", "--remote-allow-origins=*",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json") as r:
                    targets = json.load(r)
                page = next(t for t in targets if t["type"] == "page")
                break
            except Exception:
                if time.time() > deadline:
                    raise RuntimeError("chromium did not start")
                time.sleep(0.2)
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.ids = 0

    def call(self, method: str, **params):
        self.ids += 1
        self.ws.send(json.dumps({"id": self.ids, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.ids:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg.get("result", {})

    def goto(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, every: float = 0.5):
        """The first truthy value of ``expression``; the last value if none came in time."""
        deadline = time.time() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.time() > deadline:
                return value
            time.sleep(every)

    def screenshot(self, path) -> None:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data["data"]))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            # the renderer and zygote processes outlive the browser process and go on writing
            # to the profile: end the whole group before removing it
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.profile.cleanup()
