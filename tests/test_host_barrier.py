"""The host's experiment start barrier: pure logic with plain numbers (UTC seconds)."""

from __future__ import annotations

import json
import math

import pytest

from vmr_handler.core.errors import InvalidArgument, SavedStateError
from vmr_handler.host.serve.experiment.barrier import Barrier, BarrierError


def test_start_is_last_configured_plus_buffer_and_waits_for_exactly_the_missing():
    b = Barrier(["a", "b", "c"], buffer=60)
    assert b.waiting_for() == ["a", "b", "c"]
    assert b.configure("b", 1000.0) is False
    assert b.waiting_for() == ["a", "c"]
    assert b.configure("a", 1002.0) is False
    assert b.waiting_for() == ["c"]
    assert b.start_time is None
    assert b.configure("c", 1005.5) is True  # the slowest completes the barrier
    assert b.start_time == 1005.5 + 60
    assert b.waiting_for() == []


def test_start_time_never_changes_and_late_joiners_get_it():
    b = Barrier(["a", "b"], buffer=10)
    b.configure("a", 100.0)
    b.configure("b", 200.0)
    assert b.start_time == 210.0
    assert b.configure("late", 500.0) is False  # a VM outside the barrier
    assert b.configure("a", 999.0) is False  # only the first configured time counts
    assert b.configured["a"] == 100.0
    assert b.start_time == 210.0
    with pytest.raises(BarrierError, match="already set"):
        b.release(300.0)
    with pytest.raises(BarrierError):
        b.restore_start(211.0)
    b.restore_start(210.0)
    assert b.start_time == 210.0


def test_unexpected_vm_does_not_complete_or_hold_the_barrier():
    b = Barrier(["a"], buffer=5)
    assert b.configure("intruder", 50.0) is False
    assert b.waiting_for() == ["a"]
    assert b.configure("a", 60.0) is True
    assert b.start_time == 65.0  # the intruder's time plays no part


def test_release_with_exclude_removes_vms_and_starts_when_nobody_else_is_missing():
    b = Barrier(["a", "b", "c"], buffer=30)
    b.configure("a", 100.0)
    assert b.release(150.0, exclude=["c"]) is None  # b still missing
    assert b.waiting_for() == ["b"]
    assert b.excluded == {"c"}
    assert b.configure("b", 160.0) is True
    assert b.start_time == 190.0
    # the excluded VM joins late: no change
    assert b.configure("c", 400.0) is False
    assert b.start_time == 190.0


def test_release_with_exclude_of_the_last_missing_starts_from_now():
    b = Barrier(["a", "b"], buffer=30)
    b.configure("a", 100.0)
    assert b.release(150.0, exclude=["b"]) == 180.0  # max(last configured 100, now 150) + 30
    assert b.waiting_for() == []


def test_plain_release_starts_without_everyone_missing():
    b = Barrier(["a", "b", "c"], buffer=20)
    b.configure("a", 100.0)
    assert b.release(130.0) == 150.0
    assert b.released == {"b", "c"}
    assert b.excluded == set()
    assert b.released_at == 130.0


def test_plain_release_with_nobody_missing_takes_the_later_of_last_configured_and_now():
    # every VM configured but the start not set yet can only happen via restore; emulate the
    # "nobody missing" case with a VM whose configured time is in the future of `now`
    b = Barrier(["a", "b"], buffer=20)
    b.configure("a", 100.0)
    assert b.release(90.0) == 120.0  # last configured (100) is later than now (90)
    b2 = Barrier(["a"], buffer=20)
    assert b2.release(50.0) == 70.0  # nobody configured at all: now + buffer


def test_release_rejects_unknown_names():
    b = Barrier(["a"], buffer=1)
    with pytest.raises(BarrierError, match="not an expected VM"):
        b.release(1.0, exclude=["zz"])
    assert b.start_time is None and b.excluded == set()


def test_excluding_everyone_starts():
    b = Barrier(["a", "b"], buffer=2)
    assert b.release(10.0, exclude=["a", "b"]) == 12.0


def test_buffer_zero_and_bad_values():
    b = Barrier(["a"], buffer=0)
    b.configure("a", 7.25)
    assert b.start_time == 7.25
    with pytest.raises(InvalidArgument):
        Barrier(["a"], buffer=-1)
    with pytest.raises(InvalidArgument):
        Barrier(["a"], buffer=math.inf)
    with pytest.raises(InvalidArgument):
        Barrier(["a"], buffer=1).configure("a", math.nan)


def test_round_trip_keeps_start_and_exclusions_and_applies_todays_expected_set():
    b = Barrier(["a", "b", "c"], buffer=60)
    b.configure("a", 1.0)
    b.release(5.0, exclude=["c"])
    saved = json.loads(json.dumps(b.to_dict()))
    r = Barrier.from_dict(saved, ["a", "b", "c"], 60)
    assert r.configured == {"a": 1.0}
    assert r.excluded == {"c"}
    assert r.waiting_for() == ["b"]
    assert r.configure("b", 9.0) is True and r.start_time == 69.0
    # once set, a restored barrier keeps it even with another buffer
    r2 = Barrier.from_dict(json.loads(json.dumps(r.to_dict())), ["a", "b", "c"], 5)
    assert r2.start_time == 69.0
    assert r2.configure("c", 100.0) is False and r2.start_time == 69.0


def test_restore_completes_a_start_that_was_not_saved():
    saved = {"configured": {"a": 10.0, "b": 12.0}, "start_time": None}
    r = Barrier.from_dict(saved, ["a", "b"], 3)
    assert r.start_time == 15.0


@pytest.mark.parametrize(
    "bad",
    [{"configured": []}, {"configured": {"a": "x"}}, {"excluded": "a"}, {"start_time": "soon"}],
)
def test_restore_rejects_a_bad_shape(bad):
    with pytest.raises(SavedStateError):
        Barrier.from_dict(bad, ["a"], 1)


def test_peer_placeholder_holds_the_start_until_the_peer_announces_its_vms():
    b = Barrier({"a", "host:h2"}, buffer=10)
    assert not b.configure("a", 100.0)
    assert b.waiting_for() == ["host:h2"]
    # h2 announces x (configured at 105) and y (not yet)
    assert not b.update_expected(add={"x", "y"}, remove={"host:h2"})
    assert not b.configure("x", 105.0)
    assert b.waiting_for() == ["y"]
    assert b.configure("y", 103.0)  # the last one to configure sets the start
    assert b.start_time == 115.0  # last configured (x at 105) + buffer
    assert not b.update_expected(add={"z"})  # nothing changes after the start
    assert "z" not in b.expected and b.start_time == 115.0


def test_announcement_that_completes_the_barrier_sets_the_start():
    b = Barrier({"a", "host:h2"}, buffer=1)
    b.configure("a", 50.0)
    b.configure("x", 60.0)  # reported before the announcement that names it
    assert b.update_expected(add={"x"}, remove={"host:h2"})
    assert b.start_time == 61.0


def test_the_log_line_names_a_few_waiting_vms_and_counts_the_rest() -> None:
    # one `configured` line per VM naming every VM still waiting was 441 MB of log at 9,900 VMs
    from vmr_handler.host.serve.experiment.barrier import waiting_text

    b = Barrier([f"vm{i:05d}" for i in range(10_000)], buffer=1.0)
    first = ", ".join(f"vm{i:05d}" for i in range(8))
    assert waiting_text(b) == f"{first} and 9,992 more"
    for i in range(9_997):
        assert not b.configure(f"vm{i:05d}", 100.0 + i)
    assert b.waiting_count() == 3 and waiting_text(b) == "vm09997, vm09998, vm09999"
    with pytest.raises(BarrierError, match=r"\(expected: vm00000, .*, vm00007 and 9,992 more\)"):
        b.release(20_000.0, exclude=["nope"])  # an error names a few, not all 10 000
    b.release(20_000.0, exclude=["vm09999"])
    assert b.waiting_count() == 2 and b.start_time is None
    assert not b.configure("vm09997", 20_001.0)
    assert b.configure("vm09998", 20_002.0) and b.start_time == 20_003.0
    assert waiting_text(b) == "nobody" and b.waiting_count() == 0


def test_the_kept_waiting_list_always_equals_the_sets() -> None:
    # the sorted list of waiting VMs is kept by configure() and dropped by every other change:
    # after any sequence it must say exactly what the sets say
    import random

    rng = random.Random(16)
    for _ in range(200):
        names = [f"vm{i}" for i in range(rng.randint(1, 12))]
        b = Barrier(rng.sample(names, rng.randint(1, len(names))), buffer=1.0)
        for step in range(rng.randint(1, 15)):
            if b.start_time is not None:
                break
            pick = rng.random()
            if pick < 0.6:
                b.configure(rng.choice([*names, "stranger"]), 100.0 + step)
            elif pick < 0.8:
                b.update_expected(add=rng.sample(names, 1), remove=rng.sample(names, 1))
            elif b.expected:
                b.release(200.0 + step, exclude=rng.sample(sorted(b.expected), 1))
            if b.start_time is None:
                want = sorted((b.expected - b.excluded) - b.configured.keys())
                assert b.waiting_for() == want and b.waiting_count() == len(want)
                active = len(b.expected - b.excluded)
                assert b.progress() == (active - len(want), active)
