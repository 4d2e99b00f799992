"""Cost of signed control messages (vmr_handler/core/wire/signing.py): µs per sign and per verify.

    .venv/bin/python benchmarks/bench_signing.py [--tmp-root DIR]

For three event sizes (a RESUME, a 10 KiB and the largest inline 512 KiB schedule) it prints
the median time of: ``json.dumps`` of the event (the bare baseline), ``encode_message`` (what
the host does anyway to send it), ``sign``, ``Verifier.check`` of a redelivery (known id: no
disk write) and ``Verifier.check`` of a new id (includes the atomic, fsynced write of the
replay memory in ``--tmp-root``, which holds 100 ids). Never fails on slowness.

Then, per ``clock_resp``, what the host does in ``VmSession._on_clock_req`` from the
``t3`` stamp to the answer handed to the transport (build, sign when keyed, encode), unsigned and
signed, as the median / p99 of: that stamp-to-handoff time (the error ``t3`` would have without
a lead; the offset error is half of it), and the error left once ``t3`` is stamped ahead by
:class:`~vmr_handler.host.serve.session.clocklead.StampLead` (as the host does). And the agent's check of a
signed answer (``Verifier.authenticate`` + ``ClockAnswers.take``; after ``t4`` is stamped).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import tempfile
import time
from typing import Callable, List

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from vmr_handler.core.events import Event
from vmr_handler.core.wire import protocol as P
from vmr_handler.core.wire.clockanswers import ClockAnswers
from vmr_handler.core.wire.signing import Verifier, sign
from vmr_handler.host.serve.session.clocklead import StampLead


def median_us(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``fn()``, µs, over ``repeat`` calls (after 3 warm-up calls)."""
    for _ in range(3):
        fn()
    times: List[float] = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def schedule_event(size: int) -> Event:
    blob = os.urandom(size)
    data = {
        "format_hint": "yaml",
        "data_b64": base64.b64encode(blob).decode(),
        "sha256": "0" * 64,
        "size": size,
    }
    return Event(P.SCHEDULE, time.time(), "schedule-" + "0" * 32, {**data, "resources": {}})


def row(name: str, event: Event, repeat: int, key: Ed25519PrivateKey, state: str) -> str:
    """One printed line of figures for ``event``."""
    now = time.time()
    signed = sign(key, event, "vm1", now)
    verifier = Verifier(key.public_key(), state)
    for i in range(100):  # a realistic memory: 100 ids already accepted
        verifier.check(sign(key, Event(P.RESUME, now, f"old-{i}", {"at": i}), "vm1", now), "vm1", now)
    verifier.check(signed, "vm1", now)
    counter = iter(range(10**9))

    def check_new() -> None:
        fresh = Event(event.type, event.timestamp, f"new-{next(counter)}", event.data)
        verifier.check(sign(key, fresh, "vm1", now), "vm1", now)

    dumps = median_us(lambda: json.dumps(event.to_dict(), separators=(",", ":")), repeat)
    encode = median_us(lambda: P.encode_message([event], now), repeat)
    sign_us = median_us(lambda: sign(key, event, "vm1", now), repeat)
    verify = median_us(lambda: verifier.check(signed, "vm1", now), repeat)
    new = median_us(check_new, min(repeat, 200)) - sign_us
    os.unlink(state)
    return f"{name:<18}{dumps:>12.1f}{encode:>12.1f}{sign_us:>10.1f}{verify:>10.1f}{new:>13.1f}"


def _stats_us(values: List[float]) -> str:
    ordered = sorted(values)
    return f"{statistics.median(ordered) * 1e6:7.1f} / {ordered[int(len(ordered) * 0.99)] * 1e6:7.1f}"


def clock_resp_rows(key: Ed25519PrivateKey, repeat: int) -> List[str]:
    """Lines of figures for one ``clock_resp``: unsigned and signed, host and agent side."""
    lines = []
    for signed in (False, True):
        lead = StampLead()
        plain: List[float] = []
        left: List[float] = []
        for i in range(repeat + 20):
            t1 = time.time() - 0.001
            now = time.time()  # the host's code path (host/serve/session/session.py _on_clock_req)
            t3 = now + lead.value
            resp = Event(
                P.CLOCK_RESP,
                now,
                f"host-0123456789-{i:08d}",
                {"answers": f"req-{i}", "t1": t1, "t2": now, "t3": t3},
            )
            if signed:
                resp = sign(key, resp, "vm1", now)
            P.encode_message([resp], time.time())
            handed = time.time()
            lead.note(handed - now)
            if i >= 20:  # after the lead has a few measurements
                plain.append(handed - now)
                left.append(handed - t3)
        name = "clock_resp signed" if signed else "clock_resp plain"
        lines.append(f"{name:<18}  stamp->handoff {_stats_us(plain)}   t3 error with lead {_stats_us(left)}")
    verifier = Verifier(key.public_key(), None)
    answers = ClockAnswers(verifier, "vm1")
    checks: List[float] = []
    for i in range(repeat):
        answers.asked(f"req-{i}", 5.0)
        resp = sign(
            key,
            Event(P.CLOCK_RESP, 0.0, f"h-{i}", {"answers": f"req-{i}", "t1": 5.0, "t2": 6.0, "t3": 6.0}),
            "vm1",
            7.0,
        )
        t0 = time.perf_counter()
        answers.take(resp)
        checks.append(time.perf_counter() - t0)
    lines.append(f"{'clock_resp check':<18}  agent authenticate + take {_stats_us(checks)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--tmp-root", default=None, help="where the replay memory is written (file system matters)"
    )
    args = parser.parse_args()
    key = Ed25519PrivateKey.generate()
    tmp = tempfile.mkdtemp(prefix="bench-signing-", dir=args.tmp_root)
    state = os.path.join(tmp, "signed-ids.json")
    print(
        f"{'event':<18}{'json.dumps':>12}{'encode_msg':>12}{'sign':>10}{'verify':>10}{'verify+save':>13} µs"
    )
    print(
        row("resume", Event(P.RESUME, time.time(), "3f2a9c1e0b7d-00000042", {"at": 12.5}), 2000, key, state)
    )
    print(row("schedule 10 KiB", schedule_event(10 * 1024), 500, key, state))
    print(row("schedule 512 KiB", schedule_event(512 * 1024), 30, key, state))
    os.rmdir(tmp)
    print("\nper clock_resp, median / p99 µs (offset error = half the t3 error)")
    for line in clock_resp_rows(key, 3000):
        print(line)


if __name__ == "__main__":
    main()
