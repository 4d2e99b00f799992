"""The console page in a real browser: Selenium driving Debian's
``chromium`` through ``chromium-driver`` (never a downloaded browser), against a real
``vmr-host serve --console`` with real agents over unix sockets.

The page lists the VMs, shows a break as it begins without a reload, refuses a write without the
right token and says where the token is, resumes through its confirmation dialog with the token
of ``#token=...``, shows the server's refusal of a RESUME for a VM at no break with the offer to
send it anyway, updates the timeline, and shows an entry's output tail (hostile guest text stays
text). A screenshot is kept in the test's ``tmp_path`` (and as ``docs/img/console.png`` with
``VMR_SAVE_SCREENSHOTS=1``).

At 1000 VMs (a real host with 1000 schedules and no agent: every VM not seen) the table's render
time is measured and printed, never asserted (run with ``-s`` to see the figures).
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from tests.hostenv import HostEnv

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: Seconds any one thing may take to show in the page (a bound, not a measure).
WAIT = 30.0
DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
HOSTILE = "<b>bold</b><img src=x onerror=alert(1)>"
BREAK = {"start_time": 1, "pause_duration": "inf"}


def _sched(extra: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [{"start_time": -5, "executable": "/bin/echo", "arguments": "configured"}, *extra]


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """Headless chromium of the system; the test fails (not skips) when it is not installed."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(
            f"the console's browser tests need Debian's chromium and chromium-driver ({', '.join(missing)} "
            "missing): apt-get install chromium chromium-driver (.ci/run installs them)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # with the driver's path below, Selenium Manager is never asked
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """The console page open in ``driver``, for the host of ``env``."""

    def __init__(self, driver: WebDriver, env: HostEnv) -> None:
        self.driver = driver
        self.env = env
        url = env.wait_for(lambda: _read(env.logs / "console.url"), "console.url")
        self.url = url.strip()
        self.token = (env.logs / "console.token").read_text().strip()

    def until(self, pred: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        """Wait for ``pred`` to be true in the page; the failure names ``what`` and shows the logs."""
        try:
            return WebDriverWait(
                self.driver, timeout, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException]
            ).until(lambda _d: pred())
        except TimeoutException:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what}\n"
                f"browser log: {self.driver.get_log('browser')}\nhost:\n{self.env.host_log()[-3000:]}"
            ) from None

    def by_id(self, name: str) -> WebElement:
        return self.driver.find_element(By.ID, name)

    def click(self, css: str) -> None:
        """Click the element of ``css`` (found again when the page redrew it meanwhile)."""

        def clicked() -> bool:
            found = self.driver.find_elements(By.CSS_SELECTOR, css)
            if found:
                found[0].click()
            return bool(found)

        self.until(clicked, f"{css} to click")

    def text(self, css: str) -> str:
        """The text of the element of ``css`` ('' when there is none; read again when the page
        redrew it between finding and reading)."""
        box: List[str] = []

        def read() -> bool:
            found = self.driver.find_elements(By.CSS_SELECTOR, css)
            box[:] = [found[0].text if found else ""]
            return True

        self.until(read, f"the text of {css}")
        return box[0]

    def rows(self) -> List[Tuple[str, str]]:
        """``(vm, state)`` of every row drawn, in the table's order."""
        return [
            (vm, state)
            for vm, state in self.driver.execute_script(
                "return Array.from(document.querySelectorAll('#vm-rows tr'),"
                " (tr) => [tr.dataset.vm, tr.dataset.state]);"
            )
        ]

    def shown(self) -> int:
        """How many VMs pass the filter (the table draws only those in view)."""
        return int(self.driver.execute_script("return window.VmrConsole.state.order.length;"))

    def states(self) -> Dict[str, str]:
        return dict(self.rows())

    def select(self, vm: str) -> None:
        """Click ``vm``'s row; wait for its detail."""
        self.click(f'#vm-rows tr[data-vm="{vm}"]')
        self.until(
            lambda: (
                self.by_id("d-name").text == vm and self.driver.find_elements(By.CSS_SELECTOR, "#d-body dl")
            ),
            f"the detail of {vm}",
        )

    def bars(self, vm: str) -> int:
        """Entry bars in ``vm``'s lane of the timeline."""
        return len(self.driver.find_elements(By.CSS_SELECTOR, f'#timeline [data-vm="{vm}"] [class^="e-"]'))

    def dialog_error(self) -> str:
        err = self.by_id("dlg-error")
        return err.text if err.is_displayed() else ""

    def stats(self) -> Dict[str, Any]:
        return dict(self.driver.execute_script("return Object.assign({}, window.VmrConsole.stats);"))

    def js_errors(self) -> List[Dict[str, Any]]:
        """Severe browser log entries: script errors and files of the page not found (not the
        refusals of the API the test provokes, nor the favicon)."""
        return [
            e
            for e in self.driver.get_log("browser")
            if e.get("level") == "SEVERE"
            and (
                e.get("source") != "network"
                or "/static/" in str(e.get("message"))
                or "/ - " in str(e.get("message"))
            )
        ]


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _screenshot(driver: WebDriver, tmp_path: Path, name: str) -> Path:
    shot = tmp_path / name
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000, shot
    if os.environ.get("VMR_SAVE_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMG / name)
    return shot


@pytest.fixture
def env() -> Iterator[HostEnv]:
    """vm1: a break at t=1 s, then an entry; vm2: an entry that writes hostile output and exits 3;
    vm3: never started."""
    after = {"start_time": 2, "executable": "/bin/echo", "arguments": "after the break"}
    noisy = f"-c 'echo hello-from-vm2; echo \"{HOSTILE}\"; echo oops >&2; exit 3'"
    failing = {"start_time": 1, "executable": "/bin/sh", "arguments": noisy}
    e = HostEnv({"vm1": _sched([BREAK, after]), "vm2": _sched([failing]), "vm3": _sched([])})
    yield e
    e.close()


def test_console_page_follows_and_steers_a_real_experiment(
    env: HostEnv, browser: WebDriver, tmp_path: Path
) -> None:
    env.start_host(
        "--console", "127.0.0.1:0", "--expect", "vm1,vm2", "--kpi-interval", "1", "--name", "browser test"
    )
    page = Page(browser, env)
    browser.get(page.url)

    # the page lists the VMs (none seen yet), names the experiment, shows the barrier waiting
    page.until(lambda: page.states() == dict.fromkeys(("vm1", "vm2", "vm3"), "not_seen"), "the 3 VMs listed")
    page.until(lambda: page.by_id("conn-text").text == "live", "the live stream connected")
    assert page.by_id("x-name").text == "browser test"
    assert page.by_id("x-barrier").text == "barrier waiting for 2 VMs: vm1, vm2"
    assert page.by_id("btn-release").is_displayed()
    page.until(
        lambda: page.by_id("timeline").find_elements(By.CSS_SELECTOR, "[data-vm]"), "the timeline fragment"
    )

    # a break appears live: vm1's row turns at_break with no reload of the page
    browser.execute_script("window.sameLoad = true;")
    env.start_agent("vm1")
    env.start_agent("vm2")
    page.until(lambda: page.states().get("vm1") == "at_break", "vm1 at its break, shown live")
    assert browser.execute_script("return window.sameLoad === true;"), "the page was reloaded"
    assert "break #1" in page.text('#vm-rows tr[data-vm="vm1"]')
    assert not page.by_id("btn-release").is_displayed()
    page.until(lambda: page.by_id("btn-resume-all").text == "Resume all at a break (1)…", "resume all: 1")
    page.until(lambda: page.by_id("x-clock").text.startswith("t=+"), "the experiment clock running")
    # vm2's entry exited 3: a problem, listed first
    page.until(lambda: page.rows()[0][0] == "vm2", "vm2, a problem, listed first")
    assert "problem" in browser.execute_script(
        "return document.querySelector('#vm-rows tr[data-vm=\"vm2\"]').className;"
    )

    # vm2's detail: its entries, exit code, and the output tail fetched on demand; guest text stays text
    page.select("vm2")
    button = '#d-body button.tail-btn[data-entry="1"]'
    run = page.until(
        lambda: browser.find_element(By.CSS_SELECTOR, button).get_attribute("data-run"), "entry #1"
    )
    cells = browser.execute_script(
        "const row = document.querySelector(`#d-body tr[data-run='${arguments[0]}']`);"
        " return Array.from(row.cells, (td) => td.innerText);",
        run,
    )
    assert cells[0] == "#1" and cells[1].startswith("/bin/sh -c") and cells[2:4] == ["error", "3"], cells
    assert cells[-1] == "3 lines", cells
    page.click(button)
    tail = f'#d-body tr[data-tail="{run}"] pre'
    page.until(lambda: "oops" in page.text(tail), "entry #1's output tail")
    assert page.text(tail).splitlines() == ["hello-from-vm2", HOSTILE, "oops"], page.text(tail)
    assert not browser.find_elements(By.CSS_SELECTOR, "#d-body img, #d-body pre b"), (
        "guest output became HTML"
    )
    page.until(
        lambda: browser.find_elements(By.CSS_SELECTOR, '#d-body .kpi[data-kpi="cpu_percent"] polyline'),
        "a CPU sparkline in the detail",
    )

    # a write with a wrong token: refused, and the page says where the token is
    page.select("vm1")
    page.click("#d-resume")  # the detail may redraw: found again
    page.until(lambda: page.by_id("dlg").get_attribute("open") is not None, "the confirmation dialog")
    assert page.by_id("dlg-token").is_displayed(), "no token yet: the dialog asks for it"
    page.by_id("dlg-token").send_keys("0" * 64)
    page.by_id("dlg-ok").click()
    page.until(
        lambda: "needs the token from <logs>/console.token" in page.dialog_error(), "the 401 explained"
    )
    page.by_id("dlg-cancel").click()
    assert page.states()["vm1"] == "at_break"
    page.until(
        lambda: browser.find_elements(By.CSS_SELECTOR, '#timeline [data-vm="vm1"] .br'),
        "vm1's break in the timeline",
    )
    bars = page.bars("vm1")

    # the page opened with #token=...: kept in the tab, dropped from the address bar
    browser.get("about:blank")
    browser.get(f"{page.url}#token={page.token}")
    page.until(lambda: page.states().get("vm1") == "at_break", "the page again")
    assert "token" not in browser.current_url
    assert browser.execute_script("return sessionStorage.getItem('vmr-console-token');") == page.token

    # resume through the page: confirm, the RESUME goes out, the break ends and entry #2 runs
    page.select("vm1")
    page.click("#d-resume")  # the detail may redraw: found again
    page.until(lambda: page.by_id("dlg").get_attribute("open") is not None, "the confirmation dialog")
    assert not page.by_id("dlg-token").is_displayed()
    assert "vm1 is held at the break of entry #1" in page.by_id("dlg-text").text
    page.by_id("dlg-ok").click()
    page.until(lambda: page.by_id("dlg").get_attribute("open") is None, "the dialog closed")
    assert "sent to 1 VM" in page.by_id("notice").text
    page.until(lambda: page.states().get("vm1") == "complete", "vm1 complete after the RESUME")
    env.wait_event("vm1", "entry_exited", index=2)
    page.until(lambda: page.bars("vm1") > bars, "a new entry bar in vm1's timeline lane")
    assert "1 RESUME" in page.by_id("x-resumes").text

    # a RESUME for a VM at no break: the server's sentence, and the offer to send it anyway
    page.select("vm2")
    page.click("#d-resume")  # the detail may redraw: found again
    page.until(lambda: page.by_id("dlg").get_attribute("open") is not None, "the confirmation dialog")
    page.by_id("dlg-ok").click()
    page.until(lambda: "not at a break: vm2" in page.dialog_error(), "the refusal of a RESUME at no break")
    page.until(lambda: page.by_id("dlg-ok").text == "Send anyway", "the offer to send anyway")
    page.by_id("dlg-cancel").click()

    # for the screenshot: vm2's detail with its output tail open
    page.click(button)
    page.until(lambda: "oops" in page.text("#d-body"), "vm2's tail again")
    _screenshot(browser, tmp_path, "console.png")
    assert page.js_errors() == []


def test_console_page_at_1000_vms(browser: WebDriver, tmp_path: Path) -> None:
    """1000 VMs, no agent (all not seen): the table's render time, measured and printed; the
    name filter shows the one VM."""
    names = [f"vm{i:04d}" for i in range(1, 1001)]
    env = HostEnv({n: [{"start_time": 1, "executable": "/bin/true"}] for n in names})
    try:
        env.start_host("--console", "127.0.0.1:0", "--expect", "vm0001,vm0002,vm0003")
        page = Page(browser, env)
        began = time.monotonic()
        browser.get(page.url)
        page.until(lambda: page.shown() == 1000, "1000 rows")
        to_rows = time.monotonic() - began
        first = page.stats()
        assert page.by_id("x-barrier").text == "barrier waiting for 3 VMs: vm0001, vm0002, vm0003"
        assert page.by_id("shown").text == "1000 VMs"
        drawn = page.rows()
        assert [vm for vm, _s in drawn[:3]] == ["vm0001", "vm0002", "vm0003"]
        assert 20 <= len(drawn) < 200, f"{len(drawn)} rows drawn: the table should draw those in view"
        # scrolled to the end, the last rows are drawn
        browser.execute_script("document.getElementById('table-wrap').scrollTop = 1e9;")
        page.until(lambda: page.rows()[-1][0] == "vm1000", "the last row drawn after scrolling")
        browser.execute_script("document.getElementById('table-wrap').scrollTop = 0;")
        page.until(lambda: page.rows()[0][0] == "vm0001", "the first row drawn again")

        full = [float(browser.execute_script("return window.VmrConsole.renderTable();")) for _ in range(7)]
        by_name = browser.find_element(By.CSS_SELECTOR, '#vms th[data-sort="vm"]')
        by_name.click()
        page.until(lambda: by_name.get_attribute("aria-sort") == "ascending", "sorted by name")
        assert page.rows()[0][0] == "vm0001"
        by_name.click()
        page.until(lambda: page.rows()[0][0] == "vm1000", "sorted by name, descending")
        sort_ms = page.stats()["lastMs"]

        page.by_id("filter").send_keys("vm0742")
        page.until(lambda: page.rows() == [("vm0742", "not_seen")], "only vm0742 after filtering")
        assert page.by_id("shown").text == "1 of 1000 VMs" and page.shown() == 1
        filter_ms = page.stats()["lastMs"]
        page.by_id("filter").clear()
        page.by_id("filter").send_keys(" ")  # an input event: the filter is empty again
        page.until(lambda: page.shown() == 1000, "1000 rows again")

        # release the barrier through the page, the token typed into the confirmation dialog
        page.by_id("btn-release").click()
        page.until(lambda: page.by_id("dlg").get_attribute("open") is not None, "the release dialog")
        assert "The barrier waits for 3 VMs" in page.by_id("dlg-text").text
        page.by_id("dlg-token").send_keys(page.token)
        page.by_id("dlg-ok").click()
        page.until(lambda: page.by_id("x-start").text.startswith("start 20"), "the start time set")
        assert "Released: start time" in page.by_id("notice").text
        assert not page.by_id("btn-release").is_displayed()
        _screenshot(browser, tmp_path, "console-1000.png")
        assert page.js_errors() == []
        print(
            "\nconsole table, 1000 VMs (chromium headless, this machine): "
            f"page open to 1000 rows {to_rows * 1000:.0f} ms; first render {first['lastMs']:.1f} ms; "
            "table render (filter, sort, draw the rows in view) "
            f"median {statistics.median(full):.1f} ms (min {min(full):.1f}, max {max(full):.1f}, "
            f"{len(full)} runs); sort by name {sort_ms:.1f} ms; filter to 1 row {filter_ms:.1f} ms"
        )
    finally:
        env.close()


def test_console_page_shows_a_lost_vm_and_says_when_the_host_is_gone(
    env: HostEnv, browser: WebDriver
) -> None:
    """vm1's agent killed with SIGKILL at its break: its row turns ``lost`` live, first among the
    problems, counted in the header. Then the host is killed: the page says it is gone, once a
    reconnection found nobody, and its clock stops."""
    env.start_host("--console", "127.0.0.1:0", "--expect", "vm1,vm2", "--lost-after", "1")
    page = Page(browser, env)
    browser.get(page.url)
    page.until(lambda: page.by_id("conn-text").text == "live", "the live stream connected")
    env.start_agent("vm1")
    env.start_agent("vm2")
    page.until(lambda: page.states().get("vm1") == "at_break", "vm1 at its break")
    page.until(lambda: page.by_id("x-clock").text.startswith("t=+"), "the experiment clock running")
    agent = env.agents["vm1"]
    agent.kill()
    agent.wait(timeout=WAIT)
    page.until(lambda: page.states().get("vm1") == "lost", "vm1 lost, shown live")
    assert page.rows()[0] == ("vm1", "lost"), page.rows()
    pill = "return document.querySelector('#vm-rows tr[data-vm=\"vm1\"] .state').className;"
    assert "st-lost" in browser.execute_script(pill)
    page.until(lambda: "lost1" in page.text("#chips").replace(" ", "").replace("\n", ""), "lost counted")

    env.kill_host()
    page.until(
        lambda: page.by_id("conn-text").text.startswith("vmr-host is gone: nothing since "), "host gone"
    )
    clock = page.by_id("x-clock").text
    assert clock.endswith("stopped: the host is gone") and clock.startswith("t=+"), clock
    time.sleep(2.5)
    assert page.by_id("x-clock").text == clock, "the clock went on without a host"
    assert page.js_errors() == []


def test_a_running_entry_is_stopped_from_its_stop_button(browser: WebDriver) -> None:
    """The Stop button of a running entry, behind its confirmation: the entry's process tree
    ends and it shows as killed by an operator, not as a failure."""
    sleeper = {"start_time": 1, "executable": "/bin/sh", "arguments": "-c 'sleep 600 & sleep 600'"}
    env = HostEnv({"vm1": _sched([sleeper])}, start_buffer=0.5)
    try:
        env.start_host("--console", "127.0.0.1:0")
        page = Page(browser, env)
        env.start_agent("vm1")
        env.wait_event("vm1", "entry_started", index=1)
        browser.get(f"{page.url}#token={page.token}")
        page.until(lambda: page.states().get("vm1") == "running", "vm1 running")
        page.select("vm1")
        page.click('#d-entries button.stop-btn[data-entry="1"]')
        page.until(lambda: page.by_id("dlg").get_attribute("open") is not None, "the confirmation dialog")
        assert "Stop entry #1 on vm1?" in page.by_id("dlg-title").text
        assert "SIGTERM, then SIGKILL after 10 s" in page.by_id("dlg-text").text
        page.by_id("dlg-ok").click()
        page.until(lambda: page.by_id("dlg").get_attribute("open") is None, "the dialog closed")
        exited = env.wait_event("vm1", "entry_exited", index=1)["event"]["data"]
        assert exited["ended_by"] == "operator" and exited["status"] == "killed", exited
        page.until(lambda: "killed" in page.text("#d-entries"), "the run shown as killed")
        stops = "#d-entries button.stop-btn"
        page.until(lambda: not browser.find_elements(By.CSS_SELECTOR, stops), "no Stop button left")
        assert env.status()["vms"][0]["failures"] == 0  # stopped, not failed
    finally:
        env.close()
