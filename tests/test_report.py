"""``vmr-host report`` (SPEC section 8): the timeline HTML from hand-made records (the pure
renderer), the streaming loader, and one real experiment (HostEnv) rendered by the real CLI."""

from __future__ import annotations

import itertools
import json
import time
import xml.etree.ElementTree as ET
from typing import Any, Dict, List

import pytest

from tests.hostenv import HostEnv
from vmr_handler.host.cli import main as host_main
from vmr_handler.host.report import ExperimentTimeline, read_jsonl, render_html, render_report, write_report
from vmr_handler.host.report import fold as report_fold

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
    """The timeline ``<svg>`` element, parsed as XML (it must be well-formed)."""
    return ET.fromstring(html[html.index("<svg") : html.index("</svg>") + len("</svg>")])


def x_of(svg: ET.Element, t: float) -> float:
    """Where the renderer places UTC ``t`` (from the scale stated on the svg element)."""
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
    assert "state: no events" in title(lane(svg, "vm3").find(NS + "rect"))
    assert not of_class(lane(svg, "vm3"), "st") and not of_class(lane(svg, "vm3"), "e-success")
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_start_line_and_last_configured_line_are_where_experiment_json_puts_them(page):
    svg = svg_of(page)
    start = next(e for e in svg.iter(NS + "line") if e.get("id") == "start-line")
    assert float(start.get("data-t")) == START
    assert float(start.get("x1")) == pytest.approx(x_of(svg, START), abs=0.06)
    last = next(e for e in svg.iter(NS + "line") if e.get("id") == "last-configured")
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
    assert "3 output line(s)" in title(ok[0])
    assert "not found" in title(failed[0])
    assert float(ok[1].get("x")) == pytest.approx(x_of(svg_of(page), START + 1.002), abs=0.06)  # spawned_at


def test_pause_and_break_spans_break_ends_at_the_resume(page):
    svg = svg_of(page)
    vm1 = lane(svg, "vm1")
    (pause,) = of_class(vm1, "pa")
    assert float(pause.get("data-start")) == START + 5 and float(pause.get("data-end")) == START + 10
    assert right(pause) == pytest.approx(x_of(svg, START + 10), abs=0.15)
    (brk,) = of_class(vm1, "br")
    assert right(brk) == pytest.approx(x_of(svg, START + 20), abs=0.15)
    assert "ended by a RESUME stamped t=19.9" in title(brk)
    resume_line = [e for e in of_class(svg, "rl", "line") if e.get("data-t")]  # not the legend's
    assert len(resume_line) == 1 and float(resume_line[0].get("data-t")) == T0 + 29.9


def test_markers_configured_reboot_failed_refused_restart(page):
    svg = svg_of(page)
    kinds = {vm: sorted(p.get("class") for p in lane(svg, vm).iter(NS + "path")) for vm in ("vm1", "vm2")}
    assert kinds["vm1"] == ["m-configured", "m-failed"]
    assert kinds["vm2"] == ["m-configured", "m-reboot", "m-refused", "m-restart"]
    conf = of_class(lane(svg, "vm1"), "m-configured", "path")[0]
    assert conf.get("d").startswith(f"M{round(x_of(svg, T0 + 3.5), 1)},")


def test_summary_table_and_experiment_facts(page):
    row = next(line for line in page.splitlines() if line.startswith('<tr class="failed"><td>vm1</td>'))
    cells = [c.split(">", 1)[1] for c in row.split("</td>")[:-1]]
    # VM, state, configured at, stages, entries, lateness max, p50, failures, output lines, ...
    assert cells[1] == "failed"
    assert cells[2].endswith("t=-6.5 s")
    assert cells[3:9] == ["1", "4/4", "4 ms", "3 ms", "2", "3"]
    assert "no events" in next(line for line in page.splitlines() if "<td>vm3</td>" in line)
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
    assert "<script" not in page and "<img" not in page and "<b>vm" not in page and "<i>" not in page
    assert "\x1b" not in page and "\\x1b" in page
    page.encode("utf-8")  # no lone surrogate left
    svg = svg_of(page)  # well-formed XML despite everything
    assert max(len(title(e)) for e in svg.iter() if e.find(NS + "title") is not None) < 1000
    assert len(page) < 40_000  # every guest string was cut


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
    ]
    exp = {"barrier": ["odd"], "resumes": "none", "start_set_at": "x"}
    page = render_report(records, exp)
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
    assert not [e for e in svg.iter(NS + "line") if e.get("id") == "start-line"]
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
    assert float(svg.get("height")) < 4000


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
        line = next(e for e in svg.iter(NS + "line") if e.get("id") == "start-line")
        assert float(line.get("data-t")) == start
        assert float(line.get("x1")) == pytest.approx(x_of(svg, start), abs=0.06)
        for vm in ("vm1", "vm2"):
            resumed = env.wait_event(vm, "resume_received")["event"]["timestamp"]
            (brk,) = of_class(lane(svg, vm), "br")
            assert float(brk.get("data-end")) == resumed
            assert right(brk) == pytest.approx(x_of(svg, resumed), abs=0.15)
            assert len(of_class(lane(svg, vm), "st")) == 1
        vm1 = lane(svg, "vm1")
        assert len(of_class(vm1, "pa")) == 1 and len(of_class(vm1, "e-error")) == 1
        assert len(of_class(vm1, "e-success")) == 3
        assert "<th>RESUMEs issued</th><td>1</td>" in page
    finally:
        env.close()


def test_a_vm_that_fails_in_a_stage_ends_the_stage_there_in_red():
    # issue 14: a VM that failed at t=-25 s showed its stage as an open bar to the end of the run
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
