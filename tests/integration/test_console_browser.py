"""The web console in a real browser (headless Chromium driven by selenium) on a real
`mtc serve`: log in with the token, watch an XID take a node through draining and repair
and back into service while its job resumes from a checkpoint; the twin's results show.

Screenshots go to the test's tmp directory; ``MTC_CONSOLE_SCREENSHOT=docs/img/console.png``
also copies the one taken mid-repair there (the README's picture, taken by hand).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.cli_support import job_body
from tests.serving import PARENT, ROOT, create_cluster, mtc_serve, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
TOKEN = "console-browser-admin"
H = {"Authorization": f"Bearer {TOKEN}"}
C = f"{PARENT}/modelDevelopmentClusters/c1"

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip("needs Debian's chromium and chromedriver (/usr/bin): "
                "scripts/install_test_tools.sh installs them", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1700", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _job(url: str) -> dict[str, Any]:
    r = requests.get(f"{url}/v1/{PARENT}/customJobs/long", headers=H, timeout=10)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]




def test_console_shows_an_xid_repaired_and_the_job_resumed(browser: Any, tmp_path: Path
                                                            ) -> None:
    started = time.monotonic()
    sim = tmp_path / "sim"
    subprocess.run([sys.executable, "-m", "services.cli.main", "sim", "run",
                    "simulator/scenarios/small.yaml", "--out", str(sim)], cwd=ROOT, check=True,
                   capture_output=True, timeout=60)
    state = tmp_path / "state"
    state.mkdir()
    with mtc_serve(state, TOKEN, extra_args=["--sim-dir", str(sim)]) as url:
        create_cluster(url, TOKEN, "c1", workers=3)
        body = job_body(500, "c1", step_time=0.04)
        body["jobSpec"]["scheduling"]["mtcPartition"] = "gpu"
        r = requests.post(f"{url}/v1/{PARENT}/customJobs", params={"customJobId": "long"},
                          json=body, headers=H, timeout=30)
        assert r.status_code == 200, r.text
        job = wait_until("a first checkpoint", lambda: (j := _job(url))["mtcProgress"].get(
            "latestCheckpoint") and j)
        victim = job["mtcProgress"]["nodes"][0]

        browser.get(f"{url}/console")
        # the page re-renders on every poll: an element found may be replaced a moment later
        wait = WebDriverWait(browser, 30, poll_frequency=0.1,
                             ignored_exceptions=(StaleElementReferenceException,))
        wait.until(lambda d: d.find_element(By.ID, "token").is_displayed())
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.ID, "login-btn").click()
        wait.until(lambda d: "token:" in d.find_element(By.ID, "who").text
                   or "admin" in d.find_element(By.ID, "who").text)
        row = "#jobs tr[data-job='long']"
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"{row}[data-state='JOB_STATE_RUNNING']"))
        cell = f"#grid .node[data-node='{victim}']"
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"{cell}[data-state='allocated']"))
        assert "c1" in browser.find_element(By.ID, "clusters").text
        browser.save_screenshot(str(tmp_path / "1-running.png"))

        r = requests.post(f"{url}/v1beta1/{C}/nodes/{victim}:reportHealth",
                          json={"xids": [79]}, headers=H, timeout=30)
        assert r.status_code == 200, r.text

        def timeline_has(text: str) -> Callable[[Any], bool]:
            return lambda d: text in d.execute_script(
                "return document.getElementById('timeline').innerText")

        seen: set[str] = set()

        def node_state(d: Any) -> str:
            state = str(d.execute_script("const e = document.querySelector(arguments[0]); "
                                         "return e ? e.dataset.state : ''", cell))
            seen.add(state)
            return state

        # the grid shows the node out of service, or (a loaded machine can let a sub-second
        # repair slip between two refreshes of the grid) the timeline already shows it draining
        wait.until(lambda d: node_state(d) not in ("allocated", "idle")
                   or timeline_has(f"node {victim}: draining")(d))
        wait.until(timeline_has(f"node {victim}: health report [agent]: XID 79"))
        wait.until(timeline_has(f"node {victim}: diagnosed gpu_fell_off_bus"))
        wait.until(timeline_has(f"node {victim}: draining, job long must checkpoint"))
        wait.until(lambda d: timeline_has(f"node {victim}: repair started: reboot")(d)
                   and node_state(d) != "")
        browser.save_screenshot(str(tmp_path / "2-repairing.png"))
        wait.until(timeline_has("job long: attempt 2 started on"))
        wait.until(timeline_has("resuming from checkpoint step"))
        wait.until(timeline_has(f"node {victim}: passed its checks, back in service"))
        wait.until(lambda d: node_state(d) in ("idle", "allocated"))
        wait.until(lambda d: d.find_elements(
            By.CSS_SELECTOR, f"{row}[data-restarts='1'][data-state='JOB_STATE_RUNNING']"))
        out_of_service = seen - {"allocated", "idle", ""}
        # the grid's out-of-service states, or the timeline the console rendered them in
        assert out_of_service & {"draining", "drained", "repairing", "verifying"} or (
            timeline_has(f"node {victim}: repair started: reboot")(browser)), seen
        cells = browser.execute_script("return [...document.querySelector(arguments[0])"
                                       ".cells].map(c => c.innerText)", row)
        assert cells[2] == "2" and cells[3] == "1", cells  # attempts, restarts
        assert all(c.endswith("%") for c in cells[7:10]), cells  # the three goodputs

        # the live timeline filters by node, and the twin's plot and table show
        browser.find_element(By.ID, "f-node").send_keys(victim)
        wait.until(lambda d: (lines := d.execute_script(
            "return [...document.querySelectorAll('#timeline li')].map(li => li.innerText)"))
            and all(victim in line for line in lines))
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#sim-view img"))
        assert browser.execute_script(
            "return document.querySelector('#sim-view img').naturalWidth") > 100
        browser.find_element(By.CSS_SELECTOR, "#sim-files li[data-path='summary.json']").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#sim-view table td"))
        browser.find_element(By.ID, "f-node").clear()
        browser.execute_script("document.getElementById('f-node').dispatchEvent("
                               "new Event('input', {bubbles: true}))")
        time.sleep(2)
        browser.save_screenshot(str(tmp_path / "3-recovered.png"))
        if target := os.environ.get("MTC_CONSOLE_SCREENSHOT"):
            shutil.copy(tmp_path / "2-repairing.png", ROOT / target)

        # a bad token is refused: the page asks for one again
        browser.execute_script("sessionStorage.setItem('mtc-console-token', 'wrong')")
        browser.refresh()
        wait.until(lambda d: d.find_element(By.ID, "login").is_displayed())
        assert "invalid" in browser.find_element(By.ID, "login-error").text.lower()
    assert time.monotonic() - started < 90
