"""Working dirs, dropped files' command lines and entry kinds of a schedule taken as columns
(``plan --json`` and ``check`` at parse speed) must be, value for value, what the per-entry
rules give: :func:`dropped_item` per entry, ``os.path.join`` of the reference layout with
``_N`` numbering, :func:`command_line` with ``os.path.normpath`` and ``shlex.quote``, and
``ScheduleEntry.kind``. The oracles below are those rules written entry by entry."""

from __future__ import annotations

import math
import os
import shlex
from typing import Dict, List, Optional, Sequence, Tuple, Union

from hypothesis import given, settings
from hypothesis import strategies as st

from vmr_handler.core.schedule import commands as cmd
from vmr_handler.core.schedule.model import (
    ContentDrop,
    EntryKind,
    FileDrop,
    PauseSpec,
    ResumeMark,
    ScheduleEntry,
    TransferOut,
)
from vmr_handler.core.timeline import build_plan, plan_columns, special_kinds

#: Start times that share working dirs, and the ones spelled by their own rule.
TIMES = [1.0, 2.5, -3.0, 1e-7, 2.0**53, 1e16, 1e17, -1e300, 7301.299999999999]
EXES = [
    "run.sh",
    "./run.sh",
    "sub/run.sh",
    "sub/../run.sh",
    "tool",
    "setup.sh",
    "/bin/true",
    "a b",
    "it's",
    None,
]
LOCATIONS = [
    "run.sh", "./run.sh", "sub/run.sh", "sub//run.sh/", "a/../run.sh", "../run.sh", "..", ".", "x/..",
    "tool", "setup.sh", "/abs/run.sh", "a b/run.sh", "q'uote", "ünï", "conf/app1.cfg",
]  # fmt: skip
FILENAMES = ["run.sh", "setup.sh", "tool", "other.bin"]
LAUNCH_DIRS = ["/var/launch", "/", "//net/x", "rel/dir", "/tmp/a b", "/tmp/it's", "/v/./w/../x"]

#: One entry: start time, executable, arguments, data items.
Row = Tuple[float, Optional[str], str, List[Union[ContentDrop, FileDrop, TransferOut]]]

_item = st.one_of(
    st.builds(ContentDrop, st.sampled_from(LOCATIONS), st.just(b"x"), st.booleans()),
    st.builds(FileDrop, st.sampled_from(LOCATIONS), st.sampled_from(FILENAMES), st.booleans()),
    st.builds(TransferOut, st.sampled_from(LOCATIONS), st.just(None), st.just(None)),
)
_entry = st.tuples(
    st.sampled_from(TIMES),
    st.sampled_from(EXES),
    st.sampled_from(["", "a b", "--x=1"]),
    st.lists(_item, max_size=3),
)


def entries_of(rows: Sequence[Row]) -> List[ScheduleEntry]:
    return [ScheduleEntry(i, t, exe, args, data=tuple(items)) for i, (t, exe, args, items) in enumerate(rows)]


def oracle_dirs(entries: Sequence[ScheduleEntry], launch_dir: str) -> Dict[int, str]:
    """The reference layout: ``<launch>/<start_time>/<name>``, then ``_1``, ``_2``..."""
    seen: Dict[str, int] = {}
    dirs: Dict[int, str] = {}
    for e in entries:
        name = os.path.basename(e.executable.rstrip("/")) or "entry" if e.executable else "data"
        name = "entry" if name in (".", "..") else name
        base = os.path.join(os.path.abspath(launch_dir), cmd.format_start_time(e.start_time), name)
        count = seen.get(base, 0)
        seen[base] = count + 1
        dirs[e.index] = base if count == 0 else f"{base}_{count}"
    return dirs


def oracle_lines(entries: Sequence[ScheduleEntry], launch_dir: str) -> Dict[int, str]:
    """The command line of every entry that runs a file it drops, entry by entry."""
    dirs = oracle_dirs(entries, launch_dir)
    lines: Dict[int, str] = {}
    for e in entries:
        item = cmd.dropped_item(e)
        if item is not None:
            path = item.location if os.path.isabs(item.location) else os.path.normpath(
                os.path.join(dirs[e.index], item.location)
            )  # fmt: skip
            lines[e.index] = f"{shlex.quote(path)} {e.arguments}" if e.arguments else shlex.quote(path)
    return lines


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(_entry, max_size=30))
def test_running_drops_are_dropped_items(rows: List[Row]) -> None:
    entries = entries_of(rows)
    expected = {e.index: cmd.dropped_item(e) for e in entries if cmd.dropped_item(e) is not None}
    found = cmd.running_drops(iter(entries))
    assert found == expected
    assert all(found[i] is expected[i] for i in expected)  # the very item, not an equal one


def test_running_drops_past_the_distinct_executables_grouped() -> None:
    """Many distinct relative executables: entry by entry, the same answer."""
    entries = [
        ScheduleEntry(i, 1.0, f"run{i % 40}.sh", data=(ContentDrop(f"run{i % 20}.sh", b"x"),))
        for i in range(200)
    ]
    drops = {e.index: e.data[0] for e in entries}
    expected = {
        i: d for i, d in drops.items() if isinstance(d, ContentDrop) and entries[i].executable == d.location
    }
    assert len(expected) == 100 and cmd.running_drops(entries) == expected


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(_entry, max_size=30), launch_dir=st.sampled_from(LAUNCH_DIRS), spelled=st.booleans())
def test_dropped_lines_are_the_command_lines(rows: List[Row], launch_dir: str, spelled: bool) -> None:
    entries = entries_of(rows)
    starts = [e.start_time for e in entries]
    columns = (starts, [e.executable for e in entries], [e.arguments for e in entries])
    texts = cmd.start_time_texts(starts) if spelled else None
    lines = cmd.dropped_lines(
        columns, {e.index: e.data for e in reversed(entries) if e.data}, launch_dir, texts
    )
    expected = oracle_lines(entries, launch_dir)
    assert lines == expected and list(lines) == sorted(expected)
    dirs = oracle_dirs(entries, launch_dir)
    assert lines == {i: cmd.command_line(entries[i], dirs[i]) for i in expected}


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(_entry, max_size=30), launch_dir=st.sampled_from(LAUNCH_DIRS), data=st.data())
def test_working_dirs_are_the_reference_layout(rows: List[Row], launch_dir: str, data: st.DataObject) -> None:
    entries = entries_of(rows)
    every = oracle_dirs(entries, launch_dir)
    assert cmd.working_dirs(entries, launch_dir) == every
    wanted = data.draw(st.lists(st.sampled_from(range(len(entries))), max_size=8) if entries else st.just([]))
    starts, exes = [e.start_time for e in entries], [e.executable for e in entries]
    assert cmd.working_dirs_of(starts, exes, wanted, launch_dir) == {i: every[i] for i in wanted}


def test_start_time_texts_are_format_start_time() -> None:
    values = [*TIMES, 0.0, -0.0, 3.0, -3.0, 2.0**53 - 1, 9999999999999998.0, math.inf, -math.inf, 1e-300]
    assert cmd.start_time_texts(values) == [cmd.format_start_time(v) for v in values]
    assert cmd.start_time_texts([2.5, 8.25]) == ["2.5", "8.25"]  # the C loop alone
    assert cmd.start_time_texts([]) == []


_special = st.one_of(
    st.builds(
        lambda t, exe, host: ScheduleEntry(0, t, exe, data=(ContentDrop("f", b"x"),), on_host=host),
        st.sampled_from([-2.0, 3.0]),
        st.sampled_from(["x", None]),
        st.booleans(),
    ),
    st.builds(
        lambda t, d: ScheduleEntry(0, t, data=(PauseSpec(d),), pause=True),
        st.sampled_from([-math.inf, 0.0, 4.0]),
        st.sampled_from([2.0, math.inf]),
    ),
    st.just(ScheduleEntry(0, -math.inf, data=(ResumeMark(),))),
    st.just(ScheduleEntry(0, -math.inf, data=(TransferOut("o", None, None), ResumeMark()))),
)


@settings(max_examples=200, deadline=None)
@given(specials=st.lists(_special, max_size=12), hosted=st.lists(st.booleans(), min_size=4, max_size=4))
def test_special_kinds_are_the_entries_kinds(specials: List[ScheduleEntry], hosted: List[bool]) -> None:
    others = {i: ScheduleEntry(i, e.start_time, e.executable, data=e.data, pause=e.pause, on_host=e.on_host)
              for i, e in enumerate(specials)}  # fmt: skip
    plain = [ScheduleEntry(len(others) + k, 5.0, "x", on_host=h) for k, h in enumerate(hosted)]
    hosts = [e.index for e in plain if e.on_host]
    expected: Dict[int, EntryKind] = {
        i: e.kind for i, e in others.items() if e.kind not in (EntryKind.NEGATIVE, EntryKind.POSITIVE)
    }
    expected.update(dict.fromkeys(hosts, EntryKind.HOST))
    kinds = special_kinds(others, hosts)
    assert kinds == expected
    entries = [*others.values(), *plain]
    assert special_kinds(others, hosts, [e.executable for e in entries]) == expected  # the column
    starts = [e.start_time for e in entries]
    for resumes in ([], [-math.inf, 10.0]):
        planned = plan_columns(starts, others, hosts, resumes, kinds)
        assert planned == plan_columns(starts, others, hosts, resumes)
        assert planned.plan() == build_plan(entries, resumes)
