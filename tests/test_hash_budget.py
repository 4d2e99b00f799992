"""The per-VM budget of bytes the host hashes again for a guest.

A guest can make the host hash its files again at their last chunk (chunks out of order,
rewritten bytes); that runs in a worker thread, one file at a time per VM, but without a
budget one VM could keep a core busy. :class:`~vmr_handler.host.serve.session.intake.TransferIntake` spends
the missing bytes from a token bucket; a hash over the budget waits, the VM's later transfer
reports wait behind it, and it still completes. Real files, a real event loop and worker
threads; the budget and the deferred hash on a :class:`~vmr_handler.core.clock.FakeClock`, so
the hash starts at its exact instant.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from vmr_handler.core.clock import FakeClock
from vmr_handler.core.events import Event
from vmr_handler.host.model.vmstate import Counters
from vmr_handler.host.serve.files.transfers import TransferStore
from vmr_handler.host.serve.session.intake import TransferIntake

pytestmark = pytest.mark.faults

SIZE = 800


def _chunk(n: int, name: str, offset: int, data: bytes, whole: bytes, last: bool) -> Event:
    return Event(
        "transfer_chunk",
        1000.0 + n,
        f"id-{n}",
        {
            "location": name,
            "offset": offset,
            "data_b64": base64.b64encode(data).decode(),
            "size": len(whole),
            "sha256": hashlib.sha256(whole).hexdigest(),
            "last": last,
        },
    )


def test_hashing_over_the_budget_waits_and_still_completes_in_order(tmp_path: Path) -> None:
    """Two 799-byte hashes spend 1598 bytes of a 1000-byte burst at 1000 bytes/s: the third
    starts 0.598 s later on the host's clock, not a millisecond before."""
    clock = FakeClock()
    start = clock.time()
    stored: List[Tuple[str, Any]] = []
    remarks: List[str] = []
    store = TransferStore(str(tmp_path), "vm", max_file=10_000, max_total=100_000)
    store.open()
    intake = TransferIntake(
        store,
        Counters(),
        lambda kind, text, now: remarks.append(text),
        lambda events, now: stored.extend((e.id, e.data.get("details")) for e in events),
        budget=(1000.0, 1000.0),  # bytes/s, burst
        clock=clock,  # still until advanced: only what is spent counts
    )

    async def settle() -> None:
        """Until the hash under way (a worker thread) is done and logged."""
        for _ in range(400):
            if intake.status()["waiting"] == 0:
                return
            await asyncio.sleep(0.01)

    async def go() -> None:
        for k in range(3):  # each file sent out of order: its last chunk leaves SIZE-1 to hash
            whole = bytes([k]) * SIZE
            for ev in (
                _chunk(10 * k, f"f{k}", 1, whole[1:], whole, False),
                _chunk(10 * k + 1, f"f{k}", 0, whole[:1], whole, True),
            ):
                taken = intake.take(ev, 5.0)
                if taken is not None:
                    stored.append((taken.id, taken.data.get("details")))
            if k < 2:
                await settle()  # f0 and f1 fit in the burst: hashed at once
                assert intake.hash_waits == 0
        # 2 x 799 bytes spent of a 1000-byte burst: f2's 799 wait until the debt is paid
        assert intake.hash_waits == 1
        assert intake.status()["hash_waited_s"] == pytest.approx(0.598)
        assert intake.status()["waiting"] == 1  # f2's hash, not yet run
        assert [i for i, _ in stored][-1] == "id-20"  # its first chunk, stored; the last waits
        due = start + 0.598  # the debt of 598 bytes at 1000 bytes/s
        assert clock.next_timer() == due  # f2's hash starts then, on the host's clock
        await clock.advance_to(due - 0.001)
        assert clock.next_timer() == due and [i for i, _ in stored][-1] == "id-20"
        await clock.advance_to(due)  # the debt paid: the hash starts
        assert clock.next_timer() is None
        await settle()
        assert intake.status()["waiting"] == 0

    asyncio.run(go())
    assert [i for i, _ in stored] == ["id-0", "id-1", "id-10", "id-11", "id-20", "id-21"]
    assert [d for i, d in stored if i.endswith("1")] == ["complete"] * 3
    for k in range(3):
        assert (tmp_path / "transfers" / "vm" / f"f{k}").read_bytes() == bytes([k]) * SIZE
    assert any("hashing budget spent" in r for r in remarks)
