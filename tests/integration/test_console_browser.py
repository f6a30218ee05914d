"""The web console in a real browser (headless Chromium driven by selenium) on a real
`mtc serve`: log in with the token, watch an XID take a node through draining and repair
and back into service while its job resumes from a checkpoint; the twin's results show.

The second test acts from the console: the job page (attempts, the
incident and its recovery mode, each rank's log following live), a repair the blast-radius
guard held and its release, an operator's drain and resume, a job's cancel, each with a
reason and each checked in the audit log; a viewer's drain refused (403 shown); the charts
drawn from the stored history.

Screenshots go to the test's tmp directory; ``MTC_CONSOLE_SCREENSHOT=docs/img/console.png``
also copies the one of the second test there (the README's picture, taken by hand).
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

        # a bad token is refused: the page asks for one again
        browser.execute_script("sessionStorage.setItem('mtc-console-token', 'wrong')")
        browser.refresh()
        wait.until(lambda d: d.find_element(By.ID, "login").is_displayed())
        assert "invalid" in browser.find_element(By.ID, "login-error").text.lower()
    assert time.monotonic() - started < 90


def _audit(state: Path, suffix: str) -> list[tuple[str, int, str]]:
    """(who, status, reason) of the audit records of calls on a resource ending ``suffix``,
    read from the server's own store (sqlite in WAL mode: a second reader is fine)."""
    from services.api.audit import AuditLog
    from shared.adapters.sqlite_store import SqliteDocStore

    store = SqliteDocStore(state / "mtc.db")
    try:
        return [(r["who"], r["status"], r.get("reason", "")) for r in
                AuditLog(store, 3600).read() if r["resource"].endswith(suffix)]
    finally:
        store.close()


def _login(browser: Any, wait: Any, token: str) -> None:
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    wait.until(lambda d: d.find_element(By.ID, "token").is_displayed())
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "login-btn").click()
    wait.until(lambda d: d.find_element(By.ID, "main").is_displayed())


def _act(browser: Any, wait: Any, button: str, reason: str) -> str:
    """Click an action's button, give the reason, submit; the result line."""
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, button))
    browser.execute_script("document.querySelector(arguments[0]).click()", button)
    wait.until(lambda d: d.find_element(By.ID, "action").is_displayed())
    browser.find_element(By.ID, "action-reason").send_keys(reason)
    browser.find_element(By.ID, "action-go").click()
    wait.until(lambda d: d.find_element(By.ID, "action-result").text)
    return str(browser.find_element(By.ID, "action-result").text)


def test_console_acts_with_reasons_audited_and_draws_history(browser: Any, tmp_path: Path
                                                               ) -> None:
    from services.api.security import TOKENS_FILE
    from services.api.tokens import LocalTokens

    started = time.monotonic()
    state = tmp_path / "state"
    state.mkdir()
    with mtc_serve(state, TOKEN, timeout_s=60) as url:  # a loaded machine starts it slowly
        create_cluster(url, TOKEN, "c1", workers=4)
        body = job_body(4000, "c1", step_time=0.04)
        body["jobSpec"]["scheduling"]["mtcPartition"] = "gpu"
        r = requests.post(f"{url}/v1/{PARENT}/customJobs", params={"customJobId": "long"},
                          json=body, headers=H, timeout=30)
        assert r.status_code == 200, r.text
        job = wait_until("a first checkpoint", lambda: (j := _job(url))["mtcProgress"].get(
            "latestCheckpoint") and j)
        victim = job["mtcProgress"]["nodes"][0]
        browser.get(f"{url}/console")
        wait = WebDriverWait(browser, 40, poll_frequency=0.1,
                             ignored_exceptions=(StaleElementReferenceException,))
        _login(browser, wait, TOKEN)

        # the job page: attempt 1, each rank's log following live
        link = "#jobs tr[data-job='long'] a.job-link"
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, link))
        browser.execute_script("document.querySelector(arguments[0]).click()", link)
        wait.until(lambda d: d.find_element(By.ID, "job-page").is_displayed())
        logs = "return [...document.querySelectorAll('#job-logs pre')].map(p => p.innerText)"
        first = wait.until(lambda d: (t := d.execute_script(logs)) and all(t) and t)
        assert len(first) == 2, first  # the primary replica and one worker
        wait.until(lambda d: d.execute_script(logs) != first)  # following live

        # a fault on the job's node: the job recovers, the page shows the incident's mode
        r = requests.post(f"{url}/v1beta1/{C}/nodes/{victim}:reportHealth",
                          json={"xids": [79]}, headers=H, timeout=30)
        assert r.status_code == 200, r.text
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#job-incidents tr[data-mode]"))
        mode = browser.find_element(By.CSS_SELECTOR, "#job-incidents tr[data-mode]")
        assert mode.get_attribute("data-mode") in ("in_place", "hot_spare", "requeue",
                                                   "shrink", "requeue_wait"), mode.text
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#job-attempts tbody tr"))
                   == 2)

        # a second fault in the hour: the guard holds it, the console says so and releases it
        others = [n["nodeId"] for n in requests.get(
            f"{url}/v1beta1/{C}/nodes", headers=H, timeout=10).json()["nodes"]
            if n["role"] == "worker" and n["nodeId"] != victim]
        for node in others:
            requests.post(f"{url}/v1beta1/{C}/nodes/{node}:reportHealth", json={"xids": [79]},
                          headers=H, timeout=30).raise_for_status()
            try:
                WebDriverWait(browser, 8).until(
                    lambda d: d.find_element(By.ID, "held").is_displayed())
                break
            except Exception:  # the guard let this one through: the next
                continue
        held_text = browser.find_element(By.ID, "held").text
        assert "1 repair held by the blast-radius guard" in held_text, held_text
        wait.until(lambda d: "held by the blast-radius guard" in d.find_element(
            By.ID, "clusters").text)
        assert "all nodes in service" not in browser.find_element(By.ID, "clusters").text
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-nodes polygon"))
        browser.set_window_size(1400, 2300)
        time.sleep(1)
        browser.save_screenshot(str(tmp_path / "4-acting.png"))
        if target := os.environ.get("MTC_CONSOLE_SCREENSHOT"):
            shutil.copy(tmp_path / "4-acting.png", ROOT / target)
        held = browser.find_element(By.CSS_SELECTOR, "#held button").get_attribute("data-node")
        out = _act(browser, wait, "#held button[data-action='releaseHold']", "let it repair")
        assert out.startswith("done"), out
        assert _audit(state, f"{held}:releaseHold") == [("token:env-admin", 200, "let it repair")]
        wait.until(lambda d: not d.find_element(By.ID, "held").is_displayed())

        # an operator's drain and resume of an idle node, from its cell in the grid
        def idle_node(d: Any) -> str:
            return str(d.execute_script(
                "const e = document.querySelector(\"#grid .node[data-state='idle']\"); "
                "return e ? e.dataset.node : ''"))
        spare = wait.until(idle_node)
        cell = f"#grid .node[data-node='{spare}']"
        out = _act(browser, wait, f"{cell} button[data-action='drain']", "bad fan")
        assert out.startswith("done"), out
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"{cell} button[data-action='resume']"))
        out = _act(browser, wait, f"{cell} button[data-action='resume']", "fan replaced")
        assert out.startswith("done"), out
        assert _audit(state, f"{spare}:drain") == [("token:env-admin", 200, "bad fan")]
        assert _audit(state, f"{spare}:resume") == [("token:env-admin", 200, "fan replaced")]

        # the charts, from the stored history: nodes by state, goodput, fault-to-drain
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-drain circle"))
        assert browser.find_elements(By.CSS_SELECTOR, "#chart-goodput polyline")

        # cancel the job from its page
        out = _act(browser, wait, "#job-cancel", "wrong dataset")
        assert out.startswith("done"), out
        wait.until(lambda d: d.find_elements(
            By.CSS_SELECTOR, "#jobs tr[data-job='long'][data-state='JOB_STATE_CANCELLED']"))
        assert _audit(state, "customJobs/long:cancel") == [
            ("token:env-admin", 200, "wrong dataset")]

        # a failed job says why in the jobs table, not just its exit code
        bad = job_body(10, "c1")
        bad["jobSpec"]["scheduling"]["mtcPartition"] = "gpu"
        for pool in bad["jobSpec"]["workerPoolSpecs"]:
            pool["containerSpec"]["command"] = [
                sys.executable, "-c", "import sys; sys.exit('no such dataset: gs://x')"]
            pool["containerSpec"]["args"] = []
        r = requests.post(f"{url}/v1/{PARENT}/customJobs", params={"customJobId": "bad"},
                          json=bad, headers=H, timeout=30)
        assert r.status_code == 200, r.text
        failed = "#jobs tr[data-job='bad'][data-state='JOB_STATE_FAILED'] .job-error"
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, failed))
        why = browser.find_element(By.CSS_SELECTOR, failed).text
        assert "exit" in why.lower() and why != "exit_code_1", why

        # the jobs table sorts by a header's click and filters by its box
        ids = "return [...document.querySelectorAll('#jobs tbody tr')].filter(r => !r.hidden)" \
              ".map(r => r.dataset.job)"
        header = "#jobs thead th:first-child"
        browser.find_element(By.CSS_SELECTOR, header).click()
        wait.until(lambda d: d.execute_script(ids) == ["bad", "long"])
        browser.find_element(By.CSS_SELECTOR, header).click()
        wait.until(lambda d: d.execute_script(ids) == ["long", "bad"])
        browser.find_element(By.CSS_SELECTOR, "input.table-filter[data-table='jobs']"
                             ).send_keys("dataset")  # bad's error says it
        wait.until(lambda d: d.execute_script(ids) == ["bad"])

        # a viewer sees the console; a drain is refused, and the page says so
        viewer = LocalTokens(state / TOKENS_FILE).create("token:viewer", "viewer", "p")
        _login(browser, wait, viewer)
        node = wait.until(idle_node)
        out = _act(browser, wait, f"#grid .node[data-node='{node}'] button[data-action='drain']",
                   "just looking")
        assert out.startswith("refused: 403"), out
        assert _audit(state, f"{node}:drain")[-1] == ("token:viewer", 403, "just looking")
        nodes = requests.get(f"{url}/v1beta1/{C}/nodes", headers=H, timeout=10).json()["nodes"]
        assert not next(n for n in nodes if n["nodeId"] == node).get("operatorDrained")
    assert time.monotonic() - started < 120
