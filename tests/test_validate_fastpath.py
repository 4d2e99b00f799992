"""Validation at parse speed: a plain program entry takes a short path in
``validate_records`` that must give exactly the entry the full field checks give, and must
leave every record it cannot vouch for (an invalid one included) to the full checks."""

from __future__ import annotations

import builtins
import dataclasses
import math
import random
from typing import Any, Dict, List, Tuple

import pytest

from vmr_handler.core.errors import ScheduleValidationError
from vmr_handler.core.schedule import screen, validate
from vmr_handler.core.schedule.validate import _plain_entry, _Problems, validate_record, validate_records

PLAIN: List[Dict[str, Any]] = [
    {"start_time": 1, "executable": "/bin/true"},
    {"start_time": -3.5, "executable": "run.sh", "arguments": "a b 'c'"},
    {"start_time": 2.0, "executable": "x", "arguments": None, "ignore_failure": True, "on_host": False},
    {"start_time": 7, "executable": None, "data": []},
    {"start_time": 9, "executable": "y", "data": None, "ignore_failure": None, "on_host": True},
    {"start_time": -(2**52), "executable": "big"},
    # what the reference's pickles carry (tests/refpickle.py reference_record)
    {
        "start_time": 3,
        "ignore_failure": False,
        "data": [],
        "pause": None,
        "executable": "/bin/x",
        "arguments": "",
        "on_host": False,
    },
    {"start_time": 4, "executable": "z", "pause": False},
]

NOT_PLAIN: List[Any] = [
    # valid, but another shape: the full checks build these
    {"start_time": 1, "executable": "x", "data": [{"location": "a", "content": "b"}]},
    {"start_time": 5, "pause": True, "data": [{"pause_duration": 3}]},
    {"start_time": 5, "executable": "x", "pause": 0},
    {"start_time": 5, "pause_duration": "inf"},
    {"start_time": "1e3", "executable": "x"},
    {"start_time": 1, "executable": "x", "arguments": ["a", "b"]},
    {"start_time": 2**60, "executable": "x"},
    # invalid: the full checks report them
    {"start_time": 0, "executable": "x"},
    {"start_time": math.inf, "executable": "x"},
    {"start_time": math.nan, "executable": "x"},
    {"start_time": True, "executable": "x"},
    {"executable": "x"},
    {"start_time": 1, "executable": ""},
    {"start_time": 1, "executable": "a\x00b"},
    {"start_time": 1, "executable": 3},
    {"start_time": 1, "executable": "x", "arguments": "a\x00"},
    {"start_time": 1, "executable": "x", "ignore_failure": "yes"},
    {"start_time": 1, "executable": "x", "on_host": 1},
    {"start_time": 1, "executable": "x", "data": ""},
    {"start_time": 1, "executable": "x", "data": {}},
    {"start_time": 1, "executable": "x", "extra": 1},
    ["start_time", 1],
]


@pytest.mark.parametrize("record", PLAIN)
def test_a_plain_entry_is_the_entry_the_full_checks_make(record: Dict[str, Any]) -> None:
    fast = _plain_entry(4, record)
    full = validate_record(4, record, strict_fields=True, problems=_Problems(), warnings=[])
    assert fast is not None and full is not None
    assert fast == full and hash(fast) == hash(full) and repr(fast) == repr(full)
    assert {f.name: type(getattr(fast, f.name)) for f in dataclasses.fields(fast)} == {
        f.name: type(getattr(full, f.name)) for f in dataclasses.fields(full)
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.start_time = 3.0  # type: ignore[misc]


@pytest.mark.parametrize("record", NOT_PLAIN)
def test_anything_else_is_left_to_the_full_checks(record: Any) -> None:
    assert _plain_entry(0, record) is None


def test_an_invalid_entry_among_plain_ones_is_still_reported_by_name() -> None:
    records = [*PLAIN, {"start_time": 0, "executable": "/bin/late"}]
    with pytest.raises(ScheduleValidationError) as err:
        validate_records(records, strict_fields=True)
    assert f"entry {len(PLAIN)} ('/bin/late')" in str(err.value)
    assert "barrier" in str(err.value)


# ---------------------------------------------------------------------------- plain drop entries
#: Data items: plain drops (content text, non-ASCII text, bytes, file drops, flags true/false/
#: null/absent), and everything the full checks must see instead (other shapes, wrong types,
#: empty or NUL strings, missing or extra keys, null values, a non-dict).
DROP_ITEMS: List[Any] = [
    {"location": "run.sh", "content": "#!/bin/sh\n", "executable": True},
    {"location": "conf/app.cfg", "content": "k=v\n"},
    {"content": "\u00e9t\u00e9 \u2713", "location": "/etc/motd", "executable": None},
    {"location": "b.bin", "content": b"\x00\x01", "executable": False},
    {"location": "ba.bin", "content": bytearray(b"ab")},
    {"location": "setup.sh", "filename": "setup.sh", "executable": True},
    {"filename": "tool.tgz", "location": "/opt/tool.tgz"},
    {"location": "out.log", "interval": 5},
    {"pause_duration": 3},
    {"resume": True},
    {"location": "", "content": "x"},
    {"location": "a\x00", "content": "x"},
    {"location": None, "content": "x"},
    {"location": 3, "filename": "f"},
    {"location": "a", "filename": ""},
    {"location": "a", "filename": None},
    {"location": "a", "filename": "f\x00"},
    {"location": "a", "content": None},
    {"location": "a", "content": 7},
    {"location": "a", "content": "x", "executable": "yes"},
    {"location": "a", "content": "x", "filename": "f"},
    {"location": "a", "content": "x", "mode": 1},
    {"location": "a"},
    {"content": "x"},
    {1: "a", "content": "x"},
    ["location", "a"],
]
SHARED = "shared text \u00e9" * 3  # one object in many items, as a pickle's memo or a YAML alias gives


def drop_records(rng: random.Random, n: int, valid: bool) -> List[Any]:
    """Records that run a program or not and drop 1-3 items, most of them plain drops; with
    ``valid``, everything in them is valid (plain or not: a transfer, a start time as text,
    argument lists), else a few of them hold something the full checks refuse."""
    good_items, good_times = DROP_ITEMS[:8], [1, -2, 2.5, 7, "3", 2**60]
    records: List[Any] = []
    for i in range(n):
        record: Dict[str, Any] = {"start_time": rng.choice(good_times), "executable": "/bin/x"}
        if rng.random() < 0.3:
            record["executable"] = rng.choice([None, "run.sh"] if valid else [None, "", 5])
        items = [dict(rng.choice(good_items)) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.1:
            items[0] = {"location": f"s{i}", "content": SHARED}
        if not valid and rng.random() < 0.3:
            items[-1] = rng.choice(DROP_ITEMS)
        record["data"] = items
        extras: Tuple[Tuple[str, List[Any]], ...] = (
            ("on_host", [True, None, False]),
            ("ignore_failure", [True, None]),
            ("pause", [False, None]),
            ("arguments", ["a", "", None, ["x", "y"]]),
        )
        for key, values in extras:
            if rng.random() < 0.2:
                record[key] = rng.choice(values if valid else [*values, 1, "no"])
        if not valid and rng.random() < 0.1:
            record["start_time"] = rng.choice([0, "soon", math.inf])
        records.append(record)
    return records


def full_path(
    records: List[Any], monkeypatch: pytest.MonkeyPatch, strict_fields: bool = True
) -> Tuple[Any, List[str]]:
    """What validation gives with every drop entry through the full checks (no drop screen)."""
    with monkeypatch.context() as patch:
        patch.setattr(screen, "screen_drops", lambda lists, room: None)
        return outcome(records, strict_fields)


def outcome(records: List[Any], strict_fields: bool = True) -> Tuple[Any, List[str]]:
    """``(entries and warnings, [])`` or ``(None, the problems)`` of :func:`validate_records`."""
    try:
        return validate_records(records, strict_fields=strict_fields), []
    except ScheduleValidationError as exc:
        return None, exc.problems


@pytest.mark.parametrize("strict_fields", [True, False])
@pytest.mark.parametrize("seed", range(40))
def test_drop_entries_screened_are_those_the_full_checks_make(
    seed: int, strict_fields: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valid or not, a schedule with drops gives the same entries (equal, same repr and field
    types) or the same problems, in order, with and without the drop screen."""
    rng = random.Random(seed)
    valid = seed % 4 != 0
    records = drop_records(rng, rng.randint(1, 30), valid)
    fast, full = outcome(records, strict_fields), full_path(records, monkeypatch, strict_fields)
    assert fast == full
    assert (fast[0] is not None) == valid
    if fast[0] is not None:
        assert [repr(e) for e in fast[0][0]] == [repr(e) for e in full[0][0]]
        types = [[type(v) for item in e.data for v in vars(item).values()] for e in fast[0][0]]
        assert types == [[type(v) for item in e.data for v in vars(item).values()] for e in full[0][0]]


def test_a_plain_drop_entry_takes_no_field_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """100 entries that drop files (content, non-ASCII, bytes, a VM resource): none goes
    through the field checks; the entries are those the full checks make."""
    records = [
        {"start_time": 1 + k, "executable": "run.sh", "data": [dict(DROP_ITEMS[k % 7])]} for k in range(100)
    ]
    want = full_path(records, monkeypatch)
    monkeypatch.setattr(validate, "validate_record", lambda *a, **k: pytest.fail("a field check ran"))
    assert outcome(records) == want and want[0] is not None


@pytest.mark.parametrize("limit", [60, 90, 200])
def test_limits_reached_with_plain_drops_are_the_full_checks_errors(
    limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Contents over the expanded-size limit, and a later entry that takes the schedule over
    it: the same error, naming the same entry, field and totals."""
    monkeypatch.setattr(validate, "expanded_limit", lambda size: limit)
    records: List[Any] = [
        {"start_time": 1 + k, "executable": "/bin/x", "data": [{"location": "a", "content": "\u00e9" * 10}]}
        for k in range(4)
    ]
    records.insert(2, {"start_time": 9, "executable": "/bin/y", "arguments": ["a" * 20, "b"]})
    fast, full = outcome(records), full_path(records, monkeypatch)
    assert fast == full
    assert limit == 200 or "over the limit of" in fast[1][-1]


def test_drop_lists_over_the_item_limit_are_never_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    """One list of 1 000 drops shared by 2 000 entries (a YAML alias, a pickle memo): 2 million
    items, over the limit of 1 000 000. The screen leaves them to the full checks, which charge
    each list before visiting it, without expanding them first; so is an item with many keys."""
    shared = [{"location": "a", "content": "lol"}] * 1000
    monkeypatch.setattr(screen, "chain", lambda *a: pytest.fail("the lists were expanded"))
    assert screen.screen_drops([shared] * 2000, 10**9) is None
    monkeypatch.undo()
    wide = {"location": "a", "content": "x", **{f"k{i}": i for i in range(1000)}}
    copied = []
    monkeypatch.setattr(
        screen, "tuple", lambda item: copied.append(len(item)) or builtins.tuple(item), raising=False
    )
    found = screen.screen_drops([[wide], [{"location": "b", "content": "y"}]], 10**9)
    monkeypatch.undo()
    assert found is not None and found.data[0] is None and found.data[1] is not None
    assert copied and max(copied) <= 3
