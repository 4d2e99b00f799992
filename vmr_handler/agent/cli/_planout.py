"""``vmr-handler plan SCHEDULE --json`` at parse speed.

The JSON is the one ``json.dumps(plan_json(build_plan(...), command_lines(...)))`` gives
(:func:`vmr_handler.agent.cli.commandline.plan_json`), byte for byte, made without an object per entry:
the schedule is validated into columns (:func:`~vmr_handler.core.schedule.loader.load_schedule_columns`),
planned as columns (:func:`~vmr_handler.core.timeline.plan_columns`), and the text is joined
from one column of strings per field. The command line is parsed as every other one, by the
parser of the ``plan`` row of the command table (:data:`vmr_handler.agent.cli.commandline.COMMANDS`,
no logging set up), which hands a :class:`PlanRequest` to :func:`print_plan_json`.
tests/test_plan_fast.py compares this output with the object path on varied schedules.
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from itertools import repeat
from operator import sub
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, NamedTuple, Sequence, Tuple

if TYPE_CHECKING:
    from vmr_handler.core.schedule.validate import ScheduleColumns
    from vmr_handler.core.timeline import PlanColumns


class PlanRequest(NamedTuple):
    """``plan SCHEDULE --json``: the schedule file, the ``--resume`` times (experiment seconds,
    in the order given; ``-inf``: before the start), the launch dir of the command lines and the
    extra pickle class names admitted (``--allow-class``)."""

    schedule: str
    resumes: List[float]
    launch_dir: str
    allow_classes: List[str]


def print_plan_json(request: PlanRequest) -> int:
    """Print the ``plan --json`` object of ``request`` on stdout (one line). Returns 0.

    Raises:
        ScheduleError: the schedule cannot be read or is not valid (as ``load_schedule``).
    """
    from vmr_handler.core.gcpause import paused_gc

    write = sys.stdout.write
    with paused_gc():  # with the schedule's objects alive, collection passes cost more than the text
        for part in plan_json_parts(request):
            write(part)  # piece by piece: the whole text at once costs page faults (_CHUNK)
    write("\n")
    return 0


def plan_json_output(request: PlanRequest) -> str:
    """The ``plan --json`` text of ``request``: ``json.dumps(plan_json(plan, commands))`` of the
    schedule's plan (stored RESUME entries count as RESUMEs before the start, before the
    ``--resume`` ones) and the command line of every entry that runs one.

    Raises:
        ScheduleError: the schedule cannot be read or is not valid (as ``load_schedule``).
    """
    from vmr_handler.core.gcpause import paused_gc

    with paused_gc():
        return "".join(plan_json_parts(request))


def plan_json_parts(request: PlanRequest) -> Iterator[str]:
    """:func:`plan_json_output` in pieces (:func:`plan_parts`).

    Raises:
        ScheduleError: the schedule cannot be read or is not valid (as ``load_schedule``).
    """
    from vmr_handler.core.schedule.loader import load_schedule_columns
    from vmr_handler.core.schedule.model import EntryKind
    from vmr_handler.core.timeline import plan_columns, special_kinds

    schedule = load_schedule_columns(request.schedule, request.allow_classes)
    kinds = special_kinds(schedule.others, schedule.hosts, schedule.executables)
    stored = [-float("inf")] * list(kinds.values()).count(EntryKind.RESUME)  # stored RESUME entries
    resumes = [*stored, *request.resumes]
    plan = plan_columns(schedule.starts, schedule.others, schedule.hosts, resumes, kinds)
    return plan_parts(schedule, plan, request.launch_dir)


#: One entry of the text: the keys, each followed by its field (None here).
_ROW = (
    '}, {"index": ',
    None,
    ', "start_time": ',
    None,
    ', "kind": ',
    None,
    ', "fire_at": ',
    None,
    ', "command": ',
    None,
)


def plan_text(schedule: ScheduleColumns, plan: PlanColumns, launch_dir: str) -> str:
    """The ``plan --json`` text of ``plan`` (of ``schedule``), with the command line of every
    entry that runs one (working dirs under ``launch_dir``): :func:`plan_parts` joined."""
    return "".join(plan_parts(schedule, plan, launch_dir))


#: Entries per piece of the text. The strings of one piece (~120 KB) fit in the memory the
#: allocators keep for reuse; made all at once, the strings of 100 000 entries and their text
#: (~40 MB) cost ~30 ms of page faults, more than making them. Divides 1000.
_CHUNK = 500


def plan_parts(schedule: ScheduleColumns, plan: PlanColumns, launch_dir: str) -> Iterator[str]:
    """The pieces of :func:`plan_text`, in order, :data:`_CHUNK` entries a piece: one column of
    strings per field, the keys between them; no dict, no encoder call and no Python call per
    entry."""
    import json

    from vmr_handler.agent.cli.control_client import number_text

    n = len(plan.starts)
    resumes = json.dumps([{"at": number_text(r.at), "ended_break": r.ended_break} for r in plan.resumes])
    if not n:
        yield f'{{"entries": [], "resumes": {resumes}}}'
        return
    starts, dirs = _start_texts(plan.starts)
    kinds, commands = _kind_texts(plan), _command_texts(schedule, launch_dir, dirs)
    fire = ["null"] * n
    list(map(fire.__setitem__, plan.fired, number_texts(plan.fire_at)))
    yield '{"entries": [{"index": '
    for first in range(0, n, _CHUNK):
        end = min(n, first + _CHUNK)
        parts: List[Any] = list(_ROW) * (end - first)  # entry first + i: parts[10 i : 10 i + 10]
        parts[1::10] = _index_texts(first, end)
        parts[3::10] = starts[first:end]
        parts[5::10] = kinds[first:end]
        parts[7::10] = fire[first:end]
        parts[9::10] = commands(first, end)
        yield "".join(parts[1:] if first == 0 else parts)
    yield f'}}], "resumes": {resumes}}}'


#: ``000`` to ``999``.
_ENDS = [f"{i:03d}" for i in range(1000)]


def _index_texts(first: int, end: int) -> List[str]:
    """``str(i)`` for ``i`` in ``range(first, end)`` (not across a multiple of 1000): from
    1000 on, the thousands joined to three-digit ends (a concatenation costs less than an
    int's ``str``)."""
    if first < 1000:
        return list(map(str, range(first, end)))
    return list(map(str(first // 1000).__add__, _ENDS[first % 1000 : first % 1000 + end - first]))


def _start_texts(starts: Sequence[float]) -> Tuple[List[str], List[str]]:
    """The JSON of every start time (:func:`number_texts`) and its name in a working dir
    (:func:`~vmr_handler.core.schedule.commands.start_time_texts`): one repr each, the two
    differing only for 0, infinities and integral times past 2**53."""
    from vmr_handler.core.schedule.commands import format_start_time, trimmed_reprs

    texts, others = trimmed_reprs(starts, _EXACT)
    if not others:
        return texts, texts
    dirs = texts.copy()
    for index in others:
        texts[index] = _number_json(starts[index])
        dirs[index] = format_start_time(starts[index])
    return texts, dirs


def _kind_texts(plan: PlanColumns) -> List[str]:
    """``"<kind>", "stage": <stage or null>`` of every entry."""
    texts = ['"positive", "stage": null'] * len(plan.starts)
    stage = {t: f'"negative", "stage": {k}' for k, t in enumerate(plan.stages)}
    starts = plan.starts
    for index in plan.negative:
        texts[index] = stage[starts[index]]
    for index, kind in plan.kinds.items():
        texts[index] = f'"{kind._value_}", "stage": null'
    return texts


def _plain_texts(schedule: ScheduleColumns) -> bool:
    """True when no executable or arguments hold a character JSON escapes (``"``, ``\\``, a
    control or non-ASCII character): the JSON of their line is then the line in quotes."""
    return _plain("".join(filter(None, set(schedule.executables))) + "".join(schedule.arguments))


def _plain(text: str) -> bool:
    """True when JSON escapes no character of ``text``: its JSON is then ``text`` in quotes."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def _command_texts(
    schedule: ScheduleColumns, launch_dir: str, dirs: List[str]
) -> Callable[[int, int], List[str]]:
    """``texts(first, end)``: the JSON of the command lines of the entries ``first`` to
    ``end - 1`` (``null``: it runs none), as
    :func:`~vmr_handler.core.schedule.commands.command_lines` gives them: the executable as
    written and the arguments, or the dropped file's path where the executable names a file the
    entry drops (:func:`~vmr_handler.core.schedule.commands.dropped_lines`: working dirs
    computed only for those entries; ``dirs``: every start time as a working dir spells it).
    When nothing in them is escaped by JSON, a line's JSON is the line in quotes."""
    from json.encoder import encode_basestring_ascii as quoted

    from vmr_handler.core.schedule.commands import dropped_lines

    exes, args, plain = schedule.executables, schedule.arguments, _plain_texts(schedule)
    columns = (schedule.starts, exes, args)
    lines = dropped_lines(columns, schedule.datas(), launch_dir, dirs)  # ascending indices
    order, dropped = list(lines), list(lines.values())
    if order:  # their own lines are not made (then replaced)
        exes = list(exes)
        list(map(exes.__setitem__, order, repeat(None)))
    dropped = list(map(quoted, dropped))  # (C: less than checking the lines and quoting them)

    def texts(first: int, end: int) -> List[str]:
        pairs = zip(exes[first:end], args[first:end])
        if plain:
            lines = [(f'"{exe} {arg}"' if arg else f'"{exe}"') if exe else "null" for exe, arg in pairs]
        else:
            lines = ["null" if not exe else quoted(f"{exe} {arg}" if arg else exe) for exe, arg in pairs]
        low, high = bisect_left(order, first), bisect_left(order, end)
        list(map(lines.__setitem__, map(sub, order[low:high], repeat(first)), dropped[low:high]))
        return lines

    return texts


#: Integers a float holds exactly: an integral float inside is written as an integer.
_EXACT = float(2**53)


def number_texts(values: Sequence[float]) -> List[str]:
    """``json.dumps(number_text(v))`` of every number in ``values`` (floats; ints too):
    integral ones inside +-2**53 as integers, other finite ones as ``repr``, infinities as
    ``"inf"``/``"-inf"``: one C loop does nearly all
    (:func:`~vmr_handler.core.schedule.commands.trimmed_reprs`); 0 (also ``-0.0``),
    infinities, NaN and the numbers beyond take the slow path."""
    from vmr_handler.core.schedule.commands import trimmed_reprs

    texts, others = trimmed_reprs(values, _EXACT)
    for index in others:
        texts[index] = _number_json(values[index])
    return texts


def _number_json(value: Any) -> str:
    """``json.dumps(number_text(value))``, one value."""
    import json

    from vmr_handler.agent.cli.control_client import number_text

    return json.dumps(number_text(value))
