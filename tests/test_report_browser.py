"""The report of ``vmr-host report`` in a real browser: at 200 VMs
nothing overlaps or is cut off, and the render time is measured.

Debian's ``chromium`` driven by Selenium through Debian's ``chromium-driver`` (both installed
by ``.ci/run``; Selenium is never let download anything: the browser and the driver are given
by path). A missing browser FAILS the test with what to install: it is never skipped. The
report is written by the real ``write_report`` from the logs of 200 VMs made by
``tests/reportgen.py`` (failed, rejected, with failures, interrupted, at a break, running,
late, restarted, KPIs) and opened from its file, as an operator would.

A screenshot is kept in the test's tmp dir, and written to ``docs/img/report-200.png`` when
``VMR_SAVE_SCREENSHOTS=1``. The render time is printed (``-s`` shows it), never asserted.
"""

from __future__ import annotations

import collections
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from tests.reportgen import generate
from vmr_handler.host.model.stateword import STATES
from vmr_handler.host.report import write_report

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
REPO = Path(__file__).resolve().parent.parent
N = 200


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} missing: the report's browser tests need Debian's chromium and "
            "chromium-driver (apt-get install chromium chromium-driver; .ci/run installs them)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"):
        opts.add_argument(arg)
    d = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    yield d
    d.quit()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Any, Path]:
    logs = tmp_path_factory.mktemp("report200")
    g = generate(str(logs), N)
    out = logs / "report.html"
    write_report(str(logs), str(out), now=g.start + 400)
    return g, out


@pytest.fixture
def page(driver: Any, report: Tuple[Any, Path]) -> Any:
    driver.get(report[1].as_uri())
    driver.execute_async_script(FRAMES)
    return driver


#: wait until the load event and two animation frames have passed
FRAMES = """
var done = arguments[arguments.length - 1];
function frames() { requestAnimationFrame(function () { requestAnimationFrame(function () { done(); }); }); }
if (document.readyState === 'complete') { frames(); } else { addEventListener('load', frames); }
"""


def frames(d: Any) -> None:
    d.execute_async_script(FRAMES)


def shown_lanes(d: Any) -> List[List[str]]:
    """``[vm, category]`` of every lane not hidden, in page order."""
    return list(
        d.execute_script(
            "return Array.from(document.querySelectorAll('.tl-lane[data-vm]'))"
            ".filter(function (e) { return e.offsetParent !== null; })"
            ".map(function (e) { return [e.dataset.vm, e.dataset.cat]; });"
        )
    )


def view(d: Any) -> List[float]:
    return list(d.execute_script("return VmrTimeline.attach(document.querySelector('.vmr-tl')).view();"))


def axis_labels(d: Any) -> List[str]:
    return list(
        d.execute_script(
            "return Array.from(document.querySelectorAll('svg.tl-axis text'), t => t.textContent);"
        )
    )


def box(d: Any, selector: str) -> Dict[str, float]:
    """The bounding box (px, in the window) of the first element ``selector`` picks."""
    return dict(
        d.execute_script(
            "return document.querySelector(arguments[0]).getBoundingClientRect().toJSON();", selector
        )
    )


# navigation start -> DOM content loaded, load event end; first contentful paint; chart layout
_TIMES = """
var t = performance.timing, p = performance.getEntriesByType('paint');
var f = p.filter(function (e) { return e.name === 'first-contentful-paint'; });
return {dcl: t.domContentLoadedEventEnd - t.navigationStart, load: t.loadEventEnd - t.navigationStart,
        fcp: f.length ? f[0].startTime : null,
        layout: VmrTimeline.attach(document.querySelector('.vmr-tl')).layoutMs};
"""
# [left, right, top, bottom, shown whole] of every legend item
_LEGEND = """
return Array.from(document.querySelectorAll('.tl-li'), function (e) {
  var b = e.getBoundingClientRect();
  return [b.left, b.right, b.top, b.bottom, e.scrollWidth <= e.clientWidth + 1];
});
"""
# [class, left, right, top, text] of every axis label
_LABELS = """
return Array.from(document.querySelectorAll('svg.tl-axis text'), function (e) {
  var b = e.getBoundingClientRect(); return [e.getAttribute('class'), b.left, b.right, b.top, e.textContent];
});
"""


def test_render_time_and_a_screenshot(page: Any, tmp_path: Path) -> None:
    t = page.execute_script(_TIMES)
    print(
        f"\nreport of {N} VMs in chromium: first contentful paint {t['fcp']:.0f} ms, DOM content loaded "
        f"{t['dcl']} ms, load event {t['load']} ms (navigation start ->); chart layout {t['layout']:.1f} ms"
    )
    assert t["fcp"] is not None and t["load"] > 0
    shot = tmp_path / "report-200.png"
    assert page.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    if os.environ.get("VMR_SAVE_SCREENSHOTS") == "1":
        (REPO / "docs" / "img").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, REPO / "docs" / "img" / "report-200.png")


def test_problems_come_first_with_their_counts(page: Any, report: Tuple[Any, Path]) -> None:
    g = report[0]
    lanes = shown_lanes(page)
    assert len(lanes) == N and {vm: cat for vm, cat in lanes} == g.words()  # the words of status
    problems = g.problems()
    lead = [vm for vm, _ in lanes[: len(problems)]]
    assert sorted(lead) == problems  # problems first, in the order of the words, then by name
    assert lead == sorted(lead, key=lambda vm: (STATES.index(g.words()[vm]), vm))
    rest = [vm for vm, cat in lanes[len(problems) :]]
    assert rest == sorted(rest)  # then by name
    counts = collections.Counter(g.words().values())
    bar = " ".join(page.execute_script("return document.querySelector('.tl-counts').textContent;").split())
    rejected = counts["schedule_rejected"]
    assert bar.startswith(f"{N} VMs: {counts['failed']} failed · {rejected} schedule rejected")
    assert f"{counts['complete']} complete" in bar and f"{len(problems)} problem(s)" in bar

# every shape laid out in a lane: its box, its lane's plot box and its lane's box
_SHAPES = """
var out = [], vh = innerHeight, head = document.querySelector('.tl-head').getBoundingClientRect().bottom;
document.querySelectorAll('.tl-lane[data-vm]').forEach(function (lane) {
  var lb = lane.getBoundingClientRect();
  if (lb.bottom <= head || lb.top >= vh) { return; }
  var plot = lane.querySelector('svg.tl-plot').getBoundingClientRect();
  var name = lane.querySelector('.tl-name');
  var shapes = [];
  lane.querySelectorAll('svg.tl-plot [data-s]').forEach(function (e) {
    if (e.getAttribute('visibility') === 'hidden') { return; }
    var b = e.getBoundingClientRect();
    shapes.push([e.getAttribute('class'), b.left, b.right, b.top, b.bottom]);
  });
  var nb = name.getBoundingClientRect();
  out.push({vm: lane.dataset.vm, lane: [lb.left, lb.right, lb.top, lb.bottom],
    plot: [plot.left, plot.right, plot.top, plot.bottom], name: [nb.left, nb.right],
    nameFits: name.scrollWidth <= name.clientWidth, shapes: shapes});
});
return out;
"""


def _check_lanes(lanes: List[Dict[str, Any]], seen: Dict[str, int]) -> None:
    for lane in lanes:
        vm, (pl, pr, _, _) = lane["vm"], lane["plot"]
        assert lane["name"][1] <= pl + 0.5, f"{vm}: its name runs into the plot"
        assert lane["nameFits"], f"{vm}: its name is cut"
        for cls, left, right, top, bottom in lane["shapes"]:
            where = f"{vm}: a {cls} at x {left:.1f}..{right:.1f}, y {top:.1f}..{bottom:.1f}"
            assert pl - 0.5 <= left and right <= pr + 0.5, f"{where} is outside the plot {pl:.1f}..{pr:.1f}"
            inside = lane["lane"][2] - 0.5 <= top and bottom <= lane["lane"][3] + 0.5
            assert inside, f"{where} leaves its lane"
        seen[vm] = len(lane["shapes"])


def test_nothing_overlaps_or_is_cut_off(page: Any) -> None:
    vw, vh = page.execute_script("return [document.documentElement.clientWidth, innerHeight];")
    # the legend: every item shown whole, in the window, none over another, above the axis
    items = page.execute_script(_LEGEND)
    assert len(items) >= 20
    for i, (left, right, top, bottom, whole) in enumerate(items):
        assert left >= 0 and right <= vw and top >= 0 and bottom <= vh and right - left > 20 and whole
        for o in items[i + 1 :]:
            assert right <= o[0] + 0.5 or o[1] <= left + 0.5 or bottom <= o[2] + 0.5 or o[3] <= top + 0.5
    axis = box(page, "svg.tl-axis")
    assert max(b for *_, b, _ in items) <= axis["top"] + 0.5
    _check_axis(page, vw, axis)
    # every lane, scrolled through: name before the plot, every shape inside its plot and lane
    seen: Dict[str, int] = {}
    end = page.execute_script("return document.querySelector('.tl-lanes').getBoundingClientRect().bottom;")
    for y in range(0, int(end - vh * 0.5), int(vh * 0.6)):  # while lanes are on screen
        page.execute_script("window.scrollTo(0, arguments[0]);", y)
        frames(page)
        _check_lanes(page.execute_script(_SHAPES), seen)
        head = box(page, ".tl-head")
        assert head["top"] >= -0.5 and head["bottom"] < vh / 2, "the axis and legend stay on screen (sticky)"
    assert len(seen) == N and sum(seen.values()) > 20 * N  # every lane was laid out as it came into view
    tops = page.execute_script(
        "return Array.from(document.querySelectorAll('.tl-lane[data-vm]')).map(function (e) {"
        " var b = e.getBoundingClientRect(); return [b.top, b.bottom]; });"
    )
    assert all(a[1] <= b[0] + 0.5 for a, b in zip(tops, tops[1:])), "lanes overlap"


def _check_axis(page: Any, vw: float, axis: Dict[str, float]) -> None:
    """Tick labels inside the window and the axis (not cut), none over another."""
    labels = page.execute_script(_LABELS)
    assert sum(1 for c, *_ in labels if c == "tk") >= 5 and sum(1 for c, *_ in labels if c == "tk2") >= 5
    for cls in ("tk", "tk2"):
        row = sorted((left, right, text) for c, left, right, _, text in labels if c == cls)
        for left, right, text in row:
            assert left >= 0 and right <= vw and axis["left"] <= left and right <= axis["right"], text
        for a, b in zip(row, row[1:]):
            assert a[1] <= b[0], f"axis labels {a[2]!r} and {b[2]!r} overlap"


def test_the_filter_box_and_the_counts_filter(page: Any, report: Tuple[Any, Path]) -> None:
    g = report[0]
    box = page.find_element("css selector", "input.tl-filter")
    box.send_keys("vm01")
    frames(page)
    want = [vm for vm in g.vms if "vm01" in vm]
    assert sorted(vm for vm, _ in shown_lanes(page)) == want
    assert page.find_element("css selector", ".tl-shown").text == f"{len(want)} of {N} shown"
    rows = page.execute_script(
        "return document.querySelectorAll('#vmr-vms tr[data-vm]:not([hidden])').length;"
    )
    assert rows == len(want)  # the VM table follows the filter
    box.send_keys("\b" * 4)
    page.find_element("css selector", '.tl-count[data-cat="failed"]').click()
    frames(page)
    failed = sorted(vm for vm, k in g.kinds.items() if k == "failed")
    assert sorted(vm for vm, _ in shown_lanes(page)) == failed
    page.find_element("css selector", '.tl-count[data-cat="failed"]').click()  # again: all
    frames(page)
    assert len(shown_lanes(page)) == N


def test_zoom_and_pan_change_the_axis(page: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.wheel_input import ScrollOrigin

    full, labels = view(page), axis_labels(page)
    bar = page.find_element("css selector", ".tl-lane[data-vm] .e-success")
    x0 = float(bar.get_attribute("x"))
    page.find_element("css selector", '[data-zoom="in"]').click()
    frames(page)
    v = view(page)
    assert v[1] - v[0] == pytest.approx((full[1] - full[0]) / 2)
    assert axis_labels(page) != labels and float(bar.get_attribute("x")) != x0
    axis = page.find_element("css selector", ".tl-axcell")
    ActionChains(page).scroll_from_origin(ScrollOrigin.from_element(axis, -200, 0), 0, -300).perform()
    frames(page)
    w = view(page)
    assert w[1] - w[0] < (v[1] - v[0]) * 0.7  # the wheel on the axis zooms in, around the pointer
    ActionChains(page).click_and_hold(axis).move_by_offset(-300, 0).release().perform()
    frames(page)
    dragged = view(page)
    assert dragged[0] > w[0] and dragged[1] - dragged[0] == pytest.approx(w[1] - w[0])  # dragged later
    page.find_element("css selector", '[data-zoom="fit"]').click()
    frames(page)
    assert view(page) == full and axis_labels(page) == labels


def test_a_click_on_an_entry_shows_its_details(page: Any) -> None:
    bar = page.find_element("css selector", '.tl-lane[data-problem="1"][data-cat="complete"] .e-error')
    page.execute_script("arguments[0].scrollIntoView({block: 'center'});", bar)
    frames(page)
    bar.click()
    panel = page.find_element("css selector", ".vmr-tl-detail")
    assert panel.is_displayed() and "exit code 2" in panel.text and "status: error" in panel.text
    assert "output line(s)" in panel.text or "ran " in panel.text


def test_a_new_fragment_keeps_the_zoom_and_the_filter(page: Any) -> None:
    # what the live console does every few seconds: replace the fragment, attach again
    page.find_element("css selector", '[data-zoom="in"]').click()
    page.find_element("css selector", "input.tl-filter").send_keys("vm00")
    frames(page)
    before, shown = view(page), shown_lanes(page)
    page.execute_script(
        "var root = document.querySelector('.vmr-tl'), parent = root.parentNode, html = root.outerHTML;"
        "var holder = document.createElement('div'); holder.innerHTML = html;"
        "parent.replaceChild(holder.firstElementChild, root);"
        "VmrTimeline.attach(parent.querySelector('.vmr-tl'));"
    )
    frames(page)
    assert page.execute_script("return document.querySelectorAll('.vmr-tl').length;") == 1
    assert view(page) == before and shown_lanes(page) == shown
    assert page.find_element("css selector", "input.tl-filter").get_attribute("value") == "vm00"
