"""Open an HTML file in headless Chromium, collect script errors, save a screenshot.

Talks the DevTools protocol over ``--remote-debugging-pipe`` (NUL-separated JSON on fds 3/4), so
no websocket client and no network port are needed. Host names do not resolve (the page must load
offline); a request that fails shows up as an error.

    errors = render("report/pareto.html", "shot.png")   # [] when the page ran cleanly
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
WINDOW = (1400, 2000)  # CSS pixels of the viewport and of the screenshot


def chromium_path() -> str | None:
    """The first Chromium binary found, or None."""
    for p in CHROMIUM_CANDIDATES:
        if os.access(p, os.X_OK):
            return p
    return shutil.which("chromium")


class BrowserError(RuntimeError):
    """Chromium could not be started or stopped answering."""


class _Pipe:
    """DevTools protocol over the two pipes: send commands, collect events until a reply."""

    def __init__(self, write_fd: int, read_fd: int, deadline: float):
        self.write_fd, self.read_fd, self.deadline = write_fd, read_fd, deadline
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def _read_message(self) -> dict:
        while b"\0" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                raise BrowserError("timed out waiting for Chromium")
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise BrowserError("Chromium closed the DevTools pipe")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self.write_fd, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str) -> dict:
        for i, ev in enumerate(self.events):
            if ev["method"] == method:
                return self.events.pop(i)
        while True:
            ev = self._read_message()
            if ev.get("method") == method:
                return ev
            if "method" in ev:
                self.events.append(ev)


def _errors(events: list[dict]) -> list[str]:
    """Uncaught exceptions, console.error/assert calls and error log entries (failed loads)."""
    out = []
    for ev in events:
        p = ev.get("params", {})
        if ev["method"] == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append("Uncaught " + (d.get("exception", {}).get("description") or d.get("text", "")))
        elif ev["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console.error: "
                       + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif ev["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            out.append(f"{e.get('source')}: {e.get('text')} {e.get('url', '')}".strip())
    return out


def _launch(binary: str, profile: str) -> tuple[subprocess.Popen, int, int]:
    to_browser_r, to_browser_w = os.pipe()  # close-on-exec: only the dup2 copies at 3/4 survive exec
    from_browser_r, from_browser_w = os.pipe()
    args = [
        binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
        f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--remote-debugging-pipe", "about:blank",
    ]
    # Chromium reads commands from fd 3 and writes replies to fd 4.
    preexec = _dup_fds(to_browser_r, from_browser_w)
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            close_fds=False, preexec_fn=preexec, start_new_session=True)
    os.close(to_browser_r)
    os.close(from_browser_w)
    return proc, to_browser_w, from_browser_r


def _dup_fds(read_end: int, write_end: int):
    def setup():  # runs in the child before exec; close_fds=False so 3 and 4 are kept
        r = fcntl.fcntl(read_end, fcntl.F_DUPFD, 10)  # move above 4 first: the ends may sit at 3/4
        w = fcntl.fcntl(write_end, fcntl.F_DUPFD, 10)
        os.dup2(r, 3)
        os.dup2(w, 4)
    return setup


def _stop(proc: subprocess.Popen) -> None:
    """End the browser we started and its helpers: they share its own process group."""
    for sig in (15, 9):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return  # the group is gone
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            continue
        time.sleep(0.2)  # helpers exit right after the browser; the SIGKILL pass catches stragglers


def render(html_path, png_path, timeout: float = 60, settle_s: float = 0.5) -> list[str]:
    """Load ``html_path`` (a local file) in headless Chromium; write a full-window PNG screenshot to
    ``png_path``; return the script errors seen (uncaught exceptions, console.error, failed loads).
    Raises BrowserError when Chromium is missing, fails to start or exceeds ``timeout`` seconds."""
    binary = chromium_path()
    if binary is None:
        raise BrowserError(f"no Chromium found (looked for {', '.join(CHROMIUM_CANDIDATES)})")
    url = Path(html_path).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="qs-chromium-") as profile:
        proc, wfd, rfd = _launch(binary, profile)
        try:
            pipe = _Pipe(wfd, rfd, time.monotonic() + timeout)
            target = pipe.call("Target.createTarget", url="about:blank")["targetId"]
            session = pipe.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                pipe.call(f"{domain}.enable", session)
            pipe.call("Emulation.setDeviceMetricsOverride", session, width=WINDOW[0], height=WINDOW[1],
                      deviceScaleFactor=1, mobile=False)
            pipe.call("Page.navigate", session, url=url)
            pipe.wait_event("Page.loadEventFired")
            time.sleep(settle_s)  # let plotly finish its first layout/paint
            pipe.call("Runtime.evaluate", session, expression="1", awaitPromise=False)  # drain pending events
            shot = pipe.call("Page.captureScreenshot", session, format="png")
            Path(png_path).write_bytes(base64.b64decode(shot["data"]))
            try:
                pipe.call("Browser.close")
            except BrowserError:
                pass
            return _errors(pipe.events)
        finally:
            os.close(wfd)
            os.close(rfd)
            _stop(proc)
