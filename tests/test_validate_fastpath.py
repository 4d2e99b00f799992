"""Validation at parse speed: a plain program entry takes a short path in
``validate_records`` that must give exactly the entry the full field checks give, and must
leave every record it cannot vouch for (an invalid one included) to the full checks."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List

import pytest

from vmr_handler.core.errors import ScheduleValidationError
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
