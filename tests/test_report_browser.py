"""The built report opened in a real headless browser (Debian's chromium), from file://.

On a warehouse with rows in every study view (tests/report_fixture.py) the report is built,
then every page is loaded in chromium, driven through the DevTools protocol over a pipe
(``--remote-debugging-pipe``: the browser reads commands on fd 3 and writes on fd 4, each
message JSON ended by a NUL byte; a stdlib client, no websocket).  Per page it checks: no
console error and no uncaught exception, every figure div holds a drawn plot (Plotly's
``.main-svg``), every request was to a ``file://`` URL (or a ``data:`` image Plotly makes), no script of the hostile labels ran
(``window.__xss`` undefined, no alert dialog opened) and the hostile text is on the page
as text.  A full-page screenshot of each page is saved under ``$MATRUN_TEST_ARTIFACTS`` (or
the test's temporary directory), printed at the end.

The browser gets no network: every host name resolves to nothing and every connection goes
to a dead proxy.  It is started in its own process group and only that group is killed.
Without chromium the test is skipped, unless MATRUN_REQUIRE_BROWSER=1 (CI) makes it fail.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from matrun.reports.build import build_report
from report_fixture import XSS_ATTR, XSS_HOSTNAME, XSS_SCRIPT, build_study_warehouse

CHROMIUM = os.environ.get("MATRUN_CHROMIUM", "/usr/bin/chromium")
LOAD_TIMEOUT_S = 30.0


def _chromium() -> str:
    path = shutil.which(CHROMIUM) or (CHROMIUM if os.access(CHROMIUM, os.X_OK) else None)
    if path is None:
        if os.environ.get("MATRUN_REQUIRE_BROWSER") == "1":
            pytest.fail(f"MATRUN_REQUIRE_BROWSER=1 but there is no chromium at {CHROMIUM} "
                        "(apt-get install chromium, or set MATRUN_CHROMIUM)")
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium); "
                    "set MATRUN_REQUIRE_BROWSER=1 to make this a failure")
    return path


class Browser:
    """A headless chromium driven over the DevTools pipe; ``close`` kills what it started."""

    def __init__(self, executable: str, profile: Path) -> None:
        args = [
            executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-extensions", "--disable-default-apps",
            "--mute-audio", f"--user-data-dir={profile}", "--remote-debugging-pipe",
            # No network: names resolve to nothing, connections go to a dead proxy.
            "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=socks5://127.0.0.1:9",
            "--proxy-bypass-list=<-loopback>", "--window-size=1400,1000", "about:blank",
        ]
        # The shell hands our pipes to the browser as fds 3 (commands) and 4 (replies).
        self.stderr = open(profile.parent / "chromium-stderr.log", "wb")
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", 'exec "$@" 3<&0 4>&1 </dev/null >/dev/null', "sh", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
            start_new_session=True,
        )
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    # -- the protocol ----------------------------------------------------------------------

    def _receive(self, deadline: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while b"\0" not in self._buffer:
            wait = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, wait))
            if not ready:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise EOFError("chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             session: str | None = None, timeout: float = LOAD_TIMEOUT_S) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile are kept."""
        assert self.proc.stdin is not None
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.proc.stdin.write(json.dumps(message).encode() + b"\0")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._on_event(reply)

    def _on_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if event.get("method") == "Page.javascriptDialogOpening":
            # An alert() means a script of the data ran: record it (above) and dismiss it so
            # the page is not blocked.
            self._next_id += 1
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({
                "id": self._next_id, "method": "Page.handleJavaScriptDialog",
                "params": {"accept": True}, "sessionId": event.get("sessionId")}).encode() + b"\0")
            self.proc.stdin.flush()

    def wait_for(self, method: str, session: str, timeout: float = LOAD_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method and e.get("sessionId") == session for e in self.events):
            self._on_event(self._receive(deadline))

    # -- a page ----------------------------------------------------------------------------

    def open_page(self) -> str:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=session)
        return session

    def load(self, session: str, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", {"url": url}, session=session)
        self.wait_for("Page.loadEventFired", session)

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session=session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, session: str, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                         session=session)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        """Close the browser; kill its process group (only what this test started) if need be."""
        try:
            if self.proc.poll() is None:
                try:
                    self.call("Browser.close", timeout=5)
                except (OSError, TimeoutError, EOFError, RuntimeError):
                    pass
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the group is ours: start_new_session
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait(timeout=10)
            self.stderr.close()


# What each page must show once loaded: how many figures are drawn, by the .main-svg Plotly
# puts into each figure div.
FIGURE_CHECK = """
(async () => {
  const divs = Array.from(document.querySelectorAll('div.figure'));
  for (let i = 0; i < 100; i++) {
    if (divs.every(d => d.querySelector('.main-svg'))) break;
    await new Promise(r => setTimeout(r, 50));
  }
  return {
    figures: divs.map(d => d.id),
    drawn: divs.filter(d => d.querySelector('.main-svg')).map(d => d.id),
    traces: divs.map(d => (d.data || []).length),
    xss: typeof window.__xss,
    plotly: typeof window.Plotly,
    text: document.body.innerText,
    images: document.querySelectorAll('img').length,
    inlineHandlers: Array.from(document.querySelectorAll('*')).filter(
        e => Array.from(e.attributes).some(a => a.name.startsWith('on'))).length,
  };
})()
"""


def _problems(events: list[dict[str, Any]]) -> list[str]:
    """Console errors, uncaught exceptions, error log entries and alert dialogs."""
    out = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                               for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            out.append("exception: " + json.dumps(params.get("exceptionDetails"))[:500])
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            out.append("log: " + params["entry"].get("text", ""))
        elif method == "Page.javascriptDialogOpening":
            out.append("dialog: " + params.get("message", ""))
    return out


@pytest.fixture(scope="module")
def study_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    warehouse = build_study_warehouse(root)
    return build_report(warehouse=warehouse, out_dir=root / "site").parent


def test_every_page_renders_in_a_real_browser(study_site: Path, tmp_path: Path) -> None:
    executable = _chromium()
    artifacts = Path(os.environ.get("MATRUN_TEST_ARTIFACTS") or tmp_path / "artifacts")
    artifacts.mkdir(parents=True, exist_ok=True)
    pages = sorted(p.name for p in study_site.glob("*.html"))
    assert len(pages) == 15, pages  # index + every section: the fixture has data for all
    profile = tmp_path / "profile"
    profile.mkdir()
    browser = Browser(executable, profile)
    seen: dict[str, dict[str, Any]] = {}
    try:
        session = browser.open_page()
        for name in pages:
            browser.load(session, (study_site / name).as_uri())
            state = browser.evaluate(session, FIGURE_CHECK)
            requests = [e["params"]["request"]["url"] for e in browser.events
                        if e.get("method") == "Network.requestWillBeSent"]
            problems = _problems(browser.events)
            browser.screenshot(session, artifacts / f"{name.removesuffix('.html')}.png")
            seen[name] = {**state, "requests": requests, "problems": problems}
    finally:
        browser.close()
    print(f"\nscreenshots of the report pages: {artifacts}")

    for name, state in seen.items():
        assert not state["problems"], (name, state["problems"])
        assert state["plotly"] == "object", name
        assert state["drawn"] == state["figures"], (name, state["figures"], state["drawn"])
        assert all(n > 0 for n in state["traces"]) or name == "index.html", (name, state["traces"])
        assert state["xss"] == "undefined", name  # no hostile script or handler ran
        assert state["images"] == 0 and state["inlineHandlers"] == 0, name
        # Pages and assets from disk; Plotly draws heatmaps through data: images.
        assert state["requests"] and all(u.startswith(("file://", "data:image/")) for u in state["requests"]), (
            name, [u[:80] for u in state["requests"]])
    assert seen["index.html"]["figures"] == []
    figures = {name: len(state["figures"]) for name, state in seen.items()}
    assert all(n >= 1 for name, n in figures.items() if name not in ("index.html", "provenance.html"))
    # The hostile labels are on the pages, as text
    assert XSS_SCRIPT in seen["baseline.html"]["text"]
    assert XSS_ATTR in seen["baseline.html"]["text"]  # the optimizer column
    assert XSS_HOSTNAME in seen["provenance.html"]["text"]
    assert XSS_SCRIPT in seen["runs.html"]["text"]  # the error tail
    for name in pages:
        assert (artifacts / f"{name.removesuffix('.html')}.png").stat().st_size > 10_000, name


def test_the_browser_sees_the_hostile_label_in_a_figure_as_text(study_site: Path, tmp_path: Path) -> None:
    """Plotly draws the hostile model name as SVG text, not as markup."""
    executable = _chromium()
    profile = tmp_path / "profile"
    profile.mkdir()
    browser = Browser(executable, profile)
    try:
        session = browser.open_page()
        browser.load(session, (study_site / "threads.html").as_uri())
        browser.evaluate(session, FIGURE_CHECK)
        legend = browser.evaluate(session, """
            Array.from(document.querySelectorAll('#fig-threads .legendtext'))
                 .map(t => t.textContent).join('\\n')""")
        injected = browser.evaluate(session, """
            document.querySelectorAll('#fig-threads script, #fig-threads img, '
                                      + '#fig-threads foreignObject').length""")
        xss = browser.evaluate(session, "typeof window.__xss")
        problems = _problems(browser.events)
    finally:
        browser.close()
    assert not problems, problems
    assert "<script>alert(1)</script>" in legend
    assert injected == 0 and xss == "undefined"
