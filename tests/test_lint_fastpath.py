"""``check`` at parse speed: :func:`lint_schedule` skips an entry that drops nothing,
runs a found plain program and has plain arguments. It must give exactly the warnings, in
the order, that the per-entry checks give: the oracle below is the loop it replaced."""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pytest

from vmr_handler.core.schedule import commands as cmd
from vmr_handler.core.schedule import load_schedule_bytes
from vmr_handler.core.schedule.lint import _non_executable_drops, lint_schedule, syntax_error
from vmr_handler.core.schedule.loader import load_schedule_columns
from vmr_handler.core.schedule.model import ContentDrop, FileDrop, Schedule, ScheduleEntry
from vmr_handler.core.schedule.validate import ScheduleColumns


def oracle(schedule: Schedule, launch_dir: str, path: Optional[str], shell: str) -> List[str]:
    """Every entry through every check (the plain loop, no fast path), messages as lint_schedule."""
    workdirs: Dict[int, str] = {}
    warnings: List[str] = []
    non_executable = _non_executable_drops(schedule.entries)
    for entry in schedule.entries:
        if not entry.executable or entry.on_host:
            continue
        if entry.data and not workdirs:
            workdirs = cmd.working_dirs(list(schedule.entries), launch_dir)
        workdir = workdirs.get(entry.index, launch_dir)
        line = cmd.command_line(entry, workdir)
        word = cmd.first_word(line)
        own = cmd.dropped_item(entry)
        lookup = own is None and (os.path.isabs(word) or "/" not in word)
        if lookup and cmd.program_missing(word, launch_dir, path):
            warnings.append(f"{entry.label}: program {word!r} is not found")
        if own is not None:
            dropper = None if own.executable else entry.index
        else:
            dropper = non_executable.get(os.path.normpath(word)) if os.path.isabs(word) else None
        if dropper is not None:
            who = "it drops itself" if dropper == entry.index else f"entry {dropper} drops"
            warnings.append(f"{entry.label}: runs {word!r}, which {who} with executable: false")
        problem = syntax_error(line, shell)
        if problem is not None:
            warnings.append(f"{entry.label}: command line {line!r} is not valid shell syntax: {problem}")
    return warnings


def heads(warnings: List[str]) -> List[str]:
    """The part of each message the oracle spells the same way (up to the fixed explanation)."""
    out = []
    for w in warnings:
        cuts = (" is not found", " with executable: false", " is not valid shell syntax: ")
        for cut in cuts:
            if cut in w:
                out.append(w[: w.index(cut) + len(cut)] + (w.split(cut, 1)[1] if "syntax" in cut else ""))
                break
        else:
            out.append(w)
    return out


def schedule_of(records: List[Dict[str, Any]]) -> Schedule:
    return load_schedule_bytes(json.dumps(records).encode())


#: Executables and arguments that exercise every branch: found / missing programs, builtins,
#: env assignments, operators, quotes, relative and absolute paths, spaces in the executable.
EXES = [
    "/bin/true", "/bin/sh", "true", "sh", "cd", "echo;ls", "/no/such/prog", "no-such-prog-xyz",
    "A=b", "./rel.sh", "bin/tool", "/bin/sh -c", "'/bin/true'", '"quoted prog"', "/bin/true;",
    "/opt/x/tool", "run.sh", "mv", " ", "/bin/true\tx", "$(echo hi)", "a\\b",
]  # fmt: skip
ARGS = [None, "", "a b", "run 1", "x'y", '"ok"', "a && b", "| x", "$HOME", "(", "-v --x=1,2:3@4%5+6"]


def random_records(rng: random.Random, n: int) -> List[Dict[str, Any]]:
    records: List[Dict[str, Any]] = []
    for _ in range(n):
        rec: Dict[str, Any] = {"start_time": rng.choice([-5, -1, 1, 2.5, 7])}
        rec["executable"] = rng.choice(EXES)
        args = rng.choice(ARGS)
        if args is not None:
            rec["arguments"] = args
        roll = rng.random()
        if roll < 0.25:
            rec["data"] = own_drop_data(rng, rec)
            if rng.random() < 0.1:  # on the host: never linted, its drops still count
                rec["on_host"] = True
        elif roll < 0.3:  # drops a file it does not run
            rec["data"] = [{"location": rng.choice(["data.txt", "/opt/x/cfg"]), "content": "c"}]
        elif roll < 0.45:
            exe = rec["executable"]
            location = rng.choice([exe, "/opt/x/tool", "/bin/true", "rel.sh", "data.txt"])
            rec["data"] = [{"location": location, "content": "x", "executable": rng.random() < 0.5}]
        elif roll < 0.5:
            rec["on_host"] = True
        elif roll < 0.55:
            rec["executable"], rec["arguments"] = "mv", "/tmp/drop-src /opt/x/tool"
            rec["data"] = [{"location": "/tmp/drop-src", "content": "y", "executable": False}]
        records.append(rec)
    return records


#: Programs an entry drops and runs: plain, in a folder, with a space or shell syntax in the name.
OWN = ["setup.sh", "bin/run.sh", "./go.sh", "we ird.sh", "x$y.sh", "a'b.sh"]


def own_drop_data(rng: random.Random, rec: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The data of an entry that runs a file it drops: named by its location, its base name or
    the VM-resource file name, executable or not, after another drop or none."""
    exe = rec["executable"] = rng.choice(OWN)
    location = rng.choice([exe, f"sub/{os.path.basename(exe)}"])
    if rng.random() < 0.5:
        drop: Dict[str, Any] = {"location": location, "filename": exe}
    else:
        drop = {"location": location, "content": "#!/bin/sh\n"}
    roll = rng.random()
    if roll < 0.7:
        drop["executable"] = True
    elif roll < 0.85:
        drop["executable"] = False
    data = [drop]
    if rng.random() < 0.3:
        data.insert(0, {"location": "data.txt", "content": "d", "executable": rng.random() < 0.5})
    return data


@pytest.mark.parametrize("launch", ["launch", "launch dir", "it's"])
@pytest.mark.parametrize("seed", range(4))
def test_fast_path_gives_the_oracle_warnings(seed: int, launch: str, tmp_path: Path) -> None:
    """Every kind of entry, under launch dirs whose paths are plain, need quotes or break quotes."""
    rng = random.Random(seed)
    schedule = schedule_of(random_records(rng, 160))
    path = f"/bin:/usr/bin:{tmp_path}"
    shell = cmd.find_shell()
    tmp_path = tmp_path / launch
    got = lint_schedule(schedule, str(tmp_path), path, shell)
    want = oracle(schedule, str(tmp_path), path, shell)
    assert heads(got) == want
    assert want, "the random schedule exercises no warning at all"
    # ``check`` lints the schedule as columns (no object per plain entry): the same warnings
    assert lint_schedule(columns_of(schedule), str(tmp_path), path, shell) == got


def columns_of(schedule: Schedule) -> ScheduleColumns:
    """``schedule`` as ``check`` loads it (:func:`load_schedule_columns` of the same records)."""
    records = [entry_record(e) for e in schedule.entries]
    with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:
        json.dump(records, fh)
        fh.flush()
        return load_schedule_columns(fh.name)


def entry_record(entry: ScheduleEntry) -> Dict[str, Any]:
    """The JSON record of a program, pause, RESUME or data entry made by the tests here."""
    record: Dict[str, Any] = {"start_time": entry.start_time}
    if entry.pause:
        return {**record, "pause_duration": entry.pause_duration}
    if entry.is_resume:
        return {**record, "data": [{"resume": True}]}
    record.update(executable=entry.executable, arguments=entry.arguments, on_host=entry.on_host)
    record["data"] = [
        {"location": d.location, "executable": d.executable,
         **({"filename": d.filename} if isinstance(d, FileDrop) else {"content": d.content.decode()})}
        for d in entry.data if isinstance(d, (ContentDrop, FileDrop))
    ]  # fmt: skip
    return record


@pytest.mark.parametrize("seed", range(6))
def test_columns_give_the_schedule_s_stages_and_entries(seed: int) -> None:
    """What ``check`` says from columns (entries, stages) is what the schedule says."""
    rng = random.Random(seed)
    records = random_records(rng, 120)
    for _ in range(10):  # pauses and breaks (a break at -inf too), and a stored RESUME
        at = rng.choice([-math.inf, 0, 1, 4])
        records.insert(
            rng.randrange(len(records)), {"start_time": at, "pause_duration": rng.choice([1, "inf"])}
        )
    records.append({"start_time": -math.inf, "data": [{"resume": True}]})
    schedule = schedule_of(records)
    columns = columns_of(schedule)
    assert columns.source_format == "json"
    assert len(columns.starts) == len(schedule.entries)
    assert columns.stage_times() == schedule.stage_times()


def test_quiet_programs_are_found_once_and_warned_per_entry(tmp_path: Path) -> None:
    """The cache is per executable; the warnings stay per entry, in entry order."""
    records = [
        {"start_time": 1 + i, "executable": "/no/such/prog", "arguments": f"run {i}"} for i in range(3)
    ]
    records.insert(1, {"start_time": 9, "executable": "/bin/true", "arguments": "x 'y"})
    records.append({"start_time": 20, "executable": "/bin/true", "arguments": "plain"})
    warnings = lint_schedule(schedule_of(records), str(tmp_path), "/bin:/usr/bin", cmd.find_shell())
    assert [w.split(":")[0] for w in warnings] == [
        "entry 0 ('/no/such/prog')",
        "entry 1 ('/bin/true')",
        "entry 2 ('/no/such/prog')",
        "entry 3 ('/no/such/prog')",
    ]
    assert "not valid shell syntax" in warnings[1]


def test_a_program_dropped_non_executable_is_warned_even_without_data(tmp_path: Path) -> None:
    """An entry that drops nothing but runs a file another entry drops with executable: false."""
    records = [
        {"start_time": -1, "data": [{"location": "/opt/x/tool", "content": "x", "executable": False}]},
        {"start_time": 1, "executable": "/opt/x/tool"},
        {"start_time": 2, "executable": "/opt/x/tool", "arguments": "a b"},
    ]
    warnings = lint_schedule(schedule_of(records), str(tmp_path), "/bin:/usr/bin", cmd.find_shell())
    assert [w for w in warnings if "drops with executable: false" in w] == [
        w for w in warnings if w.startswith(("entry 1 ", "entry 2 ")) and "entry 0 drops" in w
    ]
    assert sum("which entry 0 drops with executable: false" in w for w in warnings) == 2


def test_a_program_an_entry_drops_itself_non_executable_is_warned(tmp_path: Path) -> None:
    """The entry runs the file it drops itself with executable: false (at a relative location,
    named by its resource file name or its location, or at an absolute one): exit 126 in
    FIREWHEEL 3.1.0 and here, so ``check`` warns; the same drops with executable: true do not."""
    records: List[Dict[str, Any]] = [
        {"start_time": -3, "executable": "wrap.sh",
         "data": [{"location": "wrap.sh", "filename": "wrap.sh"}]},
        {"start_time": -2, "executable": "run.sh", "data": [{"location": "bin/run.sh", "content": "x"}]},
        {"start_time": -1, "executable": "/opt/self.sh",
         "data": [{"location": "/opt/self.sh", "content": "y"}]},
        {"start_time": 1, "executable": "ok.sh",
         "data": [{"location": "ok.sh", "filename": "ok.sh", "executable": True}]},
        {"start_time": 2, "executable": "/opt/ok.sh",
         "data": [{"location": "/opt/ok.sh", "content": "z", "executable": True}]},
    ]  # fmt: skip
    schedule = schedule_of(records)
    warnings = lint_schedule(schedule, str(tmp_path), "/bin:/usr/bin", cmd.find_shell())
    own = [w for w in warnings if "with executable: false" in w]
    labels = ["entry 0 ('wrap.sh')", "entry 1 ('run.sh')", "entry 2 ('/opt/self.sh')"]
    assert [w.split(":")[0] for w in own] == labels
    assert f"runs '{tmp_path}/-3/wrap.sh/wrap.sh', which it drops itself with executable: false" in own[0]
    assert f"runs '{tmp_path}/-2/run.sh/bin/run.sh', which it drops itself" in own[1]
    assert "runs '/opt/self.sh', which it drops itself" in own[2]
    assert all("exits 126" in w and "set executable: true on that drop" in w for w in own)
    assert heads(warnings) == oracle(schedule, str(tmp_path), "/bin:/usr/bin", cmd.find_shell())


def test_entries_that_run_what_they_drop_plainly_cost_no_working_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry that runs a file it drops executable, at a plain path, with plain arguments,
    cannot get a warning wherever its working dir is: none is computed for it. Only the
    entries that may get one have their working dirs made."""
    records: List[Dict[str, Any]] = [
        {"start_time": 1 + i % 7, "executable": "setup.sh", "arguments": f"run {i}",
         "data": [{"location": "setup.sh", "filename": "setup.sh", "executable": True}]}
        for i in range(300)
    ]  # fmt: skip
    records += [
        {"start_time": 2, "executable": "/bin/true", "data": [{"location": "cfg", "content": "x"}]}
        for _ in range(50)
    ]
    schedule = schedule_of(records)
    asked: List[List[int]] = []
    real = cmd.working_dirs_of

    def counted(starts: Any, executables: Any, wanted: Any, launch_dir: str) -> Dict[int, str]:
        asked.append(sorted(wanted))
        return real(starts, executables, wanted, launch_dir)

    monkeypatch.setattr(cmd, "working_dirs", lambda *a: pytest.fail("every entry's working dir made"))
    monkeypatch.setattr("vmr_handler.core.schedule.lint.working_dirs_of", counted, raising=False)
    assert lint_schedule(schedule, str(tmp_path), "/bin:/usr/bin", cmd.find_shell()) == []
    assert asked == []
    # one of them drops it non-executable: its working dir alone is made, and it is warned
    records[12]["data"] = [{"location": "setup.sh", "filename": "setup.sh", "executable": False}]
    schedule = schedule_of(records)
    warnings = lint_schedule(schedule, str(tmp_path), "/bin:/usr/bin", cmd.find_shell())
    assert asked == [[12]]
    assert warnings == [
        f"entry 12 ('setup.sh'): runs '{tmp_path}/6/setup.sh_1/setup.sh', which it drops itself with "
        "executable: false; the file is left without its executable bits (as in FIREWHEEL 3.1.0), so the "
        "entry exits 126: set executable: true on that drop, or run the file through its interpreter "
        "(/bin/sh FILE)"
    ]


def non_executable_oracle(entries: Sequence[ScheduleEntry]) -> Dict[str, int]:
    """Entry by entry, item by item: the loop :func:`_non_executable_drops` replaced."""
    found: Dict[str, int] = {}
    for entry in entries:
        drops = [d for d in entry.data if isinstance(d, (ContentDrop, FileDrop)) and not d.executable]
        for drop in drops:
            if os.path.isabs(drop.location):
                found[os.path.normpath(drop.location)] = entry.index
        words = entry.arguments.split()
        moved = entry.executable == "mv" and len(words) == 2 and os.path.isabs(words[1])
        if moved and any(os.path.normpath(d.location) == os.path.normpath(words[0]) for d in drops):
            found[os.path.normpath(words[1])] = entry.index
    return found


@pytest.mark.parametrize("seed", range(6))
def test_non_executable_drops_read_as_columns_equal_the_entry_loop(seed: int) -> None:
    """Absolute drops, drops moved by ``mv``, the same path dropped by several entries (the
    later wins), transfers and pauses among the items."""
    rng = random.Random(seed)
    records = random_records(rng, 200)
    for _ in range(30):
        path = rng.choice(["/opt/x/tool", "/opt/x/cfg", "/opt//x/./cfg", "rel/cfg", "/tmp/drop-src"])
        data: List[Dict[str, Any]] = [{"location": path, "content": "c", "executable": rng.random() < 0.3}]
        if rng.random() < 0.3:
            data.append({"location": "/var/log/out.txt", "interval": 5})
        if rng.random() < 0.3:
            record = {
                "start_time": 3,
                "executable": "mv",
                "arguments": f"{path} /opt/moved/{rng.randrange(3)}",
            }
        else:
            record = {"start_time": -2, "executable": "/bin/true"}
        records.insert(rng.randrange(len(records)), {**record, "data": data})
    entries = schedule_of(records).entries
    want = non_executable_oracle(entries)
    assert _non_executable_drops([e for e in entries if e.data]) == want
    assert any(path.startswith("/opt/moved/") for path in want)
