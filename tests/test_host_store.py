"""Unit tests of the host's on-disk stores: per-VM logs (de-dup, quota, crash tail),
transfer confinement and limits, the resource store. Real files in a temp dir, no sockets."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import psutil
import pytest

from vmr_handler.core.errors import TransferRefused
from vmr_handler.core.events import Event
from vmr_handler.host.logs.store import VmLog
from vmr_handler.host.logs.text import printable
from vmr_handler.host.serve.files.chunkhash import PendingHash
from vmr_handler.host.serve.files.resources import ResourceRefused, ResourceStore
from vmr_handler.host.serve.files.transfers import TransferStore


def _ev(i: int, type_: str = "output", **data) -> Event:
    return Event(type_, 1000.0 + i, f"id-{i}", data or {"line": f"line {i}", "stream": "stdout"})


def test_vmlog_writes_each_id_once_and_rebuilds_after_restart(tmp_path):
    log = VmLog(str(tmp_path), "vm", quota=1 << 30)
    log.open()
    new = log.write([(_ev(1), 5.0), (_ev(2), 5.0), (_ev(1), 5.0)])
    assert [e.id for e in new] == ["id-1", "id-2"] and log.duplicates == 1
    log.close()
    # a crash mid-line leaves a partial tail: cut at the next open
    with open(tmp_path / "vm.jsonl", "ab") as fh:
        fh.write(b'{"host_received": 6.0, "vm": "vm", "event": {"id": "id-3"')
    replayed = []
    log = VmLog(str(tmp_path), "vm", quota=1 << 30)
    log.open(replay=lambda e, t: replayed.append((e.id, t)))
    assert replayed == [("id-1", 5.0), ("id-2", 5.0)]
    assert log.write([(_ev(2), 7.0), (_ev(3), 7.0)])[0].id == "id-3"
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "vm.jsonl").read_text().splitlines()]
    assert [r["event"]["id"] for r in lines] == ["id-1", "id-2", "id-3"]
    assert lines[0] == {"host_received": 5.0, "vm": "vm",
                        "event": {"timestamp": 1001.0, "type": "output", "id": "id-1",
                                  "data": {"line": "line 1", "stream": "stdout"}}}  # fmt: skip
    assert "line 3" in (tmp_path / "vm.log").read_text()


@pytest.mark.faults
def test_vmlog_on_a_full_disk_records_nothing_it_did_not_write(full_disk):
    # an id counted as seen before its write succeeded made the agent's resends "duplicates"
    # that were acknowledged and never stored: a refused write must leave no trace
    filler = full_disk / "filler"
    filler.write_bytes(b"f" * 40_000)
    log = VmLog(str(full_disk), "vm", quota=1 << 30)
    log.open()
    written, refused = [], []
    for i in range(400):
        batch = [(_ev(i, line="x" * 300, stream="stdout"), 5.0)]
        try:
            log.write(batch)
            written.append(f"id-{i}")
        except OSError:
            refused.append(i)
            assert not log.seen(f"id-{i}")
    assert written and refused
    raw = (full_disk / "vm.jsonl").read_bytes()
    assert raw.endswith(b"\n") and len(raw) == log.bytes
    assert [json.loads(x)["event"]["id"] for x in raw.splitlines()] == written
    filler.unlink()  # space returns: the agent's resends are stored, once
    again = [(_ev(i, line="x" * 300, stream="stdout"), 6.0) for i in refused[:5]]
    assert [e.id for e in log.write(again)] == [f"id-{i}" for i in refused[:5]]
    assert log.write(again) == [] and log.duplicates == 5
    log.close()
    lines = (full_disk / "vm.jsonl").read_bytes().splitlines()
    assert len(lines) == len(written) + 5


def test_vmlog_quota_counts_instead_of_storing(tmp_path):
    log = VmLog(str(tmp_path), "vm", quota=400)
    log.open()
    items = [(_ev(i), 1.0) for i in range(10)]
    new = log.write(items)
    assert len(new) == 10  # all received (and so acknowledged)...
    assert log.stored < 10 and log.dropped_events == 10 - log.stored  # ...not all stored
    assert (tmp_path / "vm.jsonl").stat().st_size <= 400
    assert log.write(items) == [] and log.duplicates == 10
    log.close()


@pytest.mark.faults
def test_vmlog_never_chokes_on_hostile_data(tmp_path):
    log = VmLog(str(tmp_path), "vm", quota=1 << 20)
    log.open()
    odd = [
        Event("output", 1.0, "a", {"line_b64": "%%%not base64", "index": "x"}),
        Event("output", 2.0, "b", {"line": 12345}),
        Event("x" * 64, 3.0, "c", {"nan": float("nan"), "inf": float("inf")}),
        Event("output", 4.0, "d", {"line": "\x1b]0;pwned\x07\r\x00 end"}),
    ]
    assert len(log.write([(e, 9.0) for e in odd])) == 4
    log.close()
    text = (tmp_path / "vm.log").read_text()
    assert "\x1b" not in text and "\x07" not in text and "\x00" not in text and "\r" not in text
    for line in (tmp_path / "vm.jsonl").read_text().splitlines():
        json.loads(line)  # strict JSON (nan/inf as strings)


def test_printable():
    assert printable("a\nb\x1b[0m\tc") == "a\\nb\\x1b[0m\tc"
    assert printable("x" * 50, limit=10).startswith("x" * 10 + "...")


@pytest.mark.parametrize(
    "location", ["", "..", "../x", "a/../../x", "/..", "a/b/../../..", "x\x00y", None, 5, "./.", "/"]
)
def test_transfer_confine_refuses(location):
    with pytest.raises(TransferRefused):
        TransferStore.confine(location)


@pytest.mark.parametrize(
    ("location", "parts"),
    [("/var/log/x", ["var", "log", "x"]), ("a//b/./c", ["a", "b", "c"]), ("..x/y..", ["..x", "y.."])],
)
def test_transfer_confine_accepts(location, parts):
    assert TransferStore.confine(location) == parts


def test_transfer_confine_refuses_trees_deeper_than_the_limit():
    from vmr_handler.host.serve.files.transferpaths import MAX_LOCATION_DEPTH

    assert len(TransferStore.confine("/".join(["d"] * MAX_LOCATION_DEPTH))) == MAX_LOCATION_DEPTH
    with pytest.raises(TransferRefused, match=f"{MAX_LOCATION_DEPTH + 1} directory levels"):
        TransferStore.confine("/".join(["d"] * (MAX_LOCATION_DEPTH + 1)))
    with pytest.raises(TransferRefused, match="1200 directory levels"):
        TransferStore.confine("d/" * 1199 + "f")  # 2,400 bytes: within the 4,096-byte limit


def _deep_tree(root, depth: int, payload: bytes) -> None:
    """``root``/d/d/.../d/f, ``depth`` directories deep (made through descriptors: the path is
    longer than PATH_MAX)."""
    os.makedirs(root, exist_ok=True)
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        out = os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(out, payload)
        os.close(out)
    finally:
        os.close(fd)


@pytest.mark.faults
def test_a_tree_deeper_than_the_recursion_limit_does_not_stop_the_host_restarting(tmp_path):
    # what an older host stored for a hostile guest: 1,200 nested directories (os.walk raised
    # RecursionError in the start-up scan, so every later `vmr-host serve` on these logs died)
    store = TransferStore(str(tmp_path), "vm", max_file=1000, max_total=10_000)
    _deep_tree(store.root, 1200, b"x" * 10)
    try:
        with open(os.path.join(store.root, "top.txt"), "wb") as fh:
            fh.write(b"y" * 5)
        store.open()
        assert store.total == 15
    finally:  # Python 3.11's shutil.rmtree (pytest's clean-up of old temp dirs) recurses too
        subprocess.run(["rm", "-rf", store.root], check=True)


def test_walk_files_matches_os_walk_order_and_skips_symlinked_directories(tmp_path):
    from vmr_handler.core.fsutil import walk_files

    for rel in ("b/2", "a/1", "a/c/3", "z"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)
    os.symlink(tmp_path / "a", tmp_path / "link-to-a")
    expected = [(d, sorted(f)) for d, _dirs, f in os.walk(tmp_path)]
    assert [(d, sorted(f)) for d, f in walk_files(str(tmp_path))] == expected
    assert sum(1 for _ in walk_files(str(tmp_path / "missing"))) == 0


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_transfer_out_of_order_chunks_and_new_versions(tmp_path):
    t = TransferStore(str(tmp_path), "vm", max_file=1000, max_total=10_000)
    t.open()
    data = bytes(range(200))
    # chunks arrive out of order (a resend after a reconnect): the whole file is hashed at the end
    assert not t.write_chunk("d/f", 100, data[100:150], 200, _sha(data), False).complete
    assert not t.write_chunk("d/f", 0, data[:100], 200, _sha(data), False).complete
    out = t.write_chunk("d/f", 150, data[150:], 200, _sha(data), True, 1.5e9)
    assert out.complete and out.sha256_ok
    f = tmp_path / "transfers" / "vm" / "d" / "f"
    assert f.read_bytes() == data and f.stat().st_mtime == 1.5e9
    # a new version (offset 0 again) replaces it; the total counts the file once
    t.write_chunk("d/f", 0, b"v2", 2, _sha(b"v2"), True)
    assert f.read_bytes() == b"v2" and t.total == 2
    assert not any(p.name.endswith(".vmr-part") for p in f.parent.iterdir())


@pytest.mark.faults
def test_repeated_last_chunks_never_hash_what_was_hashed(tmp_path):
    # one message of 100 one-byte `last` chunks of a big sparse file must not re-hash the
    # whole file for each (~168 ms a chunk for 250 MiB): the running hash is kept
    size = 8 * 1024 * 1024
    t = TransferStore(str(tmp_path), "vm", max_file=size, max_total=2 * size)
    t.open()
    for _ in range(100):
        out = t.write_chunk("sparse", size - 1, b"x", size, "0" * 64, True)
        assert out.sha256_ok is False and not out.complete
    assert t.rehashed_bytes == size  # once, for the bytes no chunk carried
    # other bytes at a hashed place: the hash starts again (counted), once per change
    t.write_chunk("sparse", size - 1, b"y", size, "0" * 64, True)
    assert t.hashes.restarts == 1 and t.rehashed_bytes == 2 * size
    # an honest transfer in order is hashed as it arrives: nothing at the end
    data = os.urandom(300_000)
    for off in range(0, len(data), 100_000):
        last = off + 100_000 >= len(data)
        out = t.write_chunk("ok", off, data[off : off + 100_000], len(data), _sha(data), last)
    assert out.complete and out.sha256_ok and t.rehashed_bytes == 2 * size
    # the same chunk sent again (a resend) keeps the hash: still verified without re-hashing
    t.write_chunk("again", 0, data[:100_000], len(data), _sha(data), False)
    t.write_chunk("again", 0, data[:100_000], len(data), _sha(data), False)
    t.write_chunk("again", 100_000, data[100_000:], len(data), _sha(data), True)
    assert t.rehashed_bytes == 2 * size and (tmp_path / "transfers/vm/again").read_bytes() == data


def test_a_file_already_in_place_is_not_taken_again_past_offset_0(tmp_path):
    t = TransferStore(str(tmp_path), "vm", max_file=10_000, max_total=100_000)
    t.open()
    data = os.urandom(5000)
    assert t.write_chunk("f", 0, data, len(data), _sha(data), True).complete
    for _ in range(3):  # a guest repeating the last chunk of a verified file
        with pytest.raises(TransferRefused, match="already in place"):
            t.write_chunk("f", 4999, data[-1:], len(data), _sha(data), True)
    assert t.hashes.repeats == 3 and t.rehashed_bytes == 0
    # a new version (or the same content sent again from its start) is taken
    assert t.write_chunk("f", 0, data, len(data), _sha(data), True).complete


def test_a_pending_hash_runs_apart_and_finishes_in_place(tmp_path):
    t = TransferStore(str(tmp_path), "vm", max_file=1000, max_total=10_000)
    t.open()
    data = bytes(range(200))
    t.write_chunk("d/f", 100, data[100:], 200, _sha(data), False)
    step = t.begin_chunk("d/f", 0, data[:100], 200, _sha(data), True)
    assert isinstance(step, PendingHash) and step.missing == 100  # 0-100 hashed on the way
    out = t.finish_chunk(step.run())
    assert out.complete and out.sha256_ok
    assert (tmp_path / "transfers/vm/d/f").read_bytes() == data
    assert step.fd == step.dir_fd == -1  # descriptors closed


def test_transfer_limits(tmp_path):
    t = TransferStore(str(tmp_path), "vm", max_file=100, max_total=150)
    t.open()
    with pytest.raises(TransferRefused, match="per-file"):
        t.write_chunk("big", 0, b"x" * 10, 101, None, False)
    with pytest.raises(TransferRefused, match="past the announced size"):
        t.write_chunk("f", 0, b"x" * 20, 10, None, False)
    with pytest.raises(TransferRefused, match="offset"):
        t.write_chunk("f", -1, b"x", 10, None, False)
    t.write_chunk("a", 0, b"x" * 100, 100, _sha(b"x" * 100), True)
    with pytest.raises(TransferRefused, match="per-VM"):
        t.write_chunk("b", 0, b"y" * 60, 60, _sha(b"y" * 60), True)
    # what is on disk at start counts towards the total
    t2 = TransferStore(str(tmp_path), "vm", max_file=100, max_total=150)
    t2.open()
    assert t2.total == 100


def test_transfer_symlinks_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    t = TransferStore(str(tmp_path / "logs"), "vm", max_file=100, max_total=1000)
    t.open()
    root = tmp_path / "logs" / "transfers" / "vm"
    os.symlink(outside, root / "dir")
    os.symlink(outside / "file", root / "file")
    (root / "real").mkdir()
    os.symlink(root / "real", root / "inside")
    for loc in ("dir/x", "file", "inside/x"):
        with pytest.raises(TransferRefused):
            t.write_chunk(loc, 0, b"z", 1, _sha(b"z"), True)
    assert list(outside.iterdir()) == [] and list((root / "real").iterdir()) == []


def test_resource_store_confinement(tmp_path):
    res = tmp_path / "res"
    (res / "sub").mkdir(parents=True)
    (res / "sub" / "ok.bin").write_bytes(b"ok")
    (tmp_path / "secret").write_bytes(b"s")
    os.symlink(tmp_path / "secret", res / "out")
    os.symlink(res / "sub" / "ok.bin", res / "in")
    store = ResourceStore(str(res))
    info = store.info("sub/ok.bin")
    assert info.size == 2 and info.sha256 == _sha(b"ok")
    assert store.info("in").sha256 == _sha(b"ok")  # a symlink that stays inside is fine
    for name in ("../secret", "/etc/passwd", "out", "sub", "nope", "", None, "sub/../../secret"):
        with pytest.raises(ResourceRefused):
            store.info(name)
    with pytest.raises(ResourceRefused, match="no --resources"):
        ResourceStore(None).info("x")


def _reader(data: bytes):
    pos = [0]

    def read(n: int) -> bytes:
        piece = data[pos[0] : pos[0] + n]
        pos[0] += len(piece)
        return piece

    return read


def test_upload_staged_then_committed_and_counted(tmp_path):
    from vmr_handler.core.errors import TransferConflict, TransferMismatch, TransferTooLarge

    t = TransferStore(str(tmp_path), "vm", max_file=1000, max_total=1500)
    t.open()
    data = bytes(range(250)) * 2
    sha = _sha(data)
    assert t.upload_have("d/f", sha, 500) == 0
    assert t.upload("d/f", sha, 500, 0, 200, _reader(data[:200]), chunk=64) == 200
    assert t.upload_have("d/f", sha, 500) == 200 and t.total == 200
    with pytest.raises(TransferConflict) as exc:
        t.upload("d/f", sha, 500, 300, 200, _reader(data[300:]))
    assert exc.value.have == 200
    assert t.upload("d/f", sha, 500, 200, 300, _reader(data[200:])) == 500
    assert t.upload_have("d/f", sha, 500) == 500 and t.total == 500
    # nothing in place before the report; then the same content for two locations
    f = tmp_path / "transfers" / "vm" / "d" / "f"
    assert not f.exists()
    assert t.commit_upload("d/f", sha, 500, 1.5e9).complete
    assert f.read_bytes() == data and f.stat().st_mtime == 1.5e9 and t.total == 500
    assert t.commit_upload("g", sha, 500).path == "g"  # a hard link of d/f
    assert (tmp_path / "transfers" / "vm" / "g").read_bytes() == data and t.total == 1000
    assert not list((tmp_path / "uploads" / "vm").iterdir())
    with pytest.raises(TransferRefused, match="no complete upload"):
        t.commit_upload("h", _sha(b"never"), 5)
    # limits, checked before anything is read; a wrong body is deleted
    with pytest.raises(TransferTooLarge, match="per-file"):
        t.upload("big", sha, 1001, 0, 10, _reader(b"x" * 10))
    with pytest.raises(TransferTooLarge, match="per-VM"):
        t.upload_have("x", _sha(b"x" * 600), 600)
    with pytest.raises(TransferMismatch):
        t.upload("m", _sha(b"other"), 3, 0, 3, _reader(b"abc"))
    assert t.total == 1000 and not list((tmp_path / "uploads" / "vm").iterdir())
    for bad in ("../x", "/", "a/../../x"):
        with pytest.raises(TransferRefused):
            t.upload_have(bad, sha, 500)
    with pytest.raises(TransferRefused, match="hex"):
        t.upload_have("x", "../../etc/passwd", 5)
    # a restarted host counts staged bytes too
    t.upload("p", _sha(b"partial!"), 8, 0, 4, _reader(b"part"))
    t2 = TransferStore(str(tmp_path), "vm", max_file=1000, max_total=1500)
    t2.open()
    assert t2.total == t.total == 1004
    assert t2.upload_have("p", _sha(b"partial!"), 8) == 4


def test_upload_a_whole_unverified_part_asks_for_its_last_byte_again(tmp_path):
    t = TransferStore(str(tmp_path), "vm", max_file=1000, max_total=1500)
    t.open()
    data = b"0123456789"
    (tmp_path / "uploads" / "vm" / (_sha(data) + ".part")).write_bytes(data)  # a crash before the rename
    assert t.upload_have("f", _sha(data), 10) == 9
    assert t.upload("f", _sha(data), 10, 9, 1, _reader(b"9")) == 10
    assert t.commit_upload("f", _sha(data), 10).complete


def test_a_re_reported_upload_cannot_break_the_per_vm_total(tmp_path) -> None:
    """A second ``transfer_uploaded`` for a location already in place (a resend, or a hostile
    guest), then chunks to that location: the total must stay what is on disk, so the limit
    holds (found by review: the same-file rename left a link that later chunks wrote into,
    and each round lowered the total by the file's size)."""
    import hashlib
    import io
    import os

    from vmr_handler.core.errors import TransferTooLarge

    s = TransferStore(str(tmp_path), "vm1", max_file=10_000_000, max_total=1_000_000)
    s.open()
    data = os.urandom(200_000)
    sha = hashlib.sha256(data).hexdigest()
    s.upload("A", sha, len(data), 0, len(data), io.BytesIO(data).read)
    s.commit_upload("A", sha, len(data))
    s.commit_upload("A", sha, len(data))  # again
    for _ in range(5):
        d = os.urandom(300_000)
        s.write_chunk("A", 0, d, len(d), hashlib.sha256(d).hexdigest(), True)

    def on_disk() -> int:
        return sum(
            os.lstat(os.path.join(dp, f)).st_size
            for dp, _, fs in os.walk(os.path.join(str(tmp_path), "transfers"))
            for f in fs
        )

    assert s.total == on_disk() == 300_000
    with pytest.raises(TransferTooLarge):
        for i in range(10):
            d = os.urandom(300_000)
            s.write_chunk(f"B{i}", 0, d, len(d), hashlib.sha256(d).hexdigest(), True)
    assert s.total == on_disk() <= 1_000_000


def test_acks_wait_for_the_fsync_of_what_they_acknowledge(tmp_path, monkeypatch, caplog):
    # the fsync policy: nothing is acknowledged before its line is fsynced; one fsync
    # at a time per VM, in a worker thread; a failed fsync acknowledges nothing
    import asyncio
    import threading

    from vmr_handler.host.logs import store as store_mod
    from vmr_handler.host.logs.store import DurableAcks

    gate, calls, fail = threading.Event(), [], []
    real_fsync = os.fsync

    def fsync(fd):
        calls.append(fd)
        assert gate.wait(10)
        if fail:
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(store_mod.os, "fsync", fsync)

    async def go():
        vmlog = VmLog(str(tmp_path), "vm", quota=10**6)
        vmlog.open()
        sent = []
        acks = DurableAcks(vmlog, sent.append)
        evs = [Event("output", 1.0, f"id-{i}", {"line": str(i)}) for i in range(5)]
        vmlog.write([(e, 2.0) for e in evs[:2]])
        acks.add(["id-0", "id-1"])
        vmlog.write([(e, 2.0) for e in evs[2:]])
        acks.add(["id-2", "id-3", "id-4", "id-2"])  # while the first fsync runs: the next one
        await asyncio.sleep(0.05)
        assert sent == [] and len(calls) == 1  # not acknowledged before the fsync returns
        gate.set()
        for _ in range(200):
            if len(sent) == 2:
                break
            await asyncio.sleep(0.01)
        assert sent == [["id-0", "id-1"], ["id-2", "id-3", "id-4"]] and len(calls) == 2
        fail.append(True)
        acks.add(["id-0"])
        for _ in range(200):
            if len(calls) == 3 and not acks._syncing:
                break
            await asyncio.sleep(0.01)
        assert len(sent) == 2  # a failed fsync acknowledges nothing
        vmlog.close()

    with caplog.at_level("ERROR"):
        asyncio.run(go())
    assert any("cannot fsync" in r.getMessage() for r in caplog.records)


def test_readable_logs_of_many_vms_share_a_bounded_number_of_open_files(tmp_path):
    # 10 000 VMs must not hold 20 000 log files open: the readable .log goes through a
    # pool of at most `limit` open files; every line still lands in its own VM's file, in order
    from vmr_handler.host.logs.appendfiles import AppendFiles

    pool = AppendFiles(limit=3)
    logs = [VmLog(str(tmp_path), f"vm{i}", quota=1 << 30) for i in range(10)]
    for vl in logs:
        vl.readable_files = pool
        vl.open()
    me = psutil.Process()
    fds_before = me.num_fds()
    for round_ in range(3):
        for i, vl in enumerate(logs):
            vl.write([(_ev(100 * round_ + i), 5.0)])
            vl.note(f"note {round_}", 5.0)
            assert len(pool._open) <= 3
    assert me.num_fds() <= fds_before  # no descriptor more than the pool's
    for i, vl in enumerate(logs):
        vl.close()
        text = (tmp_path / f"vm{i}.log").read_text().splitlines()
        assert [line.split("] ")[-1] for line in text if "[host]" in line] == ["note 0", "note 1", "note 2"]
        assert sum(line.endswith(f"line {100 * r + i}") for line in text for r in range(3)) == 3
    assert pool.opens > 3 and not pool._open
