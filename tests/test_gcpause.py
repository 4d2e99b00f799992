""":func:`vmr_handler.core.gcpause.paused_gc`: the collector is off inside, and afterwards in the
state it was in before (on, or off because the caller turned it off), also after an error."""

from __future__ import annotations

import gc

import pytest

from vmr_handler.core.gcpause import paused_gc


def test_pauses_and_restores_even_on_error() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():  # nested: the inner exit must not turn it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), paused_gc():
        raise KeyError("x")
    assert gc.isenabled()


def test_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_objects_made_in_the_pause_stay_collectable_and_nothing_stays_frozen() -> None:
    """The block's objects are moved to the oldest generation, not frozen: a reference cycle
    made inside and dropped later is still collected by a full collection."""
    import weakref

    class Node:
        other: object = None

    collected = []
    with paused_gc():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the cyclic collector can free it
        weakref.finalize(a, collected.append, "a")
    assert gc.get_freeze_count() == 0
    del a, b
    gc.collect()
    assert collected == ["a"]
