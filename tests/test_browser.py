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
            raise RuntimeError(f"streamlit exited with {proc.returncode}: {proc.stdout.read()}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"streamlit did not answer on {url} within {STARTUP_S} s")


@pytest.fixture
def planner(tmp_path):
    """(url, scenario db path) of a streamlit planner started for this test."""
    port = _free_port()
    db = tmp_path / "scenarios.db"
    env = {**os.environ, "PERFSIM_DB": str(db), "PERFSIM_PROFILES": str(tmp_path / "profiles")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/planner.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield url, db
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
            assert before.endswith(" ms")
            page.locator(".js-plotly-plot").first.wait_for(timeout=WAIT_MS)
            _wait_idle(page)
            page.screenshot(path=str(shots / "plan.png"), full_page=True)

            gbs = page.get_by_label("gbs", exact=True)
            gbs.fill("4096")
            gbs.press("Enter")
            after = _wait_metric_change(page, "Step time", before)
            assert float(after.split()[0].replace(",", "")) > float(before.split()[0].replace(",", ""))

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
