"""The report of ``vmr-host report`` at scale (``vmr_handler/host/report/``).

    .venv/bin/python benchmarks/bench_report.py [--vms 200,1000] [--entries 20] [--baseline REV]
                                                [--no-browser] [--keep]

For each number of VMs, realistic logs are generated (``tests/reportgen.py``: stages, entries
with output, lateness, pauses, breaks, failures, KPI samples every 10 s), then, side by side
for the code of this tree and for the baseline revision (``git archive REV vmr_handler``, run
in its own process; default ``HEAD``):

[1] build: seconds to read and fold the logs and to render the HTML (``write_report``; the
    fold and the render apart for this tree), and the file's size.
[2] browser (when ``/usr/bin/chromium`` and ``/usr/bin/chromedriver`` exist; Selenium, headless,
    1400x900): the page opened from a file, ``performance.timing`` navigation start -> DOM
    content loaded and -> load event end, and first contentful paint; then, for this tree,
    the time ``VmrTimeline`` takes to lay the chart out again after a zoom (in the page,
    ``performance.now()``, the synchronous part, then to the next frame), and after the
    collapsed group is expanded and after a filter is typed.

Each figure is the median of ``--rounds`` (3). Never fails on slowness: it prints figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tests.reportgen import generate  # noqa: E402
from vmr_handler.host.logs.store import ExperimentStore  # noqa: E402
from vmr_handler.host.report import ExperimentTimeline, read_jsonl, render_html  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
NOW = 1_800_000_400.0

_BASELINE_BUILD = """
import sys, time
from vmr_handler.host.report import write_report
began = time.perf_counter()
write_report(sys.argv[1], sys.argv[2], now=float(sys.argv[3]))
print(time.perf_counter() - began)
"""


def _fold(logs: str) -> ExperimentTimeline:
    tl = ExperimentTimeline()
    notes: List[str] = []
    for f in sorted(os.listdir(logs)):
        if f.endswith(".jsonl"):
            lane = tl.vm(f[: -len(".jsonl")])
            for rec in read_jsonl(os.path.join(logs, f), notes):
                lane.add(rec)
    return tl


def build_here(logs: str, out: str) -> Dict[str, float]:
    """Fold and render with this tree; seconds and bytes."""
    began = time.perf_counter()
    tl = _fold(logs)
    folded = time.perf_counter()
    text = render_html(tl, ExperimentStore(logs).load(), (), NOW, source=logs)
    rendered = time.perf_counter()
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(text)
    return {
        "fold_s": folded - began,
        "render_s": rendered - folded,
        "build_s": time.perf_counter() - began,
        "bytes": float(os.path.getsize(out)),
    }


def baseline_tree(rev: str, into: str) -> Optional[str]:
    """``vmr_handler`` of revision ``rev`` unpacked under ``into`` (None: git cannot)."""
    try:
        os.makedirs(into)
        archive = subprocess.run(
            ["git", "-C", REPO, "archive", rev, "vmr_handler"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"baseline {rev}: not available ({exc})")
        return None
    return into


def build_baseline(tree: str, logs: str, out: str) -> Dict[str, float]:
    """``write_report`` of the baseline tree in its own process; seconds and bytes."""
    env = dict(os.environ, PYTHONPATH=tree)
    res = subprocess.run(
        [sys.executable, "-c", _BASELINE_BUILD, logs, out, repr(NOW)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return {"build_s": float(res.stdout.strip().splitlines()[-1]), "bytes": float(os.path.getsize(out))}


def browser() -> Any:
    """A headless Debian chromium driven by Selenium (nothing downloaded), or None."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"):
        opts.add_argument(arg)
    return webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))


_LOAD = """
var t = performance.timing, p = performance.getEntriesByType('paint');
var fcp = p.filter(function (e) { return e.name === 'first-contentful-paint'; });
return {dcl_ms: t.domContentLoadedEventEnd - t.navigationStart, load_ms: t.loadEventEnd - t.navigationStart,
        fcp_ms: fcp.length ? fcp[0].startTime : -1};
"""

# run `action` on the controller, time its synchronous part and up to the next frame
_ACT = """
var done = arguments[arguments.length - 1];
var c = VmrTimeline.attach(document.querySelector('.vmr-tl'));
var t0 = performance.now();
(%s)(c);
c.layout();
var sync = performance.now() - t0;
requestAnimationFrame(function () {
  setTimeout(function () { done({sync_ms: sync, frame_ms: performance.now() - t0}); }, 0);
});
"""

ACTIONS = {
    "zoom x4": "function (c) { c.zoom(0.25, 0.6); }",
    "expand group": "function (c) { var b = c.root.querySelector('.tl-expand'); if (b) { b.click(); } }",
    "filter 'vm01'": "function (c) { c.filterEl.value = 'vm01'; c.filterEl.dispatchEvent(new Event('input')); }",  # noqa: E501
    "zoom back (fit)": "function (c) { c.setView(c.t0, c.t1); }",
}


def in_browser(driver: Any, path: str, interact: bool) -> Dict[str, float]:
    driver.get("file://" + path)
    while driver.execute_script("return document.readyState") != "complete":
        time.sleep(0.05)
    out: Dict[str, float] = dict(driver.execute_script(_LOAD))
    if interact:
        for name, fn in ACTIONS.items():
            res = driver.execute_async_script(_ACT % fn)
            out[f"{name}: sync_ms"] = res["sync_ms"]
            out[f"{name}: frame_ms"] = res["frame_ms"]
    return out


def median_of(rounds: int, fn: Callable[[], Dict[str, float]]) -> Dict[str, float]:
    runs = [fn() for _ in range(rounds)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _fmt(key: str, v: Optional[float]) -> str:
    if v is None:
        return "-"
    if key == "bytes":
        return f"{v / 1e6:.2f} MB"
    return f"{v:.3f} s" if key.endswith("_s") else f"{v:.0f} ms"


def show(n: int, lines: int, here: Dict[str, float], base: Dict[str, float]) -> None:
    print(f"\n{n} VMs ({lines} log records)")
    print(f"  {'figure':<34}{'baseline':>14}{'this tree':>14}{'ratio':>9}")
    for key in here:
        b = base.get(key)
        ratio = f"{here[key] / b:.2f}" if b else "-"
        print(f"  {key:<34}{_fmt(key, b):>14}{_fmt(key, here[key]):>14}{ratio:>9}")


def one_size(root: str, n: int, entries: int, rounds: int, base_tree: Optional[str], driver: Any) -> None:
    """Generate the logs of ``n`` VMs, measure both builds (and pages), print the table."""
    logs = os.path.join(root, f"logs-{n}")
    g = generate(logs, n, entries=entries)
    new_out, old_out = os.path.join(root, f"new-{n}.html"), os.path.join(root, f"old-{n}.html")
    here = median_of(rounds, lambda: build_here(logs, new_out))
    base: Dict[str, float] = {}
    if base_tree is not None:
        base = median_of(rounds, lambda: build_baseline(base_tree, logs, old_out))
    if driver is not None:
        here.update(median_of(rounds, lambda: in_browser(driver, new_out, True)))
        if base_tree is not None:
            base.update(median_of(rounds, lambda: in_browser(driver, old_out, False)))
    show(n, g.lines, here, base)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vms", default="200,1000")
    ap.add_argument("--entries", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default="HEAD")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-report-")
    driver = None if args.no_browser else browser()
    if driver is None and not args.no_browser:
        print(f"no {CHROMIUM} / {CHROMEDRIVER}: browser figures skipped")
    try:
        base_tree = baseline_tree(args.baseline, os.path.join(root, "baseline")) if args.baseline else None
        for n in (int(v) for v in args.vms.split(",")):
            one_size(root, n, args.entries, args.rounds, base_tree, driver)
    finally:
        if driver is not None:
            driver.quit()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
