"""Unit tests of the protocol's pure parts: framing, validation, clock maths (docs/protocol.md)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmr_handler.core.events import Event
from vmr_handler.core.wire import protocol as P


def _ev(i: int, ts: float = 1.0, **data) -> Event:
    return Event("output", ts, f"id-{i}", data)


def test_roundtrip_and_seed001_shape():
    frame = P.encode_message([_ev(2, 2.0, line="b"), _ev(1, 1.0, line="a\n\x00")], now=0.5)
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1  # JSON never holds a raw newline
    doc = json.loads(frame)
    assert set(doc) == {"now", "events"}
    assert [e["id"] for e in doc["events"]] == ["id-1", "id-2"]  # ascending timestamps
    assert doc["now"] >= 2.0
    (msg,) = P.FrameDecoder().feed(frame)
    assert [e.data for e in msg.events] == [{"line": "a\n\x00"}, {"line": "b"}]


@given(st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=40))
@settings(deadline=None, max_examples=50)
def test_any_split_of_the_stream_decodes_the_same(cuts):
    frames = b"".join(P.encode_message([_ev(i, float(i), n=i)], now=float(i)) for i in range(20))
    decoder = P.FrameDecoder()
    got = []
    pos = 0
    for cut in cuts * 100:
        if pos >= len(frames):
            break
        got += decoder.feed(frames[pos : pos + cut])
        pos += cut
    got += decoder.feed(frames[pos:])
    assert [m.events[0].data["n"] for m in got] == list(range(20))


def test_garbage_is_counted_and_decoder_resyncs():
    good = P.encode_message([_ev(1)], now=1.0)
    rnd = random.Random(1).randbytes(5000).replace(b"\n", b"x")
    decoder = P.FrameDecoder()
    msgs = decoder.feed(b'half a frame {"now": ' + P.CONNECT_PREFIX + good + rnd + b"\n" + b"[1,2]\n" + good)
    assert len(msgs) == 2
    assert decoder.stats.malformed == 3  # partial frame, random bytes, a list


def test_oversize_frame_dropped_without_buffering():
    decoder = P.FrameDecoder(max_frame=1000)
    for _ in range(100):  # 100 KB of one frame, fed in pieces
        assert decoder.feed(b"a" * 1000) == []
        assert len(decoder._buf) <= 1000
    msgs = decoder.feed(b"tail\n" + P.encode_message([_ev(1)], now=1.0))
    assert len(msgs) == 1
    assert decoder.stats.oversize == 1


@pytest.mark.parametrize(
    "obj, words",
    [
        ([], "JSON object"),
        ({"events": []}, "now"),
        ({"now": 1, "events": {}}, "list"),
        ({"now": 1, "events": [{"timestamp": 1, "type": "x", "data": {}}]}, "id"),
        ({"now": 1, "events": [{"timestamp": "1", "type": "x", "id": "a"}]}, "timestamp"),
        (
            {
                "now": 1,
                "events": [
                    {"timestamp": 2, "type": "x", "id": "a"},
                    {"timestamp": 1, "type": "x", "id": "b"},
                ],
            },
            "ascending",
        ),
        ({"now": 1, "events": [{"timestamp": 1, "type": "x", "id": "a" * 200}]}, "id"),
        ({"now": 1, "events": [{"timestamp": 1, "type": "x", "id": "a", "data": []}]}, "data"),
        # integers JSON allows but no float holds (a guest's OverflowError used to end its session)
        ({"now": 10**400, "events": []}, "now"),
        ({"now": 1, "events": [{"timestamp": -(10**400), "type": "x", "id": "a"}]}, "timestamp"),
    ],
)
def test_bad_messages_name_the_problem(obj, words):
    with pytest.raises(P.ProtocolError, match=words):
        P.parse_message(obj)


def test_clock_sample_offset_and_min_delay_filter():
    # host clock is 5 s ahead; one-way delays 1 ms and 1 ms, host processing 0.5 ms
    s_good = P.ClockSample(t1=100.000, t2=105.001, t3=105.0015, t4=100.0025)
    assert s_good.offset == pytest.approx(5.0, abs=1e-9)
    assert s_good.delay == pytest.approx(0.002, abs=1e-9)
    # an asymmetric, slow exchange gives a worse offset and a larger delay
    s_bad = P.ClockSample(t1=100.0, t2=105.050, t3=105.0505, t4=100.0515)
    assert P.best_offset([s_bad, s_good]) is s_good
    assert P.best_offset([]) is None


def test_raw_message_from_stored_json_matches_and_sorts():
    events = [_ev(2, 2.0, line="b"), _ev(1, 1.0, line="a\x00\n")]
    raw = [(e.timestamp, json.dumps(e.to_dict(), separators=(",", ":")).encode()) for e in events]
    (a,) = P.FrameDecoder().feed(P.encode_raw_message(raw, now=0.5))
    (b,) = P.FrameDecoder().feed(P.encode_message(events, now=0.5))
    assert a == b and [e.id for e in a.events] == ["id-1", "id-2"]
