"""The planner in a real browser: Debian chromium driven by Playwright against
`streamlit run app/planner.py` on 127.0.0.1 (started and stopped by the test).

Loads the Plan page on the default (ZAYA1-base, 128 x 8 MI300X), changes a knob and sees
the step time change, saves a scenario (checked in the SQLite file), opens the Timeline
and takes screenshots. PERFSIM_SCREENSHOT_DIR=docs writes docs/plan.png and
docs/timeline.png (the README's pictures); otherwise they go to the test's tmp folder.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
STARTUP_S = 45
WAIT_MS = 30_000

pytestmark = pytest.mark.browser


def _playwright():
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip(f"chromium not installed ({CHROMIUM} missing; apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright (python) not installed; pip install -e '.[dev]'")
    return sync_playwright


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}: {proc.log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"streamlit did not answer on {url} within {STARTUP_S} s")


@pytest.fixture
def planner(planner_proc, tmp_path):
    """(url, scenario db path) of a streamlit planner started for this test."""
    url, _ = planner_proc
    return url, tmp_path / "scenarios.db"


@pytest.fixture
def planner_proc(tmp_path):
    """(url, server process) of a streamlit planner started for this test."""
    port = _free_port()
    db = tmp_path / "scenarios.db"
    env = {**os.environ, "PERFSIM_DB": str(db), "PERFSIM_PROFILES": str(tmp_path / "profiles")}
    log = open(tmp_path / "streamlit.log", "w")  # a file, not a pipe nobody drains (a full pipe blocks the server)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/planner.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
    )
    proc.log_path = tmp_path / "streamlit.log"
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


UNITS_S = {"µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


def _seconds(shown: str) -> float:
    """A planner duration ('445 ms', '1.02 s') in seconds."""
    value, unit = shown.split()
    return float(value.replace(",", "")) * UNITS_S[unit]


def _truncated_metrics(page) -> list[str]:
    """Metric values the browser had to cut (their text is wider than their box)."""
    return page.evaluate("""() => [...document.querySelectorAll('[data-testid="stMetricValue"]')]
        .filter(e => { const t = e.querySelector('div') || e; return t.scrollWidth > t.clientWidth + 1; })
        .map(e => e.innerText)""")


def _metric(page, label: str) -> str:
    metric = page.get_by_test_id("stMetric").filter(has_text=label)
    return metric.get_by_test_id("stMetricValue").inner_text(timeout=WAIT_MS)


def _wait_metric_change(page, label: str, old: str) -> str:
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        value = _metric(page, label)
        if value != old:
            return value
        page.wait_for_timeout(200)
    raise AssertionError(f"{label} stayed {old!r}")


def _wait_idle(page) -> None:
    """Until the app is not running a script (no 'Running...' status widget)."""
    page.wait_for_timeout(300)
    page.get_by_test_id("stStatusWidget").wait_for(state="detached", timeout=WAIT_MS)


def test_planner_in_chromium(planner, tmp_path):
    sync_playwright = _playwright()
    url, db = planner
    shots = Path(os.environ.get("PERFSIM_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1250})
            page.goto(url, wait_until="domcontentloaded")
            before = _metric(page, "Step time")
            assert _seconds(before) > 0
            page.locator(".js-plotly-plot").first.wait_for(timeout=WAIT_MS)
            _wait_idle(page)
            page.screenshot(path=str(shots / "plan.png"), full_page=True)
            assert _truncated_metrics(page) == []  # issue 17.9: no "18.2 M to…"

            gbs = page.get_by_label("gbs", exact=True)
            gbs.fill("4096")
            gbs.press("Enter")
            after = _wait_metric_change(page, "Step time", before)
            assert _seconds(after) > _seconds(before)

            page.get_by_label("Scenario name").fill("browser test")
            page.get_by_role("button", name="Save scenario").click()
            page.get_by_text("Saved scenario 'browser test'").wait_for(timeout=WAIT_MS)

            page.get_by_role("link", name="Timeline").click()
            page.get_by_text("ops simulated").wait_for(timeout=WAIT_MS)
            page.locator(".js-plotly-plot").first.wait_for(timeout=WAIT_MS)
            assert "gbs=4096" in page.get_by_text("change it on the Plan page").inner_text()
            _wait_idle(page)
            page.screenshot(path=str(shots / "timeline.png"), full_page=True)
        finally:
            browser.close()
    sys.path.insert(0, str(ROOT / "app"))
    from scenarios import ScenarioStore

    saved = ScenarioStore(db).get("browser test")
    assert saved.inputs["knobs"]["gbs"] == 4096 and saved.results["step_time_s"] > 0
    assert (shots / "plan.png").stat().st_size > 10_000 and (shots / "timeline.png").stat().st_size > 10_000


def _spawned_workers(server_pid: int) -> list:
    """Multiprocessing workers still alive under the streamlit server."""
    import psutil

    kids = psutil.Process(server_pid).children(recursive=True)
    return [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE
            and "spawn_main" in " ".join(k.cmdline())]


def _run_search(page, gbs: str) -> float:
    """Set gbs, click Run search, wait for the ranked table; seconds it took."""
    field = page.get_by_label("gbs", exact=True)
    field.fill(gbs)
    field.press("Enter")
    _wait_idle(page)
    start = time.monotonic()
    page.get_by_role("button", name="Run search").click()
    page.get_by_text("ranked plans").wait_for(timeout=SEARCH_WAIT_MS)
    page.get_by_test_id("stDataFrame").first.wait_for(timeout=WAIT_MS)
    return time.monotonic() - start


SEARCH_WAIT_MS = 180_000


def test_search_page_finishes_twice_and_leaves_no_worker(planner_proc):
    """Issue 17.2: the first search hung at 'confirm: 3/3' on a forked pool that ignored SIGTERM.
    On the default spawn pool both searches finish, the summary names the executor, and no
    worker process outlives a search. Also checks escaped Markdown renders as typed (17.7)."""
    sync_playwright = _playwright()
    url, proc = planner_proc
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1250})
            page.goto(f"{url}/search", wait_until="domcontentloaded")
            gpus = page.get_by_label("GPUs", exact=True)
            gpus.fill("8")
            gpus.press("Enter")
            _wait_idle(page)
            page.get_by_text("Constraints and execution").click()
            confirm = page.get_by_label("Confirm the best N with the engine")
            confirm.fill("1")
            confirm.press("Enter")
            _wait_idle(page)
            first = _run_search(page, "64")
            summary = page.get_by_text("plans enumerated").first.inner_text(timeout=WAIT_MS)
            assert "local-spawn" in summary and "\\" not in summary  # escaped Markdown renders as typed
            _wait_idle(page)
            assert _no_workers_within(proc.pid, 10)
            second = _run_search(page, "128")
            _wait_idle(page)
            assert _no_workers_within(proc.pid, 10)
            assert first < SEARCH_WAIT_MS / 1000 and second < SEARCH_WAIT_MS / 1000

            page.goto(url, wait_until="domcontentloaded")
            _metric(page, "Step time")
            tp = page.get_by_label("tp", exact=True)
            tp.fill("3")
            tp.press("Enter")
            page.get_by_text("tp*pp*cp*dp = 3*1*1*1024", exact=False).wait_for(timeout=WAIT_MS)
        finally:
            browser.close()


def _no_workers_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _spawned_workers(pid):
            return True
        time.sleep(0.5)
    return False


PAGES = ("", "timeline", "fabric", "search", "calibrate", "compare", "sizing", "moe_width", "goodput")


def test_every_page_renders_without_an_error_in_chromium(planner_proc):
    """A fresh-clone walk (issue 17, "Done when"): every page opens on its defaults with no
    exception, no error box and no truncated metric; the Calibrate page lists the shipped
    example logs and the Fabric page overlays the shipped measured points (17.3)."""
    sync_playwright = _playwright()
    url, _ = planner_proc
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1250})
            for name in PAGES:
                page.goto(f"{url}/{name}", wait_until="domcontentloaded")
                page.get_by_test_id("stMainBlockContainer").wait_for(timeout=WAIT_MS)
                page.wait_for_timeout(500)
                _wait_idle(page)
                assert page.get_by_test_id("stException").count() == 0, name
                errors = page.get_by_test_id("stAlertContentError").all_inner_texts()
                assert not errors, (name, errors)
                assert _truncated_metrics(page) == [], name
                if name == "calibrate":
                    page.get_by_text("...or shipped example logs").wait_for(timeout=WAIT_MS)
                    page.get_by_text("Upload rccl-tests logs").wait_for(timeout=WAIT_MS)
                if name == "fabric":
                    assert "No measured points" not in page.inner_text("body")
                    page.get_by_text("measured)").first.wait_for(timeout=WAIT_MS)  # legend of the shipped series
        finally:
            browser.close()
