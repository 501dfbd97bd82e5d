"""Headless Chromium for page tests (Debian's ``chromium``; ``.ci/run`` installs it).

Run as root with a fresh profile and no background networking: this machine's closed network
refuses Chromium's own connections, and the flags keep it from trying.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--mute-audio",
]


@pytest.fixture(scope="module")
def chromium():
    if not os.path.exists(CHROMIUM):
        reason = f"{CHROMIUM} is absent: install it with `apt-get install -y chromium`"
        if os.environ.get("CI"):
            pytest.fail(f"the browser test must run in CI, but {reason}")
        pytest.skip(reason)
    return CHROMIUM


def kill(proc: subprocess.Popen) -> None:
    """Kill the browser and its helpers: they share the session started for them."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)


def render(binary: str, url: str, profile: Path, *, screenshot: Path | None = None, window: str = "1600,1000",
           budget_ms: int = 20_000, timeout_s: float = 120) -> str:
    """The DOM of ``url`` after ``budget_ms`` of virtual time (a React app has rendered by then),
    and a screenshot of the window when asked. One fresh browser per call."""
    shot = [f"--screenshot={screenshot}"] if screenshot is not None else []
    proc = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={window}",
         f"--virtual-time-budget={budget_ms}", "--dump-dom", *shot, url],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        dom, _ = proc.communicate(timeout=timeout_s)
    finally:
        kill(proc)
    return dom.decode(errors="replace")


class DevTools:
    """Chrome DevTools protocol over ``--remote-debugging-pipe``: fd 3 in, fd 4 out, messages
    separated by NUL. No port is opened, and no websocket library is needed."""

    def __init__(self, binary: str, args: list[str]):
        to_chrome_r, self._out = os.pipe()
        self._in, from_chrome_w = os.pipe()
        # Move the child's ends above 9 so that bash can put them on fds 3 and 4 without clobbering.
        hi_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 100)
        hi_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 100)
        os.close(to_chrome_r), os.close(from_chrome_w)
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", f'exec "$0" "$@" 3<&{hi_r} 4>&{hi_w}', binary, *args, "--remote-debugging-pipe"],
            pass_fds=(hi_r, hi_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        os.close(hi_r), os.close(hi_w)
        self._buf, self._id = b"", 0

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 15) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" not in self._buf:
                ready, _, _ = select.select([self._in], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise TimeoutError(f"chromium did not answer {method} in {timeout} s")
                data = os.read(self._in, 1 << 16)
                if not data:
                    raise EOFError(f"chromium closed the pipe during {method}")
                self._buf += data
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str, session: str):
        out = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        assert "exceptionDetails" not in out, out["exceptionDetails"]
        return out["result"].get("value")

    def close(self) -> None:
        try:
            os.close(self._out), os.close(self._in)
        finally:
            kill(self.proc)


