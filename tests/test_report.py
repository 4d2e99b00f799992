"""``vmr-host report`` (SPEC section 8): the timeline HTML from hand-made records (the
pure renderer), the streaming loader, and one real experiment (HostEnv) rendered by the real CLI.
The same report in a real browser: tests/test_report_browser.py."""

from __future__ import annotations

import itertools
import json
import time
import xml.etree.ElementTree as ET
from typing import Any, Dict, List

import pytest

from tests.hostenv import HostEnv, fill
from tests.reportgen import generate
from vmr_handler.host.cli.vmr_host import main as host_main
from vmr_handler.host.model.stateword import STATES
from vmr_handler.host.report import (
    ExperimentTimeline,
    Facts,
    KpiSeries,
    read_jsonl,
    render_html,
    render_report,
    timeline_fragment,
    write_report,
)
from vmr_handler.host.report import fold as report_fold
from vmr_handler.host.report.facts import KPI_POINTS, TAIL_CHARS, TAIL_LINES

NS = "{http://www.w3.org/2000/svg}"
T0 = 1_800_000_000.0
_ids = itertools.count(1)


def rec(vm: str, t: float, type_: str, **data: Any) -> Dict[str, Any]:
    """A host log record as in ``<logs>/<vm>.jsonl`` (received 10 ms after the event)."""
    return {
        "vm": vm,
        "host_received": t + 0.01,
        "event": {"timestamp": t, "type": type_, "id": f"x-{next(_ids)}", "data": data},
    }


def svg_of(html: str) -> ET.Element:
    """The timeline fragment ``<div class="vmr-tl">`` of a report page (or the fragment
    itself), parsed as XML (it must be well-formed)."""
    if html.startswith("<!DOCTYPE"):
        html = html[html.index("<div data-table=") : html.index("\n<h2>Experiment</h2>")]
    return ET.fromstring(html)


def x_of(svg: ET.Element, t: float) -> float:
    """Where the renderer places UTC ``t`` (from the scale stated on the fragment's root)."""
    t0, t1 = float(svg.get("data-t0")), float(svg.get("data-t1"))
    x0, x1 = float(svg.get("data-x0")), float(svg.get("data-x1"))
    return x0 + (t - t0) * (x1 - x0) / (t1 - t0)


def lanes(svg: ET.Element) -> List[ET.Element]:
    return [g for g in svg.iter(NS + "g") if g.get("class") == "lane"]


def lane(svg: ET.Element, vm: str) -> ET.Element:
    return next(g for g in lanes(svg) if g.get("data-vm") == vm)


def of_class(el: ET.Element, cls: str, tag: str = "rect") -> List[ET.Element]:
    return [e for e in el.iter(NS + tag) if e.get("class") == cls]


def title(el: ET.Element) -> str:
    t = el.find(NS + "title")
    return "" if t is None or t.text is None else t.text


def right(el: ET.Element) -> float:
    return float(el.get("x")) + float(el.get("width"))


def utc(svg: ET.Element, el: ET.Element, attr: str = "data-s") -> float:
    """The UTC time of an element's ``data-s`` / ``data-e`` (seconds after the origin)."""
    return float(svg.get("data-origin")) + float(el.get(attr))


def mark_x(el: ET.Element) -> float:
    """Where a marker is moved to (``transform="translate(x,0)"``)."""
    return float(el.get("transform").split("(")[1].split(",")[0])


def mark(svg: ET.Element, name: str) -> ET.Element:
    """The line across every lane with ``data-mark`` ``name`` (start, last-configured)."""
    return next(e for e in svg.iter(NS + "line") if e.get("data-mark") == name)


START = T0 + 10
EXPERIMENT = {
    "barrier": {
        "start_time": START,
        "buffer": 5.0,
        "configured": {"vm1": T0 + 3.6, "vm2": T0 + 5.0},
        "expected": ["vm1", "vm2", "vm3"],
        "excluded": [],
        "released": [],
    },
    "start_set_at": T0 + 5.0,
    "resumes": [
        {"id": "resume-1", "at": 20.0, "issued": T0 + 29.9, "targets": ["vm1"], "answered": {"vm1": {}}}
    ],
}


def experiment_records() -> List[Dict[str, Any]]:
    """vm1: a stage, configured, the start, an ok entry, a pause, a break ended by a RESUME, an
    entry exiting 1, one that could not start and vm_failed; vm2: reboot and a refused control
    message; vm3 (expected) reported nothing."""
    r = rec
    return [
        r("vm1", T0, "agent_started", version="0.1.0", pid=1, resumed_from_journal=False),
        r("vm1", T0 + 1, "stage_started", stage=0, start_time=-20.0, entries=[0]),
        r("vm1", T0 + 1, "entry_started", index=0, executable="sleep", start_time=-20.0),
        *[r("vm1", T0 + 2, "output", index=0, stream="stdout", seq=i, line=f"l{i}") for i in (1, 2, 3)],
        r("vm1", T0 + 3, "entry_exited", index=0, executable="sleep", exit_code=0, status="success"),
        r("vm1", T0 + 3, "stage_finished", stage=0, start_time=-20.0, duration=2.0),
        r("vm1", T0 + 3.5, "configured", at=T0 + 3.5, stages=1),
        r("vm1", T0 + 5.1, "start_time_set", start_time=START, source="host"),
        r("vm1", START, "experiment_started", start_time=START, late=0.0),
        r(
            "vm1",
            START + 1.003,
            "entry_started",
            index=1,
            executable="/bin/echo",
            start_time=1.0,
            scheduled=START + 1,
            spawned_at=START + 1.002,
            lateness=0.002,
        ),
        r("vm1", START + 2, "entry_exited", index=1, executable="/bin/echo", exit_code=0, status="success"),
        r("vm1", START + 5, "pause_started", index=2, at=5.0, duration=5.0, until=10.0),
        r("vm1", START + 10, "pause_ended", index=2, at=10.0, duration=5.0),
        r("vm1", START + 12, "break_started", index=3, at=12.0, details="held"),
        r("vm1", START + 20, "resume_received", at=19.9, ended_break=3, ignored=False, status="success"),
        r(
            "vm1",
            START + 21,
            "entry_started",
            index=4,
            executable="/bin/false",
            start_time=13.0,
            scheduled=START + 20.996,
            spawned_at=START + 21,
            lateness=0.004,
        ),
        r(
            "vm1",
            START + 21.5,
            "entry_exited",
            index=4,
            executable="/bin/false",
            exit_code=1,
            status="error",
            details="exit code 1",
        ),
        r(
            "vm1",
            START + 22,
            "entry_failed",
            index=5,
            executable="nosuch",
            status="error",
            details="not found",
        ),
        r("vm1", START + 22, "vm_failed", index=5, status="error", details="entry 5 could not start"),
        r("vm2", T0 + 0.5, "agent_started", version="0.1.0", pid=2, resumed_from_journal=False),
        r("vm2", T0 + 1, "stage_started", stage=0, start_time=-5.0, entries=[0]),
        r("vm2", T0 + 2, "reboot_requested", stage=0, requesters=[0], command="reboot"),
        r("vm2", T0 + 3, "agent_started", version="0.1.0", pid=3, resumed_from_journal=True),
        r("vm2", T0 + 4.9, "configured", at=T0 + 4.9, stages=1),
        r("vm2", T0 + 6, "control_refused", type="resume", id="r", status="error", details="unsigned"),
    ]


@pytest.fixture(scope="module")
def page() -> str:
    return render_report(experiment_records(), EXPERIMENT, generated_at=T0 + 100)


def test_one_lane_per_vm_sorted_with_a_lane_for_a_vm_without_events(page):
    svg = svg_of(page)
    assert [g.get("data-vm") for g in lanes(svg)] == ["vm1", "vm2", "vm3"]
    assert "state: not seen" in title(lane(svg, "vm3").find(NS + "rect"))  # as vmr-host status says
    assert not of_class(lane(svg, "vm3"), "st") and not of_class(lane(svg, "vm3"), "e-success")
    # one self-contained file: its own script and style inline, nothing fetched
    assert page.count("<script") == 2 and "<script src" not in page and "<link" not in page
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")


def test_start_line_and_last_configured_line_are_where_experiment_json_puts_them(page):
    svg = svg_of(page)
    start = mark(svg, "start")
    assert float(start.get("data-t")) == START
    assert float(start.get("x1")) == pytest.approx(x_of(svg, START), abs=0.06)
    last = mark(svg, "last-configured")
    assert float(last.get("x1")) == pytest.approx(x_of(svg, T0 + 5.0), abs=0.06)
    assert "vm2" in title(last)  # the experiment.json time of the slowest VM, not its own `at`
    # the axis speaks experiment time: t=0 at the start, negative before
    ticks = [t.text for t in svg.iter(NS + "text") if t.get("class") == "tk2"]
    assert (
        "t=0" in ticks and any(t.startswith("t=-") for t in ticks) and any(t.startswith("t=+") for t in ticks)
    )


def test_stage_bar_spans_start_to_finish_and_is_labelled_with_its_start_time(page):
    svg = svg_of(page)
    (stage,) = of_class(lane(svg, "vm1"), "st")
    assert float(stage.get("x")) == pytest.approx(x_of(svg, T0 + 1), abs=0.06)
    assert right(stage) == pytest.approx(x_of(svg, T0 + 3), abs=0.15)
    assert "stage -20" in title(stage)
    labels = [t.text for t in lane(svg, "vm1").iter(NS + "text") if t.get("class") == "stl"]
    assert labels == ["stage -20"]


def test_entries_coloured_by_status_with_tooltips(page):
    vm1 = lane(svg_of(page), "vm1")
    ok, err, failed = (of_class(vm1, f"e-{s}") for s in ("success", "error", "failed"))
    assert len(ok) == 2 and len(err) == 1 and len(failed) == 1
    tip = title(err[0])
    assert "entry #4: /bin/false" in tip and "exit code 1" in tip and "lateness 4 ms" in tip
    assert "t=+21 s" in tip and tip.count("exit code 1") == 1
    assert "3 output line(s), the last 3:\n| l1\n| l2\n| l3" in title(ok[0])
    assert "not found" in title(failed[0])
    assert float(ok[1].get("x")) == pytest.approx(x_of(svg_of(page), START + 1.002), abs=0.06)  # spawned_at


def test_pause_and_break_spans_break_ends_at_the_resume(page):
    svg = svg_of(page)
    vm1 = lane(svg, "vm1")
    (pause,) = of_class(vm1, "pa")
    assert utc(svg, pause) == pytest.approx(START + 5) and utc(svg, pause, "data-e") == pytest.approx(
        START + 10
    )
    assert right(pause) == pytest.approx(x_of(svg, START + 10), abs=0.15)
    (brk,) = of_class(vm1, "br")
    assert right(brk) == pytest.approx(x_of(svg, START + 20), abs=0.15)
    assert "ended by a RESUME stamped t=19.9" in title(brk)
    # the RESUME is drawn in the lane of the VM that received it, not across every lane
    (received,) = of_class(vm1, "m-resume", "path")
    assert utc(svg, received) == pytest.approx(START + 20) and "ended break #3" in title(received)
    assert not of_class(lane(svg, "vm2"), "m-resume", "path") and not of_class(
        lane(svg, "vm3"), "m-resume", "path"
    )
    over = next(e for e in svg.iter(NS + "svg") if e.get("class") == "tl-over")
    assert {e.get("data-mark") for e in over.iter(NS + "line") if e.get("class") != "grid"} == {
        "start",
        "last-configured",
    }
    axis = next(e for e in svg.iter(NS + "svg") if e.get("class") == "tl-axis")
    (issued,) = of_class(axis, "ax-rs", "path")  # on the time axis, where the operator issued it
    assert utc(svg, issued) == pytest.approx(T0 + 29.9) and "to 1 VM(s): vm1" in title(issued)


def test_markers_configured_reboot_failed_refused_restart(page):
    svg = svg_of(page)
    kinds = {vm: sorted(p.get("class") for p in lane(svg, vm).iter(NS + "path")) for vm in ("vm1", "vm2")}
    assert kinds["vm1"] == ["m-configured", "m-failed", "m-resume"]
    assert kinds["vm2"] == ["m-configured", "m-reboot", "m-refused", "m-restart"]
    conf = of_class(lane(svg, "vm1"), "m-configured", "path")[0]
    assert mark_x(conf) == pytest.approx(x_of(svg, T0 + 3.5), abs=0.06)


def test_summary_table_and_experiment_facts(page):
    row = next(line for line in page.splitlines() if line.startswith('<tr class="problem" data-vm="vm1"'))
    cells = [c.split(">", 1)[1] for c in row.split("</td>")[:-1]]
    # VM, state, configured at, stages, entries, lateness max, p50, failures, output lines, ...
    assert cells[1] == "failed"
    assert cells[2].endswith("t=-6.5 s")
    assert cells[3:9] == ["1", "4/4", "4 ms", "3 ms", "2", "3"]
    assert "<td>not seen</td>" in next(line for line in page.splitlines() if "<td>vm3</td>" in line)
    assert "1 agent restart(s); 1 control message(s) refused" in page
    assert "<th>configured last</th><td>vm2 at " in page
    assert "<th>start buffer</th><td>5 s</td>" in page
    assert "<th>RESUMEs issued</th><td>1</td>" in page


def test_hostile_strings_are_escaped_cut_and_well_formed():
    bad = "<script>alert(1)</script>\x1b[31m\ud800&\"'" + "A" * 10_000
    records = [
        rec("<b>vm</b>", T0, "stage_started", stage="<i>", start_time="<img src=x onerror=alert(1)>"),
        rec("<b>vm</b>", T0 + 1, "entry_started", index=0, executable=bad),
        rec("<b>vm</b>", T0 + 2, "entry_exited", index=0, executable=bad, status="error", details=bad),
        rec("<b>vm</b>", T0 + 3, "control_refused", type=bad, details=bad),
        rec("<b>vm</b>", T0 + 4, "vm_failed", index=0, details={"nested": [bad]}),
    ]
    exp = {"barrier": {"start_time": T0 + 1, "expected": [bad]}, "resumes": [{"id": bad, "at": bad}]}
    page = render_report(records, exp, notes=[bad])
    assert page.count("<script") == 2  # only the page's own script
    assert "<img" not in page and "<b>vm" not in page and "<i>" not in page
    assert "\x1b" not in page and "\\x1b" in page
    page.encode("utf-8")  # no lone surrogate left
    svg = svg_of(page)  # well-formed XML despite everything
    assert max(len(title(e)) for e in svg.iter() if e.find(NS + "title") is not None) < 1000
    own = len(render_report([], {}))  # the page's own script, style and empty tables
    assert len(page) - own < 40_000  # every guest string was cut


def test_missing_fields_and_odd_records_never_crash():
    records: List[Any] = [
        "not a dict",
        {"vm": "a"},
        {"vm": "a", "event": "x"},
        {"vm": 3, "event": {}},
        {"vm": "a", "host_received": T0, "event": {"type": 7, "timestamp": "soon"}},
        {
            "vm": "a",
            "host_received": T0 + 1,
            "event": {"type": "entry_started", "timestamp": T0 + 1, "data": []},
        },
        {
            "vm": "a",
            "host_received": T0 + 2,
            "event": {"type": "entry_exited", "timestamp": None, "data": None},
        },
        {"vm": "a", "host_received": T0 + 3, "event": {"type": "stage_finished", "timestamp": 1e300}},
        {"vm": "a", "host_received": T0 + 3, "event": {"type": "resume_received", "timestamp": T0 + 3}},
        {
            "vm": "a",
            "host_received": T0 + 4,
            "event": {"type": "pause_ended", "timestamp": T0 + 4, "data": {}},
        },
        {
            "vm": "a",
            "host_received": T0 + 5,
            "event": {"type": "configured", "timestamp": T0 + 5, "data": {"at": float("nan")}},
        },
        rec("a", T0 + 6, "break_started", index=True, at=None),
        rec("a", T0 + 7, "entry_started", index=2, lateness="late", scheduled="x", spawned_at=-1e308),
        {"vm": "a", "host_received": T0 + 8, "event": {"type": "configured", "timestamp": 10**400}},
        rec("a", T0 + 9, "kpi", cpu_percent=10**400, mem_used=1.0, mem_total=10**400),  # malformed: counted
    ]
    exp = {"barrier": ["odd"], "resumes": "none", "start_set_at": "x"}
    page = render_report(records, exp)
    assert render_report(records, {"barrier": {"start_time": 10**400}, "start_set_at": 10**400})
    svg = svg_of(page)
    assert [g.get("data-vm") for g in lanes(svg)] == ["a"]
    # the absurd timestamp was replaced by the host's receive time: the scale stays sane
    assert float(svg.get("data-t1")) - float(svg.get("data-t0")) < 100
    assert "configured" in page and "start time</th><td>not set yet" in page


def test_no_start_yet_no_line_and_open_spans_drawn_open():
    records = [
        rec("a", T0, "stage_started", stage=0, start_time=-10, entries=[0]),
        rec("a", T0, "entry_started", index=0, executable="sleep"),
        rec("b", T0 + 5, "agent_started"),
    ]
    svg = svg_of(render_report(records, {}))
    assert not [e for e in svg.iter(NS + "line") if e.get("data-mark") == "start"]
    a = lane(svg, "a")
    (stage,) = of_class(a, "st")
    assert "not ended in the logs" in title(stage) and of_class(a, "open")
    (run,) = of_class(a, "e-running")
    assert right(run) == pytest.approx(x_of(svg, T0 + 5), abs=0.15)  # up to the last event of the logs


def test_vms_without_any_event_still_get_lanes():
    page = render_report([], {}, vms=["b", "a"])
    svg = svg_of(page)
    assert [g.get("data-vm") for g in lanes(svg)] == ["a", "b"]
    assert "no events in the logs yet" in page


def test_500_vms_render_in_reasonable_size_and_time_without_entry_labels():
    tl = ExperimentTimeline()
    for v in range(500):
        vm = f"vm{v:04d}"
        tl.add(rec(vm, T0, "stage_started", stage=0, start_time=-1))
        tl.add(rec(vm, T0 + 2 + v / 500, "stage_finished", stage=0, start_time=-1))
        tl.add(rec(vm, T0 + 2 + v / 500, "configured", at=T0 + 2 + v / 500))
        for i in range(10):
            s = T0 + 60 + i * 30
            tl.add(rec(vm, s, "entry_started", index=i, executable="/bin/true", scheduled=s, lateness=0.001))
            tl.add(
                rec(
                    vm, s + 20, "entry_exited", index=i, executable="/bin/true", status="success", exit_code=0
                )
            )
    began = time.monotonic()
    page = render_html(tl, {"barrier": {"start_time": T0 + 60, "buffer": 58}})
    took = time.monotonic() - began
    svg = svg_of(page)
    assert len(lanes(svg)) == 500
    assert sum(len(of_class(g, "e-success")) for g in lanes(svg)) == 5000
    assert not of_class(svg, "el", "text")  # over LABELS_UP_TO VMs: no per-entry labels
    assert len(page) < 6_000_000, len(page)
    assert took < 20, took
    # over COLLAPSE_OVER VMs, the ones that need no one start collapsed behind one lane
    rows = [d for d in svg.iter("div") if "tl-lane" in (d.get("class") or "").split()]
    assert sum(1 for d in rows if d.get("data-grp")) == 500 and "tl-collapsed" in svg.get("class")
    (agg,) = [d for d in rows if d.get("data-agg")]
    assert "500 more VMs" in "".join(agg.itertext())
    assert of_class(agg, "agg-e") and of_class(agg, "agg-st")


def test_entry_labels_for_few_vms():
    records = [
        rec("a", T0, "entry_started", index=7, executable="x", scheduled=T0),
        rec("a", T0 + 10, "entry_exited", index=7, status="success"),
    ]
    labels = [t.text for t in svg_of(render_report(records, {})).iter(NS + "text") if t.get("class") == "el"]
    assert labels == ["#7"]


def test_loader_streams_skips_bad_lines_and_a_cut_last_line(tmp_path):
    good = [rec("a", T0, "agent_started"), rec("a", T0 + 1, "configured", at=T0 + 1)]
    text = "".join(json.dumps(r) + "\n" for r in good[:1]) + "{not json\n[1]\n" + json.dumps(good[1]) + "\n"
    (tmp_path / "a.jsonl").write_text(text + '{"host_received": 1, "ev')
    (tmp_path / "b.jsonl").write_text("")
    notes: List[str] = []
    assert [r["event"]["type"] for r in read_jsonl(str(tmp_path / "a.jsonl"), notes)] == [
        "agent_started",
        "configured",
    ]
    assert notes == ["a.jsonl: a partial last line was ignored", "a.jsonl: 2 unreadable line(s) skipped"]
    (tmp_path / "experiment.json").write_text("[broken")
    out = tmp_path / "r.html"
    assert write_report(str(tmp_path), str(out), now=T0) == str(out)
    page = out.read_text()
    assert [g.get("data-vm") for g in lanes(svg_of(page))] == ["a", "b"]
    assert "partial last line" in page and "experiment.json: cannot read" in page


def test_cli_exit_2_without_logs_and_default_output(tmp_path, capsys):
    assert host_main(["report", "--logs", str(tmp_path)]) == 2
    assert "no <vm>.jsonl logs in" in capsys.readouterr().err
    assert host_main(["report", "--logs", str(tmp_path / "nosuch")]) == 2
    (tmp_path / "vm1.jsonl").write_text(json.dumps(rec("vm1", T0, "agent_started")) + "\n")
    assert host_main(["report", "--logs", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "report.html")
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_cli_says_why_out_cannot_be_written_naming_it_once(tmp_path, capsys, full_disk):
    """``report --out`` where it cannot be written: one line naming the file given (never the
    temp file it is written through), the cause and what to do, no traceback, exit 1; nothing
    left behind."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "vm1.jsonl").write_text(json.dumps(rec("vm1", T0, "agent_started")) + "\n")
    fill(full_disk)
    cases = {
        str(tmp_path / "nosuch" / "r.html"): f"there is no directory {tmp_path / 'nosuch'} (create it",
        str(tmp_path): f"--out {tmp_path} is a directory: name a file (e.g. --out {tmp_path}/report.html)",
        str(full_disk / "r.html"): "No space left on device (give --out a file in a directory you can write)",
    }
    for out, said in cases.items():
        assert host_main(["report", "--logs", str(logs), "--out", out]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and ".tmp" not in err, err
        assert err.startswith("vmr-host: error: ") and "Traceback" not in err and "Errno" not in err, err
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]  # no temp file left


def test_max_items_caps_what_one_vm_can_make_us_keep(monkeypatch):
    monkeypatch.setattr(report_fold, "MAX_ITEMS", 10)  # read where it is defined
    tl = ExperimentTimeline()
    for i in range(50):
        tl.add(rec("a", T0 + i, "entry_started", index=i, executable="x"))
    assert len(tl.vms["a"].runs) == 10 and tl.vms["a"].dropped == 40


def test_report_of_a_real_experiment_through_the_cli():
    sched = [
        {"start_time": -10, "executable": "sleep", "arguments": "0.3"},
        {"start_time": 0.3, "executable": "/bin/echo", "arguments": "first"},
        {"start_time": 0.5, "pause": True, "pause_duration": 0.5},
        {"start_time": 0.8, "executable": "/bin/sh", "arguments": "-c 'echo x; exit 3'"},
        {"start_time": 1, "pause": True, "pause_duration": ".inf"},
        {"start_time": 1.2, "executable": "/bin/echo", "arguments": "after the break"},
    ]
    env = HostEnv({"vm1": sched, "vm2": sched[:1] + sched[4:]}, start_buffer=0.5)
    try:
        env.start_host()
        env.start_agent("vm1")
        env.start_agent("vm2")
        env.wait_event("vm1", "break_started")
        env.wait_event("vm2", "break_started")
        res = env.cli("resume", "--all")
        assert res.returncode == 0, res.stderr
        for vm in ("vm1", "vm2"):
            env.wait_event(vm, "schedule_complete")
        res = env.cli("report")
        assert res.returncode == 0, res.stderr
        out = env.logs / "report.html"
        assert res.stdout.strip() == str(out)
        page = out.read_text()
        svg = svg_of(page)
        assert [g.get("data-vm") for g in lanes(svg)] == ["vm1", "vm2"]
        start = json.loads((env.logs / "experiment.json").read_text())["barrier"]["start_time"]
        line = mark(svg, "start")
        assert float(line.get("data-t")) == start
        assert float(line.get("x1")) == pytest.approx(x_of(svg, start), abs=0.06)
        for vm in ("vm1", "vm2"):
            resumed = env.wait_event(vm, "resume_received")["event"]["timestamp"]
            (brk,) = of_class(lane(svg, vm), "br")
            assert utc(svg, brk, "data-e") == pytest.approx(resumed, abs=1e-4)
            assert right(brk) == pytest.approx(x_of(svg, resumed), abs=0.15)
            assert len(of_class(lane(svg, vm), "st")) == 1
        vm1 = lane(svg, "vm1")
        assert len(of_class(vm1, "pa")) == 1 and len(of_class(vm1, "e-error")) == 1
        assert len(of_class(vm1, "e-success")) == 3
        assert "<th>RESUMEs issued</th><td>1</td>" in page
    finally:
        env.close()


def test_a_vm_that_fails_in_a_stage_ends_the_stage_there_in_red():
    # a VM that failed at t=-25 s: its stage ends there, not as an open bar to the end of the run
    records = [
        rec("a", T0, "stage_started", stage=0, start_time=-30, entries=[0]),
        rec("a", T0 + 5, "vm_failed", index=0, status="error", details="entry 0 could not start"),
        rec("b", T0 + 60, "agent_started"),
    ]
    html = render_report(records, {})
    svg = svg_of(html)
    a = lane(svg, "a")
    assert not of_class(a, "st") and not of_class(a, "open")
    (stage,) = of_class(a, "stf")
    assert right(stage) == pytest.approx(x_of(svg, T0 + 5), abs=0.15)  # ends at the failure
    assert "ended here: the VM failed" in title(stage)
    assert "stage ended by a failure" in html  # in the legend


# ---------------------------------------------------------------------------- the timeline fold
def fold(records: List[Dict[str, Any]]) -> ExperimentTimeline:
    tl = ExperimentTimeline()
    for r in records:
        tl.add(r)
    return tl


def lane_divs(svg: ET.Element) -> List[ET.Element]:
    return [d for d in svg.iter("div") if "tl-lane" in (d.get("class") or "").split() and d.get("data-vm")]


def test_problems_first_then_by_name_and_counts_per_state_that_filter():
    sched = "schedule-" + "0" * 32
    records = [
        rec("c1", T0, "schedule_complete"),
        rec("c0", T0, "schedule_complete"),
        rec("b", T0, "break_started", index=3, at=5.0),
        rec("i", T0, "entry_started", index=1, executable="x"),
        rec("i", T0 + 1, "entry_interrupted", index=1, executable="x", details="the agent stopped"),
        rec("w", T0, "entry_exited", index=1, executable="x", exit_code=1, status="error"),
        rec("w", T0 + 1, "schedule_complete"),
        rec("r", T0, "result", answers=sched, status="error", details="entry 3: unknown key"),
        rec("f", T0, "vm_failed", index=0, details="entry 0 could not start"),
        rec(
            "a", T0, "result", answers="resume-1", status="error", details="not at a break"
        ),  # not its schedule
    ]
    svg = svg_of(timeline_fragment(fold(records), {}))
    # the words of vmr-host status (host/model/stateword.py); problems first in their order
    assert [(d.get("data-vm"), d.get("data-cat"), d.get("data-problem")) for d in lane_divs(svg)] == [
        ("f", "failed", "1"),
        ("r", "schedule_rejected", "1"),
        ("a", "seen", "1"),  # heard from, no schedule accepted: a problem as in status
        ("i", "seen", "1"),
        ("w", "complete", "1"),  # complete with a failed entry: a problem
        ("b", "at_break", None),
        ("c0", "complete", None),
        ("c1", "complete", None),
    ]
    assert [lane.get("data-vm") for lane in lanes(svg)] == ["f", "r", "a", "i", "w", "b", "c0", "c1"]
    bar = next(d for d in svg.iter("div") if d.get("class") == "tl-bar")
    assert "".join(next(bar.iter("b")).itertext()) == "8 VMs:"
    buttons = [b for b in bar.iter("button") if b.get("class") == "tl-count"]
    assert [(b.text, b.get("data-cat")) for b in buttons] == [
        ("1 failed", "failed"),
        ("1 schedule rejected", "schedule_rejected"),
        ("2 seen", "seen"),
        ("1 at break", "at_break"),
        ("3 complete", "complete"),
    ]
    assert "5 problem(s)" in "".join(bar.itertext())
    assert next(bar.iter("input")).get("class") == "tl-filter"
    assert "entry 3: unknown key" in title(lane(svg, "r").find(NS + "rect"))  # why it was rejected


def test_an_entry_shows_its_command_exit_code_lateness_and_output_tail():
    cmd = "/usr/bin/iperf3 -c 10.0.0.7 -t 5 --json"
    records = [
        rec(
            "a",
            START + 1.25,
            "entry_started",
            index=2,
            executable="/usr/bin/iperf3",
            command=cmd,
            start_time=1.0,
            scheduled=START + 1.0,
            spawned_at=START + 1.25,
            lateness=0.25,
        ),
        *[
            rec(
                "a", START + 2, "output", index=2, stream="stdout", seq=i, line=f"{i:03d} " + "x" * 400 + "\n"
            )
            for i in range(12)
        ],
        rec("a", START + 2.1, "output", index=2, stream="stderr", seq=1, line_b64="YmFkIP8gYnl0ZQo="),
        rec(
            "a", START + 3, "entry_exited", index=2, executable="/usr/bin/iperf3", exit_code=3, status="error"
        ),
        rec(
            "a",
            START + 4.002,
            "entry_started",
            index=3,
            executable="/bin/true",
            command="/bin/true",
            start_time=4.0,
            scheduled=START + 4.0,
            spawned_at=START + 4.002,
            lateness=0.002,
        ),
    ]
    tl = fold(records)
    run = tl.vms["a"].runs[0]
    assert run.command == cmd and run.output == 13 and len(run.tail) == TAIL_LINES
    assert run.tail[-1] == "bad \\xff byte"  # line_b64: bytes that are not UTF-8 shown escaped
    assert run.tail[0].startswith("008 xxx") and all(len(t) <= TAIL_CHARS + 20 for t in run.tail)
    svg = svg_of(timeline_fragment(tl, {"barrier": {"start_time": START}}))
    a = lane(svg, "a")
    (err,) = of_class(a, "e-error")
    tip = title(err)
    assert tip.startswith(f"a entry #2: {cmd}\nstatus: error, exit code 3\n")
    assert "lateness 250 ms (due " in tip and "t=+1 s)" in tip
    assert tip.endswith("13 output line(s), the last 5:\n| " + "\n| ".join(run.tail))
    # lateness drawn: a stub from when it was due to when it was spawned; not for 2 ms
    (late,) = of_class(a, "late")
    assert utc(svg, late) == pytest.approx(START + 1.0) and utc(svg, late, "data-e") == pytest.approx(
        START + 1.25
    )
    assert float(late.get("x")) == pytest.approx(x_of(svg, START + 1.0), abs=0.06)
    assert right(late) == pytest.approx(float(err.get("x")), abs=0.15)
    assert "late by 250 ms" in title(late)


def test_an_ignored_resume_is_marked_in_its_own_lane_and_every_mark_is_in_the_legend(tmp_path):
    records = [rec("a", T0, "resume_received", at=3.0, ended_break=None, ignored=True, details="no break")]
    svg = svg_of(timeline_fragment(fold([*records, rec("b", T0 + 1, "agent_started")]), {}))
    (ignored,) = of_class(lane(svg, "a"), "m-ignored", "circle")
    assert "RESUME ignored" in title(ignored) and not of_class(lane(svg, "b"), "m-ignored", "circle")
    # every class the lanes of a realistic experiment draw has its entry in the legend
    g = generate(str(tmp_path), 60)
    tl = ExperimentTimeline()
    for vm in g.vms:
        for r in read_jsonl(str(tmp_path / f"{vm}.jsonl"), []):
            tl.vm(vm).add(r)
    svg = svg_of(timeline_fragment(tl, json.loads((tmp_path / "experiment.json").read_text())))
    legend = next(d for d in svg.iter("div") if d.get("class") == "tl-legend")
    explained = {e.get("class") for e in legend.iter() if e.get("class")}
    shapes = {NS + t for t in ("rect", "path", "circle", "line")}
    drawn = {e.get("class") for g_ in lanes(svg) for e in g_.iter() if e.tag in shapes} - {"bg", "open"}
    axis = next(e for e in svg.iter(NS + "svg") if e.get("class") == "tl-axis")
    drawn |= {e.get("class") for e in axis.iter(NS + "path")}
    assert drawn - explained == set()
    assert {"late", "m-resume", "m-restart", "m-rejected", "e-interrupted", "stf"} <= drawn
    items = ["".join(li.itertext()) for li in legend.iter("span") if li.get("class") == "tl-li"]
    for words in ("RESUME ignored", "agent restart", "interrupted", "stage ended by a failure", "late start"):
        assert any(words in item for item in items), words


def test_generated_logs_fold_into_what_they_were_made_as(tmp_path):
    g = generate(str(tmp_path), 120, seed=7)
    tl = ExperimentTimeline()
    for vm in g.vms:
        for r in read_jsonl(str(tmp_path / f"{vm}.jsonl"), []):
            tl.vm(vm).add(r)
    assert {vm: tl.vms[vm].word(g.start) for vm in g.vms} == g.words()
    assert set(g.kinds.values()) == {
        "failed", "rejected", "with failures", "interrupted", "at break", "running", "complete",
    }  # fmt: skip
    svg = svg_of(timeline_fragment(tl, json.loads((tmp_path / "experiment.json").read_text())))
    divs = lane_divs(svg)
    assert sorted(d.get("data-vm") for d in divs if d.get("data-problem")) == g.problems()
    shown = [d.get("data-vm") for d in divs]
    lead = shown[: len(g.problems())]
    assert sorted(lead) == g.problems()  # problems first, in the order of the words
    assert [STATES.index(g.words()[vm]) for vm in lead] == sorted(STATES.index(g.words()[vm]) for vm in lead)
    assert all(of_class(lane(svg, vm), "late") for vm in g.late if g.kinds[vm] == "complete")
    assert all(of_class(lane(svg, vm), "m-restart", "path") for vm in g.restarts)


def test_the_title_is_the_experiments_name(tmp_path):
    page = render_report([rec("a", T0, "agent_started")], {"name": "<b>net-exp</b> 7"})
    assert (
        "<title>&lt;b&gt;net-exp&lt;/b&gt; 7</title>" in page
        and "<h1>&lt;b&gt;net-exp&lt;/b&gt; 7</h1>" in page
    )
    assert "<h1>vmr-handler experiment</h1>" in render_report([rec("a", T0, "agent_started")], {})
    (tmp_path / "a.jsonl").write_text(json.dumps(rec("a", T0, "agent_started")) + "\n")
    (tmp_path / "experiment.json").write_text(json.dumps({"name": "run 12"}))
    page = (tmp_path / "r.html").read_text() if write_report(str(tmp_path), str(tmp_path / "r.html")) else ""
    assert "<h1>run 12</h1>" in page and f"logs: {tmp_path}" in page


def test_kpi_sparklines_per_vm_in_the_table():
    records = [
        rec("a", T0 + 10 * i, "kpi", cpu_percent=float(10 * i), mem_used=5e8, mem_total=1e9, load=[1, 1, 1])
        for i in range(10)
    ] + [rec("a", T0 + 95, "kpi", cpu_percent=float("nan")), rec("b", T0, "agent_started")]
    tl = fold(records)
    assert tl.vms["a"].cpu.samples == 10 and tl.vms["a"].mem.last == pytest.approx(50.0)
    page = render_html(tl, {})
    row_a = next(line for line in page.splitlines() if line.startswith("<tr") and ' data-vm="a"' in line)
    row_b = next(line for line in page.splitlines() if line.startswith("<tr") and ' data-vm="b"' in line)
    cpu, mem = ET.fromstring(f"<r>{row_a}</r>").iter(NS + "svg")
    assert title(cpu) == "CPU: last 90 %, min 0 %, max 90 % (10 samples)"
    points = [tuple(map(float, p.split(","))) for p in next(cpu.iter(NS + "polyline")).get("points").split()]
    assert len(points) == 10 and points[0][1] > points[-1][1]  # rising CPU goes up the sparkline
    assert "memory used: last 50 %" in title(mem)
    assert row_b.count('<td class="kpi">-</td>') == 2


def test_kpi_series_stays_bounded_and_covers_the_whole_run():
    series = KpiSeries()
    for i in range(100_000):
        series.add(T0 + i, 40.0 if i < 50_000 else 60.0)
    points = series.values()
    assert len(points) <= KPI_POINTS + 1 and points[0][0] == T0 and points[-1][0] > T0 + 90_000
    values = [v for _, v in points]
    assert values[0] == 40.0 and values[-1] == 60.0 and (series.low, series.high) == (40.0, 60.0)
    assert sum(1 for v in values if 40 < v < 60) <= 2  # only where it switched


def test_the_fragment_is_what_the_console_embeds_with_open_spans_up_to_now():
    tl = fold(experiment_records())
    tl.add(rec("vm2", START + 1, "entry_started", index=1, executable="sleep", command="sleep 600"))
    text = timeline_fragment(tl, EXPERIMENT, now=START + 100, table_id="vms")
    for part in ("<html", "<head", "<body", "<script", "<style", "<h1"):
        assert part not in text
    svg = svg_of(text)  # well-formed XML
    assert svg.get("class") == "vmr-tl" and svg.get("data-table") == "vms"
    (running,) = of_class(lane(svg, "vm2"), "e-running")
    assert right(running) == pytest.approx(x_of(svg, START + 100), abs=0.15)  # a live experiment: up to now
    assert float(svg.get("data-t1")) > START + 100
    assert [lane.get("data-vm") for lane in lanes(svg)] == ["vm1", "vm2", "vm3"]  # vm3: expected, no log
    assert "sleep 600" in title(running)


def test_configured_last_is_the_vm_the_barrier_waited_for_not_an_excluded_late_joiner():
    barrier = {
        **EXPERIMENT["barrier"],
        # vm3 was excluded by the operator, then joined late: it configured after the start was set
        "configured": {"vm1": T0 + 3.6, "vm2": T0 + 5.0, "vm3": T0 + 40.0, "vm4": T0 + 4.0},
        "expected": ["vm1", "vm2", "vm3", "vm4"],
        "excluded": ["vm3"],
    }
    facts = Facts.read({**EXPERIMENT, "barrier": barrier}, ExperimentTimeline())
    assert facts.last_configured() == ("vm2", T0 + 5.0)
    # not excluded, but it configured after the host set the start (T0 + 5): it did not hold it
    late = {**barrier, "excluded": [], "configured": {**barrier["configured"], "vm3": T0 + 6.0}}
    assert Facts.read({**EXPERIMENT, "barrier": late}, ExperimentTimeline()).last_configured()[0] == "vm2"
