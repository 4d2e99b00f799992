#!/usr/bin/env python3
"""vmr-host over MQTT with N simulated agents: barrier, start-time and RESUME
fan-out, host and broker cost. Prints a table; asserts nothing; not collected by pytest.

Run from the repository root::

    .venv/bin/python benchmarks/bench_mqtt.py                     # N=1000, 3 runs
    .venv/bin/python benchmarks/bench_mqtt.py --vms 100,1000 --runs 3
    .venv/bin/python benchmarks/bench_mqtt.py --vms 3000 --runs 1 --procs 3
    .venv/bin/python benchmarks/bench_mqtt.py --bridged --vms 1000 --runs 2   # 2 x N, two brokers

Each run starts, all on this machine and all stopped by PID at the end:

* one **mosquitto** (plain listener on a free 127.0.0.1 port, anonymous, persistence as
  ``vmr-host mqtt-config`` writes it, ``sys_interval 1`` for ``$SYS``), its open-files limit
  raised above the client count;
* the real **``vmr-host serve --transport mqtt``** (the venv's console script) serving N VMs
  ``vm00000..``, each with a one-entry YAML schedule in a temp dir;
* a **load generator**: ``--procs`` processes (default 2) of this script in ``--worker``
  mode, each simulating N/procs agents with one paho-mqtt 2.x client per agent, all driven
  by ONE manual loop per process (an epoll selector over the clients' sockets with paho's
  socket callbacks, ``loop_read`` / ``loop_write`` / ``loop_misc``; no thread per client).

A simulated agent does what the real agent does on the wire (``vmr_handler/agent/connected/link.py``,
``transports/mqtt/``), minus the clock sync and running anything: MQTT v5, client id
``vmr-<experiment>-<vm>``, username = VM name, ``clean_start=False`` + session expiry, a
retained ``offline`` last will on ``presence``; on CONNACK it subscribes ``down``, ``start``
(QoS 1) and the hosts' start topics ``_hosts/+/start`` (QoS 0), publishes ``presence``
``online`` (retained; again with ``host_start`` once a host's start topic delivered something,
as the agent's channel does) and its ``hello``
(protocol fields of ``_send_hello``); it answers a host ``hello`` with a ``hello`` (unless
it sent one < 1 s ago, as the agent does), the ``schedule`` with a ``result`` success, a
``start_time`` (from ``down``, its retained ``start`` topic or its host's start topic,
whichever comes first) with an ``ack``, a ``resume`` with a ``result``, and sends no
``heartbeat`` (over MQTT the broker tells liveness: its keep-alive pings and last will;
``--agent-heartbeats``: one after 5 s of silence and no ``connection`` in the hello, as the
agent did before, for a ``--src`` baseline). Its hello carries its connection id and
``"heartbeats": false`` and a journal of what it accepted (schedule digest, start time).
After the RESUME the host is **restarted** (SIGTERM, then the same command on its logs):
every message that reaches a simulated VM until none has for 5 s (at most 30 s after the new
host connected) is counted, by type.

Where the start's time goes: a **probe** (one more paho client in the controller,
idle otherwise) subscribes, before the ``configured`` burst, to the start topics of every
``N/200``-th VM (``down``, ``start``, and the hosts' start topics): when it receives a VM's
start is when the broker sent it out, not counting the load generators' own queueing.
Each generator also notes, once the ``configured`` burst began, the kernel's receive time of
the first unread bytes of a socket before reading it (``SO_TIMESTAMP``, ``MSG_PEEK``): for the
read that brought the start, that is when the start reached the simulated VM's socket, so its
time splits into (host set -> received by the kernel) and (received -> processed, i.e. the
generator's own queueing on 2 shared cores).
``--src DIR`` runs ``vmr-host`` from another source tree (e.g. a ``git archive`` of an
earlier commit), for before/after figures.
``--bridged``: a coordinator and a member host with N VMs each (and their own generators),
on two mosquittos joined by the bridge ``vmr-host mqtt-config --bridge-to`` writes, beside the
same two hosts on one broker, per run; the start across both sides, RESUME on each host, CPU
and RSS of both hosts and brokers (:func:`run_pair`).
``configured`` is sent when the controller says: VM i at ``T0 + window * i / (N - 1)``, so the
last one goes at a known instant. Every time is ``time.time()`` on this machine (host, broker
and generators share the clock).
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import queue
import resource
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:  # after a --src tree on PYTHONPATH: the shimmed vmr-host runs that tree
    sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]), REPO)

from vmr_handler.core.events import Event  # noqa: E402
from vmr_handler.core.wire.protocol import encode_message  # noqa: E402
from vmr_handler.transports.mqtt.guest import presence_payload  # noqa: E402
from vmr_handler.transports.mqtt.topics import (  # noqa: E402
    HOST_START_QOS,
    READS_HOST_START,
    Topics,
    host_starts,
)

EXPERIMENT = "bench"
SESSION_EXPIRY = 7 * 24 * 3600  # as transports/mqtt/bridge.py
KEEPALIVE = 15  # the agent's default
HEARTBEAT = 5.0  # the agent's default (sent over MQTT by agents before 0.1.0's liveness change)
#: ``--agent-heartbeats``: the simulated agents behave as before the broker told liveness (a
#: heartbeat after 5 s of send silence, no ``connection``/``heartbeats`` in the hello), for
#: the baseline of a ``--src`` tree from before that change
AGENT_HEARTBEATS = False
WAIT = 120.0  # bound of every phase wait, seconds
HOST_CONNECT_WAIT = 45.0  # vmr-host start-up until "connected to broker"
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"

#: bench_host.py figures (unix sockets, 20-21 real agents; 100 simulated for idle), quoted
#: from benchmarks/README.md "vmr-host benchmarks", runs 1-4 (2026-11-23)
UNIX_QUOTED = {
    "start_all": "every VM has the start time: 24-42 ms p50, 36-77 ms max after the last configured "
    "(agent timestamps, 20 real agents)",
    "resume": "host issued -> resume_received max 31-64 ms; CLI call -> resume_received p50 232-347 ms "
    "(21 real agents)",
    "idle": "host CPU 0.3-0.4 % with 100 idle simulated agents; RSS 28.4-28.6 MB; 1 thread; "
    "fds 3/VM + 1/connection",
}


# =========================================================================== helpers
def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100.0 * len(ordered))) - 1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raise_nofile(want: int) -> Tuple[int, int]:
    """Raise this process's RLIMIT_NOFILE (inherited by every child) to ``want`` if it can:
    the hard limit too when running as root, else the soft limit up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return soft, hard
    try:
        if hard != resource.RLIM_INFINITY and hard < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
        else:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def vm_name(i: int) -> str:
    return f"vm{i:05d}"


# =========================================================================== the load generator
class SimAgent:
    """One simulated agent: a paho client plus the few protocol steps the benchmark needs."""

    def __init__(self, worker: Worker, index: int) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.w = worker
        self.index = index
        self.vm = vm_name(index)
        topics = Topics(worker.experiment, self.vm)
        self.up, self.down = topics.up, topics.down
        self.presence, self.start_topic = topics.presence, topics.start
        self.host_starts = topics.host_starts
        self.boot_id = uuid.uuid4().hex
        self.prefix = self.boot_id[:12]
        self.counter = 0
        self.last_tx = 0.0
        self.hello_mono = -1e9
        self.rec: Dict[str, Any] = {"vm": self.vm}
        self.pending: Dict[str, str] = {}  # event id -> what (awaiting the host's ack)
        self.seen_start = False
        self.reads_host_start = False
        self.arrived: Optional[float] = None  # kernel receive time of the bytes being read
        self.seen_resume: Dict[str, float] = {}
        self.connection = ""  # the id of this connection, in each of its hellos (as the agent's)
        self.journal: Dict[str, Any] = {"digest": None, "start_time": None}  # what it accepted
        c = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"vmr-{worker.experiment}-{self.vm}",
            protocol=mqtt.MQTTv5,
            userdata=self,
            reconnect_on_failure=False,
        )
        c.max_inflight_messages_set(200)
        c.max_queued_messages_set(0)
        c.username_pw_set(self.vm, None)
        c.will_set(self.presence, self._presence("offline"), qos=1, retain=True)
        c.on_connect = _on_connect
        c.on_message = _on_message
        c.on_disconnect = _on_disconnect
        c.on_socket_open = worker.sock_open
        c.on_socket_close = worker.sock_close
        c.on_socket_register_write = worker.sock_want_write
        c.on_socket_unregister_write = worker.sock_no_write
        self.client = c

    def _presence(self, state: str) -> bytes:
        flag = {READS_HOST_START: True} if self.reads_host_start else {}
        return presence_payload(state, vm=self.vm, boot_id=self.boot_id, **flag)

    def new_id(self) -> str:
        self.counter += 1
        return f"{self.prefix}-{self.counter:08d}"

    def send(self, type_: str, data: Dict[str, Any], track: Optional[str] = None) -> str:
        now = time.time()
        ev = Event(type_, now, self.new_id(), data)
        if track:
            self.pending[ev.id] = track
        self.client.publish(self.up, encode_message([ev], now), qos=1)
        self.last_tx = time.monotonic()
        return ev.id

    def hello(self) -> None:
        self.hello_mono = time.monotonic()
        self.send(
            "hello",
            {
                "protocol": 1,
                "agent_version": "bench-sim",
                "boot_id": self.boot_id,
                "vm": self.vm,
                "journal": {
                    "digest": self.journal["digest"],
                    "configured_at": self.rec.get("t_configured"),
                    "start_time": self.journal["start_time"],
                    "stages_done": [],
                    "resumes": 0,
                },
                "unacked": len(self.pending),
                **(
                    {}
                    if AGENT_HEARTBEATS
                    else {
                        "connection": self.connection,
                        "heartbeats": False,
                    }  # MQTT: liveness is the broker's
                ),
            },
        )

    def connect(self, host: str, port: int) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = SESSION_EXPIRY
        self.rec["t_connect"] = time.time()
        self.client.connect(host, port, keepalive=KEEPALIVE, clean_start=False, properties=props)

    # ------------------------------------------------------------------ protocol
    def on_connack(self, ok: bool, reason: str) -> None:
        now = time.time()
        if not ok:
            self.rec["refused"] = reason
            return
        self.rec.setdefault("t_connack", now)
        self.connection = uuid.uuid4().hex
        self.client.subscribe([(self.down, 1), (self.start_topic, 1), (self.host_starts, HOST_START_QOS)])
        self.client.publish(self.presence, self._presence("online"), qos=1, retain=True)
        self.hello()

    def on_frames(self, topic: str, payload: bytes) -> None:
        now = time.time()
        if not self.reads_host_start and topic.endswith("/start") and topic != self.start_topic:
            # as the agent's channel (transports/mqtt/guest.py): the broker lets it read the
            # hosts' start topics, so it says so in its presence
            self.reads_host_start = True
            self.client.publish(self.presence, self._presence("online"), qos=1, retain=True)
        self.w.rx_msgs += 1
        self.w.rx_bytes += len(payload)
        for line in payload.split(b"\n"):
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
                events = msg["events"]
            except (ValueError, KeyError, TypeError):
                self.w.bad_frames += 1
                continue
            for ev in events:
                self.on_event(topic, ev, now)

    def on_event(self, topic: str, ev: Dict[str, Any], now: float) -> None:
        t = ev.get("type")
        data = ev.get("data") or {}
        rec = self.rec
        self.w.rx_types[str(t)] = self.w.rx_types.get(str(t), 0) + 1
        if t == "hello":
            rec["host_hellos"] = rec.get("host_hellos", 0) + 1
            # the agent's rule (vmr_handler/agent/connected/link.py HostLink._on_hello): answer the host's
            # hello
            # with a new hello only when already welcomed or when our own is older than the
            # heartbeat (5 s); until 2026-11-23 it was "older than 1 s" (schedules sent twice)
            if "t_welcome" in rec or time.monotonic() - self.hello_mono >= 5.0:
                self.hello()
        elif t == "welcome":
            rec.setdefault("t_welcome", now)
            rec["welcomes"] = rec.get("welcomes", 0) + 1
        elif t == "schedule":
            rec["schedules"] = rec.get("schedules", 0) + 1
            rec.setdefault("t_schedule", now)
            self.journal["digest"] = data.get("sha256")  # the agent's journal: schedule_digest
            self.send("result", {"answers": ev["id"], "status": "success", "details": "loaded"}, "schedule")
        elif t == "ack":
            for ident in data.get("ids") or []:
                what = self.pending.pop(ident, None)
                if what is not None:
                    rec.setdefault(f"t_{what}_acked", now)
                    if what == "schedule":
                        self.w.progress["ready"] += 1
        elif t == "start_time":
            leaf = "retained" if topic == self.start_topic else "down" if topic == self.down else "host"
            rec.setdefault(f"t_start_{leaf}", now)
            rec[f"n_start_{leaf}"] = rec.get(f"n_start_{leaf}", 0) + 1
            if not self.seen_start:
                self.seen_start = True
                rec["t_start"] = now
                rec["t_start_sel"] = self.w.t_sel  # its select() returned then
                if self.arrived is not None:
                    rec["t_start_kernel"] = self.arrived  # the kernel had it then
                rec["start_via"] = leaf
                rec["start_time"] = data.get("start_time")
                self.journal["start_time"] = data.get("start_time")
                self.w.progress["started"] += 1
                self.send("ack", {"ids": [ev["id"]]})
        elif t == "resume":
            rec["resumes"] = rec.get("resumes", 0) + 1
            if ev["id"] not in self.seen_resume:
                self.seen_resume[ev["id"]] = now
                rec["t_resume"] = now
                rec["resume_id"] = ev["id"]
                self.w.progress["resumed"] += 1
            self.send(
                "result",
                {"answers": ev["id"], "status": "success", "details": "ignored: no active break",
                 "ended_break": None, "ignored": True},
                "resume",
            )  # fmt: skip
        elif t == "heartbeat":
            rec["host_heartbeats"] = rec.get("host_heartbeats", 0) + 1

    def configured(self) -> None:
        now = time.time()
        self.rec["t_configured"] = now
        self.send("configured", {"at": now, "stages": [-1]}, "configured")

    def tick(self, mono: float) -> None:
        """paho's keep-alive pings; no application heartbeat (the agent sends none over MQTT:
        its keep-alive and last will tell the host it is there), unless ``--agent-heartbeats``."""
        self.client.loop_misc()
        if AGENT_HEARTBEATS and "t_connack" in self.rec and mono - self.last_tx >= HEARTBEAT:
            self.send("heartbeat", {})


def _on_connect(_c: Any, sim: SimAgent, _flags: Any, reason: Any, _props: Any) -> None:
    sim.on_connack(not reason.is_failure, str(reason))


def _on_message(_c: Any, sim: SimAgent, msg: Any) -> None:
    sim.on_frames(msg.topic, bytes(msg.payload))


def _on_disconnect(_c: Any, sim: SimAgent, _flags: Any, reason: Any, _props: Any) -> None:
    sim.rec["disconnects"] = sim.rec.get("disconnects", 0) + 1
    sim.rec["last_disconnect"] = str(reason)
    sim.w.disconnects += 1


class Worker:
    """One generator process: many SimAgents, one selector loop, commands on stdin."""

    def __init__(self, host: str, port: int, experiment: str, first: int, count: int) -> None:
        self.host, self.port, self.experiment = host, port, experiment
        self.sel = selectors.EpollSelector()
        self.progress = {"connected": 0, "ready": 0, "started": 0, "resumed": 0}
        self.bad_frames = 0
        self.disconnects = 0
        self.rx_msgs = self.rx_bytes = 0  # messages (and their bytes) from the host since "mark"
        self.rx_types: Dict[str, int] = {}  # events received since "mark", by type
        self.sims = [SimAgent(self, i) for i in range(first, first + count)]
        self.to_connect: List[SimAgent] = []
        self.cfg_queue: List[Tuple[float, SimAgent]] = []
        self.running = True
        self.stdin_buf = b""
        self.t_sel = 0.0  # when the last select() returned (time.time())
        self.peek = False  # note kernel receive times (from the configured command on)

    # paho socket callbacks (external event loop)
    def sock_open(self, _c: Any, sim: SimAgent, sock: Any) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
        except OSError:
            pass
        self.sel.register(sock, selectors.EVENT_READ, sim)

    def sock_close(self, _c: Any, _sim: SimAgent, sock: Any) -> None:
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass

    def sock_want_write(self, _c: Any, sim: SimAgent, sock: Any) -> None:
        try:
            self.sel.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, sim)
        except (KeyError, ValueError):
            pass

    def sock_no_write(self, _c: Any, sim: SimAgent, sock: Any) -> None:
        try:
            self.sel.modify(sock, selectors.EVENT_READ, sim)
        except (KeyError, ValueError):
            pass

    def emit(self, doc: Dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    def command(self, line: str) -> None:
        parts = line.split()
        if not parts:
            return
        if parts[0] == "connect":
            self.t_connect_cmd = time.time()
            self.to_connect = list(self.sims)
        elif parts[0] == "configured":
            self.peek = True
            t0, window, n = float(parts[1]), float(parts[2]), int(parts[3])
            for s in self.sims:
                due = t0 + (window * s.index / (n - 1) if n > 1 else 0.0)
                self.cfg_queue.append((due, s))
            self.cfg_queue.sort(key=lambda item: item[0])
        elif parts[0] == "mark":
            self.rx_msgs = self.rx_bytes = 0
            self.rx_types = {}
        elif parts[0] == "rx":
            self.emit({"ev": "rx", "msgs": self.rx_msgs, "bytes": self.rx_bytes, "types": self.rx_types})
        elif parts[0] == "report":
            self.emit({"ev": "report", "bad_frames": self.bad_frames, "disconnects": self.disconnects,
                       "vms": [s.rec for s in self.sims]})  # fmt: skip
        elif parts[0] == "quit":
            for s in self.sims:
                try:
                    s.client.disconnect()
                    s.client.loop_write()
                except Exception:
                    pass
            self.running = False

    def read_stdin(self) -> None:
        data = os.read(0, 65536)
        if not data:
            self.running = False
            return
        self.stdin_buf += data
        while b"\n" in self.stdin_buf:
            line, self.stdin_buf = self.stdin_buf.split(b"\n", 1)
            self.command(line.decode())

    def run(self) -> None:
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, None)
        self.emit({"ev": "up", "pid": os.getpid(), "n": len(self.sims)})
        last_tick = time.monotonic()
        last_progress: Dict[str, int] = {}
        last_emit = 0.0
        while self.running:
            now = time.time()
            timeout = 0.05
            if self.to_connect:
                timeout = 0.0
            elif self.cfg_queue:
                timeout = max(0.0, min(timeout, self.cfg_queue[0][0] - now))
            ready = self.sel.select(timeout)
            self.t_sel = time.time()
            for key, mask in ready:
                sim = key.data
                if sim is None:
                    self.read_stdin()
                    continue
                c = sim.client
                if mask & selectors.EVENT_READ:
                    if self.peek and not sim.seen_start:
                        sim.arrived = kernel_arrival(key.fileobj)
                    c.loop_read()
                if mask & selectors.EVENT_WRITE and c.want_write():
                    c.loop_write()
            # a connect storm, in slices so CONNACKs and handshakes are served meanwhile
            for _ in range(min(25, len(self.to_connect))):
                sim = self.to_connect.pop(0)
                try:
                    sim.connect(self.host, self.port)
                except OSError as exc:
                    sim.rec["connect_errors"] = sim.rec.get("connect_errors", 0) + 1
                    sim.rec["connect_error"] = str(exc)
                    self.to_connect.append(sim)
            now = time.time()
            while self.cfg_queue and self.cfg_queue[0][0] <= now:
                _due, sim = self.cfg_queue.pop(0)
                sim.configured()
            mono = time.monotonic()
            if mono - last_tick >= 1.0:
                last_tick = mono
                for s in self.sims:
                    s.tick(mono)
            self.progress["connected"] = sum(1 for s in self.sims if "t_connack" in s.rec)
            if self.progress != last_progress and (mono - last_emit > 0.1):
                last_progress = dict(self.progress)
                last_emit = mono
                self.emit({"ev": "progress", **self.progress})
            elif mono - last_emit > 1.0:
                last_emit = mono
                self.emit({"ev": "progress", **self.progress})


#: Linux ``SO_TIMESTAMP`` (and ``SCM_TIMESTAMP``): the kernel's receive time of each packet
SO_TIMESTAMP = getattr(socket, "SO_TIMESTAMP", 29)


def kernel_arrival(sock: Any) -> Optional[float]:
    """When the kernel received the first unread bytes of ``sock`` (UTC epoch seconds), by a
    ``MSG_PEEK`` read of one byte with ``SO_TIMESTAMP`` on; None when there is nothing."""
    import struct

    try:
        _data, anc, _flags, _addr = sock.recvmsg(1, 64, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return None
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMP and len(raw) >= 16:
            sec, usec = struct.unpack("ll", raw[:16])
            return float(sec + usec / 1e6)
    return None


def worker_main(args: argparse.Namespace) -> int:
    global AGENT_HEARTBEATS
    AGENT_HEARTBEATS = args.agent_heartbeats
    raise_nofile(args.count * 2 + 256)
    Worker("127.0.0.1", args.port, args.experiment, args.first, args.count).run()
    return 0


# =========================================================================== host shim
# A BENCHMARK WORKAROUND, not a fix (see benchmarks/README.md, "MQTT, 1000 simulated agents").
# paho-mqtt 2.x's threaded loop (``loop_start``, used by ``PahoBridge``) waits with
# ``select.select``, which refuses file descriptors >= 1024 (FD_SETSIZE). ``vmr-host`` keeps two
# log files open per VM before it connects to the broker, so with more than ~500 VMs its broker
# socket gets a descriptor above 1023 and every connect attempt ends in "no answer from broker
# ... in 10 s; retrying", forever. ``--shim on`` (default ``auto``: when N > 450) starts the host
# as ``python bench_mqtt.py --host-with-poll <vmr-host args>``: the unchanged ``vmr-host`` CLI in
# a process where paho's client module sees a ``select`` module whose ``select()`` is the same
# call made with ``poll()`` (no descriptor limit).
def poll_select(
    rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any], timeout: Optional[float] = None
) -> Tuple[List[Any], List[Any], List[Any]]:
    """``select.select`` semantics (readable, writable; no exceptional set) over ``poll``."""
    import select as _select

    def fd_of(obj: Any) -> int:
        return obj if isinstance(obj, int) else int(obj.fileno())

    poller = _select.poll()
    objs: Dict[int, Dict[str, Any]] = {}
    masks: Dict[int, int] = {}
    for obj in rlist:
        fd = fd_of(obj)
        objs.setdefault(fd, {})["r"] = obj
        masks[fd] = masks.get(fd, 0) | _select.POLLIN | _select.POLLPRI
    for obj in wlist:
        fd = fd_of(obj)
        objs.setdefault(fd, {})["w"] = obj
        masks[fd] = masks.get(fd, 0) | _select.POLLOUT
    for fd, mask in masks.items():
        poller.register(fd, mask)
    ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    ready_r: List[Any] = []
    ready_w: List[Any] = []
    for fd, ev in poller.poll(ms):
        bad = ev & (_select.POLLERR | _select.POLLHUP | _select.POLLNVAL)
        if "r" in objs[fd] and (ev & (_select.POLLIN | _select.POLLPRI) or bad):
            ready_r.append(objs[fd]["r"])
        if "w" in objs[fd] and (ev & _select.POLLOUT or bad):
            ready_w.append(objs[fd]["w"])
    return ready_r, ready_w, []


def host_with_poll(argv: List[str]) -> int:
    """Run the unchanged ``vmr-host`` CLI with paho's ``select`` on ``poll`` (see above)."""
    import select as _select
    import types

    import paho.mqtt.client as paho_client

    shim = types.ModuleType("select")
    shim.__dict__.update(_select.__dict__)
    shim.select = poll_select  # type: ignore[attr-defined]
    paho_client.select = shim  # type: ignore[attr-defined]
    from vmr_handler.host.cli.vmr_host import main as host_main

    sys.argv = ["vmr-host", *argv]
    return int(host_main() or 0)


# =========================================================================== controller
_CHILDREN: List[subprocess.Popen] = []


def spawn(argv: Sequence[str], **kw: Any) -> subprocess.Popen:
    proc = subprocess.Popen(list(argv), start_new_session=True, **kw)
    _CHILDREN.append(proc)
    return proc


def stop(proc: Optional[subprocess.Popen], timeout: float = 10.0) -> None:
    """SIGTERM by PID, SIGKILL after ``timeout``."""
    if proc is None:
        return
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)


def _cleanup() -> None:
    for proc in list(_CHILDREN):
        try:
            stop(proc, 5.0)
        except Exception:
            pass


def _on_signal(signum: int, _frame: Any) -> None:
    _cleanup()
    sys.exit(128 + signum)


#: ``--src``: a source tree ``vmr-host`` runs from instead of this one (its ``vmr_handler``)
SRC: Optional[str] = None


def vmr_host() -> List[str]:
    if SRC is not None:  # -P: not the current directory's vmr_handler first
        return [sys.executable, "-P", "-m", "vmr_handler.host"]
    path = os.path.join(os.path.dirname(sys.executable), "vmr-host")
    return [path] if os.access(path, os.X_OK) else [sys.executable, "-m", "vmr_handler.host"]


def spawn_env() -> Optional[Dict[str, str]]:
    """The environment of ``vmr-host`` and its CLI calls: ``--src`` first on the path."""
    if SRC is None:
        return None
    return {**os.environ, "PYTHONPATH": SRC}


class Sampler(threading.Thread):
    """RSS max and CPU of named processes, every 0.25 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import psutil

        self.psutil = psutil
        self.procs: Dict[str, Any] = {}
        self.rss_max: Dict[str, int] = {}
        self.stop_ev = threading.Event()
        self.lock = threading.Lock()

    def add(self, name: str, pid: int) -> None:
        with self.lock:
            self.procs[name] = self.psutil.Process(pid)

    def run(self) -> None:
        while not self.stop_ev.wait(0.25):
            with self.lock:
                items = list(self.procs.items())
            for name, p in items:
                try:
                    rss = p.memory_info().rss
                except self.psutil.Error:
                    continue
                self.rss_max[name] = max(self.rss_max.get(name, 0), rss)

    def cpu(self, name: str) -> float:
        try:
            t = self.procs[name].cpu_times()
            return float(t.user + t.system)
        except (KeyError, self.psutil.Error):
            return math.nan

    def rss(self, name: str) -> float:
        try:
            return float(self.procs[name].memory_info().rss)
        except (KeyError, self.psutil.Error):
            return math.nan

    def fds(self, name: str) -> float:
        try:
            return float(self.procs[name].num_fds())
        except (KeyError, self.psutil.Error):
            return math.nan


class SysWatch:
    """The broker's ``$SYS`` tree (one threaded paho client: this is the controller, not the load)."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.values: Dict[str, str] = {}
        self.max_connected = 0
        c = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"bench-sys-{os.getpid()}", protocol=mqtt.MQTTv5
        )
        c.on_connect = lambda cl, *_a: cl.subscribe("$SYS/broker/#")
        c.on_message = self._msg
        c.connect("127.0.0.1", port)
        c.loop_start()
        self.client = c

    def _msg(self, _c: Any, _u: Any, msg: Any) -> None:
        value = msg.payload.decode(errors="replace")
        self.values[msg.topic] = value
        if msg.topic == "$SYS/broker/clients/connected":
            try:
                self.max_connected = max(self.max_connected, int(value))
            except ValueError:
                pass

    def get(self, leaf: str) -> Optional[str]:
        return self.values.get("$SYS/broker/" + leaf)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Probe:
    """When the broker sends the start out: a paho client (its own thread, otherwise idle)
    subscribed to the start topics of a sample of VMs and to the hosts' start topics."""

    def __init__(self, port: int, n: int) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        step = max(1, n // 200)
        self.sample = [vm_name(i) for i in range(0, n, step)]
        self.first: Dict[str, float] = {}  # VM (or "host:<topic>") -> first start_time seen
        self.subscribed = threading.Event()
        filters = [host_starts(EXPERIMENT)]
        for vm in self.sample:
            topics = Topics(EXPERIMENT, vm)
            filters += [topics.down, topics.start]
        self.filters = filters
        c = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"bench-probe-{os.getpid()}", protocol=mqtt.MQTTv5
        )
        c.on_connect = lambda cl, *_a: cl.subscribe([(f, 0) for f in filters])
        c.on_subscribe = lambda *_a: self.subscribed.set()
        c.on_message = self._msg
        c.connect("127.0.0.1", port)
        c.loop_start()
        self.client = c

    def _msg(self, _c: Any, _u: Any, msg: Any) -> None:
        now = time.time()
        if b'"start_time"' not in msg.payload:
            return
        parts = msg.topic.split("/")
        key = parts[2] if parts[2] != "_hosts" else "host:" + parts[3]
        self.first.setdefault(key, now)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Workers:
    """The generator processes and their JSON-line output."""

    def __init__(self, n: int, procs: int, port: int, root: str, first: int = 0) -> None:
        self.procs: List[subprocess.Popen] = []
        self.q: queue.Queue[Tuple[int, Dict[str, Any]]] = queue.Queue()
        self.progress: Dict[int, Dict[str, int]] = {}
        self.reports: Dict[int, Dict[str, Any]] = {}
        self.rx_docs: Dict[int, Dict[str, Any]] = {}
        per = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        name = f"worker{first}-" if first else "worker"
        for i, count in enumerate(per):
            argv = [sys.executable, os.path.abspath(__file__), "--worker", "--port", str(port),
                    "--experiment", EXPERIMENT, "--first", str(first), "--count", str(count),
                    *(["--agent-heartbeats"] if AGENT_HEARTBEATS else [])]  # fmt: skip
            first += count
            err = os.path.join(root, f"{name}{i}.err")
            p = spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out_file(err))
            self.procs.append(p)
            threading.Thread(target=self._reader, args=(i, p), daemon=True).start()
        ups = 0
        deadline = time.monotonic() + 60
        while ups < len(self.procs):
            _i, doc = self.q.get(timeout=max(0.1, deadline - time.monotonic()))
            ups += doc.get("ev") == "up"

    def _reader(self, i: int, p: subprocess.Popen) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("ev") == "progress":
                self.progress[i] = doc
            elif doc.get("ev") == "report":
                self.reports[i] = doc
            elif doc.get("ev") == "rx":
                self.rx_docs[i] = doc
            self.q.put((i, doc))

    def send(self, line: str) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write((line + "\n").encode())
            p.stdin.flush()

    def total(self, key: str) -> int:
        return sum(int(d.get(key, 0)) for d in self.progress.values())

    def wait_total(self, key: str, n: int, timeout: float = WAIT) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.total(key) >= n:
                return True
            try:
                self.q.get(timeout=0.05)
            except queue.Empty:
                pass
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError("a generator process died (see worker*.err)")
        return False

    def _ask(self, command: str, answers: Dict[int, Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Send ``command`` to every generator; their answers (filed in ``answers`` by
        :meth:`_reader`), those that came within 60 s."""
        answers.clear()
        self.send(command)
        deadline = time.monotonic() + 60
        while len(answers) < len(self.procs) and time.monotonic() < deadline:
            try:
                self.q.get(timeout=0.05)
            except queue.Empty:
                pass
        return list(answers.values())

    def rx(self) -> Dict[str, Any]:
        """What the simulated VMs received since ``mark``: ``{"msgs", "bytes", "types": {type: n}}``."""
        total: Dict[str, Any] = {"msgs": 0, "bytes": 0, "types": {}}
        for doc in self._ask("rx", self.rx_docs):
            total["msgs"] += doc["msgs"]
            total["bytes"] += doc["bytes"]
            for t, k in doc["types"].items():
                total["types"][t] = total["types"].get(t, 0) + k
        return total

    def report(self) -> List[Dict[str, Any]]:
        return [vm for r in self._ask("report", self.reports) for vm in r["vms"]]

    def quit(self) -> None:
        try:
            self.send("quit")
        except (OSError, ValueError):
            pass
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                pass
            stop(p, 5.0)


def write_broker_conf(root: str, port: int, extra: Sequence[str] = ()) -> str:
    """An anonymous broker's config (persistence as ``vmr-host mqtt-config`` writes it), with
    ``extra`` lines at the end (a bridge's ``connection`` section)."""
    import getpass

    os.makedirs(root, exist_ok=True)
    conf = os.path.join(root, "mosquitto.conf")
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    lines = [
        f"user {getpass.getuser()}",
        # persistence as `vmr-host mqtt-config` writes it (no autosave_interval: mosquitto's default)
        "persistence true",
        f"persistence_location {root}/data/",
        f"log_dest file {root}/mosquitto.log",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "log_timestamp true",
        "max_packet_size 4194304",
        "max_queued_messages 100000",
        "sys_interval 1",
        f"listener {port} 127.0.0.1",
        "allow_anonymous true",
        *extra,
    ]
    with open(conf, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return conf


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mosquitto exited {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("mosquitto did not listen")


def out_file(path: str, mode: str = "wb") -> Any:
    """A file a child process writes to (owned by the child for its life); ``mode="ab"``: after
    what an earlier process wrote (a restarted host)."""
    return open(path, mode)


def text(path: str) -> str:
    with open(path, errors="replace") as fh:
        return fh.read()


def read_json(path: str) -> Dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


def stats_ms(values: Sequence[float]) -> Dict[str, float]:
    v = [x * 1000.0 for x in values]
    return {"p50": pct(v, 50), "p99": pct(v, 99), "max": max(v) if v else math.nan,
            "min": min(v) if v else math.nan, "n": len(v)}  # fmt: skip


def run_once(
    n: int, procs: int, window: float, idle: float, buffer: float, keep: bool, shim: bool
) -> Dict[str, Any]:
    """One experiment with ``n`` simulated agents; returns the figures."""
    import psutil

    root = tempfile.mkdtemp(dir="/tmp", prefix="vbm")
    sch, logs = os.path.join(root, "sch"), os.path.join(root, "logs")
    os.makedirs(sch)
    for i in range(n):
        with open(os.path.join(sch, vm_name(i) + ".yaml"), "w") as fh:
            fh.write("- {start_time: 1, executable: /bin/true}\n")
    global WAIT
    WAIT = max(120.0, 0.15 * n)  # the host's work per VM report grows with N (see README)
    fig: Dict[str, Any] = {"n": n, "procs": procs, "root": root, "shim": shim}
    port = free_port()
    sampler = Sampler()
    sampler.start()
    broker = host = None
    workers: Optional[Workers] = None
    sysw: Optional[SysWatch] = None
    psutil.cpu_percent(None)
    load0 = os.getloadavg()[0]
    t_run = time.monotonic()
    try:
        broker = spawn(
            [MOSQUITTO, "-c", write_broker_conf(root, port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=out_file(os.path.join(root, "mosquitto.err")),
        )
        wait_port(port, broker)
        sampler.add("broker", broker.pid)
        fig["broker_nofile"] = psutil.Process(broker.pid).rlimit(psutil.RLIMIT_NOFILE)[0]
        sysw = SysWatch(port)
        # ---- the host
        herr = os.path.join(root, "host.err")
        t_host = time.time()
        launcher = [sys.executable, os.path.abspath(__file__), "--host-with-poll"] if shim else vmr_host()
        host_argv = [*launcher, "serve", "--transport", "mqtt", "--broker", f"mqtt://127.0.0.1:{port}",
                     "--experiment", EXPERIMENT, "--host-id", "h1", "--schedules", sch, "--logs", logs,
                     "--start-buffer", str(buffer)]  # fmt: skip
        host = spawn(host_argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=out_file(herr),
                     env=spawn_env())  # fmt: skip
        sampler.add("host", host.pid)
        host_wait = max(HOST_CONNECT_WAIT, 0.006 * n)  # start-up opens 2 logs per VM
        deadline = time.monotonic() + host_wait
        while True:
            if host.poll() is not None:  # e.g. its open-files limit cannot cover N VMs
                fig["host_never_connected"] = f"vmr-host exited {host.returncode}: {text(herr)[-2000:]}"
                return fig
            if "connected to broker" in text(herr):
                break
            if time.monotonic() > deadline:
                retries = text(herr).count("no answer from broker")
                fig["host_never_connected"] = (
                    f"not connected after {host_wait:.0f} s ({retries} x 'no answer from broker')"
                )
                fig["host_fds_none"] = sampler.fds("host")
                return fig
            time.sleep(0.05)
        fig["host_up_s"] = time.time() - t_host
        time.sleep(1.0)
        c0 = sampler.cpu("host")
        time.sleep(2.0)
        fig["host_cpu_pct_none"] = (sampler.cpu("host") - c0) / 2.0 * 100
        fig["host_rss_none"] = sampler.rss("host")
        fig["host_fds_none"] = sampler.fds("host")
        fig["host_threads"] = psutil.Process(host.pid).num_threads()
        fig["broker_rss_none"] = sampler.rss("broker")
        # ---- the generators
        workers = Workers(n, procs, port, root)
        for i, p in enumerate(workers.procs):
            sampler.add(f"w{i}", p.pid)
        cpu = {k: sampler.cpu(k) for k in ("host", "broker")}
        wcpu0 = sum(sampler.cpu(f"w{i}") for i in range(procs))
        t_cmd = time.time()
        workers.send("connect")
        ok = workers.wait_total("connected", n)
        t_conn = time.time()
        ok = ok and workers.wait_total("ready", n)
        t_ready = time.time()
        fig["all_connected"] = ok
        fig["connect_all_s"] = t_conn - t_cmd
        fig["ready_all_s"] = t_ready - t_cmd
        fig["host_cpu_s_connect"] = sampler.cpu("host") - cpu["host"]
        fig["broker_cpu_s_connect"] = sampler.cpu("broker") - cpu["broker"]
        # ---- idle, N connected
        time.sleep(2.0)
        cpu = {k: sampler.cpu(k) for k in ("host", "broker")}
        wcpu1 = sum(sampler.cpu(f"w{i}") for i in range(procs))
        time.sleep(idle)
        fig["host_cpu_pct_idle"] = (sampler.cpu("host") - cpu["host"]) / idle * 100
        fig["broker_cpu_pct_idle"] = (sampler.cpu("broker") - cpu["broker"]) / idle * 100
        fig["gen_cpu_pct_idle"] = (sum(sampler.cpu(f"w{i}") for i in range(procs)) - wcpu1) / idle * 100
        fig["host_rss_idle"] = sampler.rss("host")
        fig["host_fds_idle"] = sampler.fds("host")
        fig["broker_rss_idle"] = sampler.rss("broker")
        fig["broker_fds_idle"] = sampler.fds("broker")
        fig["sys_connected"] = sysw.get("clients/connected")
        fig["sys_heap"] = sysw.get("heap/current")
        # ---- configured -> start time
        probe = Probe(port, n)
        probe.subscribed.wait(10)
        cpu = {k: sampler.cpu(k) for k in ("host", "broker")}
        wcpu2 = sum(sampler.cpu(f"w{i}") for i in range(procs))
        t0 = time.time() + 0.5
        workers.send(f"configured {t0:.6f} {window} {n}")
        ok = workers.wait_total("started", n)
        fig["all_started"] = ok
        time.sleep(1.0)
        probe.close()
        fig["probe"] = {"sample": probe.sample, "first": dict(probe.first)}
        fig["host_cpu_s_start"] = sampler.cpu("host") - cpu["host"]
        fig["broker_cpu_s_start"] = sampler.cpu("broker") - cpu["broker"]
        fig["gen_cpu_s_start"] = sum(sampler.cpu(f"w{i}") for i in range(procs)) - wcpu2
        fig["start_phase_s"] = time.time() - t0
        # ---- RESUME
        cpu = {k: sampler.cpu(k) for k in ("host", "broker")}
        t_cli = time.time()
        r = subprocess.run([*vmr_host(), "resume", "--all", "--force", "--logs", logs, "--json"],
                           capture_output=True, text=True, timeout=WAIT, env=spawn_env())  # fmt: skip
        fig["cli_wall_s"] = time.time() - t_cli
        fig["cli_rc"] = r.returncode
        ok = workers.wait_total("resumed", n)
        fig["all_resumed"] = ok
        # wait until the host recorded every answer (experiment.json), bounded
        deadline = time.monotonic() + WAIT
        exp: Dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                exp = read_json(os.path.join(logs, "experiment.json"))
                if exp.get("resumes") and len(exp["resumes"][-1].get("answered", {})) >= n:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        time.sleep(0.5)
        fig["host_cpu_s_resume"] = sampler.cpu("host") - cpu["host"]
        fig["broker_cpu_s_resume"] = sampler.cpu("broker") - cpu["broker"]
        host_cpu_before_restart = sampler.cpu("host")
        fig["gen_cpu_s_total"] = sum(sampler.cpu(f"w{i}") for i in range(procs)) - wcpu0
        fig["host_cpu_s_total"] = host_cpu_before_restart
        fig["broker_cpu_s_total"] = sampler.cpu("broker")
        fig["host_rss_max"] = sampler.rss_max.get("host")
        fig["broker_rss_max"] = sampler.rss_max.get("broker")
        fig["sys_connected_max"] = sysw.max_connected
        fig["machine_busy_pct"] = psutil.cpu_percent(None)
        fig["load1"] = (load0, os.getloadavg()[0])
        fig["run_s"] = time.monotonic() - t_run
        # ---- the host restarted: what it sends the VMs again
        host = restart_host(fig, host, host_argv, herr, workers, sampler, host_wait)
        # ---- per-VM records
        vms = workers.report()
        fig["vms_reported"] = len(vms)
        analyse(fig, vms, exp, t_cmd, t_cli)
        routine = ("serving", "connected to broker", "start time set", "RESUME resume-", "vmr-host stopped")
        fig["host_warnings"] = sum(
            1
            for line in text(herr).splitlines()
            if (" WARNING " in line or " ERROR " in line) and not any(r in line for r in routine)
        )
        fig["host_errors"] = [line.strip()[:200] for line in text(herr).splitlines() if " ERROR " in line][:5]
        return fig
    finally:
        if workers is not None:
            workers.quit()
        if sysw is not None:
            sysw.close()
        stop(host, 20.0)
        stop(broker, 10.0)
        sampler.stop_ev.set()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


#: Seconds without a message to any simulated VM after which a restarted host is done sending,
#: and the longest count after it connected (a host that heartbeats is never quiet).
RESTART_QUIET, RESTART_WINDOW = 5.0, 30.0


def restart_host(
    fig: Dict[str, Any],
    host: subprocess.Popen,
    argv: List[str],
    herr: str,
    workers: Workers,
    sampler: Sampler,
    host_wait: float,
) -> subprocess.Popen:
    """Stop the host (SIGTERM), start it again on its logs, and count what reaches the VMs
    from then until nothing has for :data:`RESTART_QUIET` s, at most :data:`RESTART_WINDOW` s
    after it connected (every message the broker
    delivers to a simulated VM: the host's on ``down``, the VM's retained ``start``, the host
    start topic's fan-out), by event type; the new host's CPU seconds meanwhile. Returns the
    new host process."""
    stop(host, 20.0)
    workers.send("mark")
    connects = text(herr).count("connected to broker")
    t0 = time.monotonic()
    host = spawn(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=out_file(herr, "ab"),
        env=spawn_env(),
    )
    sampler.add("host", host.pid)
    deadline = t0 + host_wait
    while text(herr).count("connected to broker") <= connects and time.monotonic() < deadline:
        time.sleep(0.05)
    fig["restart_connected_s"] = time.monotonic() - t0
    last, quiet_since = -1, time.monotonic()
    end = time.monotonic() + RESTART_WINDOW
    while time.monotonic() - quiet_since < RESTART_QUIET and time.monotonic() < end:
        got = workers.rx()["msgs"]
        if got != last:
            last, quiet_since = got, time.monotonic()
        time.sleep(0.5)
    rx = workers.rx()
    fig["restart_rx_msgs"], fig["restart_rx_bytes"], fig["restart_rx_types"] = (
        rx["msgs"],
        rx["bytes"],
        rx["types"],
    )
    fig["restart_host_cpu_s"] = sampler.cpu("host")
    fig["restart_count_s"] = time.monotonic() - t0
    return host


def analyse(
    fig: Dict[str, Any], vms: List[Dict[str, Any]], exp: Dict[str, Any], t_cmd: float, t_cli: float
) -> None:
    def col(key: str) -> List[float]:
        return [v[key] for v in vms if key in v]

    fig["connect_lat"] = stats_ms([v["t_connack"] - v["t_connect"] for v in vms if "t_connack" in v])
    fig["connect_errors"] = sum(v.get("connect_errors", 0) for v in vms)
    fig["refused"] = sum(1 for v in vms if "refused" in v)
    fig["handshake_lat"] = stats_ms([v["t_welcome"] - v["t_connack"] for v in vms if "t_welcome" in v])
    fig["schedules_per_vm"] = (min(col("schedules") or [0]), max(col("schedules") or [0]))
    fig["vms_schedule_twice"] = sum(1 for v in vms if v.get("schedules", 0) > 1)
    fig["vms_two_welcomes"] = sum(1 for v in vms if v.get("welcomes", 0) > 1)  # the restart's included
    fig["disconnects"] = sum(v.get("disconnects", 0) for v in vms)
    cfg = col("t_configured")
    last_cfg = max(cfg)
    fig["cfg_span_s"] = last_cfg - min(cfg)
    fig["cfg_ack_lat"] = stats_ms(
        [v["t_configured_acked"] - v["t_configured"] for v in vms if "t_configured_acked" in v]
    )
    starts = col("t_start")
    fig["start_recv"] = stats_ms([t - last_cfg for t in starts])
    fig["start_spread_ms"] = (max(starts) - min(starts)) * 1000 if starts else math.nan
    fig["start_via_down"] = sum(1 for v in vms if v.get("start_via") == "down")
    fig["start_via_host"] = sum(1 for v in vms if v.get("start_via") == "host")
    fig["start_copies"] = sum(
        v.get("n_start_down", 0) + v.get("n_start_retained", 0) + v.get("n_start_host", 0) for v in vms
    )
    fig["start_kernel_to_processed"] = stats_ms(
        [v["t_start"] - v["t_start_kernel"] for v in vms if "t_start_kernel" in v and "t_start" in v]
    )
    fig["start_retained_after_down"] = stats_ms(
        [
            v["t_start_retained"] - v["t_start_down"]
            for v in vms
            if "t_start_retained" in v and "t_start_down" in v
        ]
    )
    fig["start_values"] = len({v.get("start_time") for v in vms if "start_time" in v})
    barrier = exp.get("barrier", {})
    host_cfg = list((barrier.get("configured") or {}).values())
    set_at = exp.get("start_set_at")
    if host_cfg:
        fig["host_last_cfg_lag_ms"] = (max(host_cfg) - last_cfg) * 1000
    if set_at:
        fig["host_set_after_last_cfg_ms"] = (set_at - last_cfg) * 1000
        fig["start_recv_from_set"] = stats_ms([t - set_at for t in starts])
        fig["start_first_after_set_ms"] = (min(starts) - set_at) * 1000
        fig["start_kernel_from_set"] = stats_ms(
            [v["t_start_kernel"] - set_at for v in vms if "t_start_kernel" in v]
        )
        probe_split(fig, vms, set_at)
    resumes = col("t_resume")
    fig["resume_from_cli"] = stats_ms([t - t_cli for t in resumes])
    fig["resume_spread_ms"] = (max(resumes) - min(resumes)) * 1000 if resumes else math.nan
    fig["resume_ack_lat"] = stats_ms(
        [v["t_resume_acked"] - v["t_resume"] for v in vms if "t_resume_acked" in v]
    )
    if exp.get("resumes"):
        rec = exp["resumes"][-1]
        issued = float(rec["issued"])
        fig["cli_to_issued_ms"] = (issued - t_cli) * 1000
        fig["resume_from_issued"] = stats_ms([t - issued for t in resumes])
        answered = [a["received"] for a in rec.get("answered", {}).values() if "received" in a]
        fig["host_answers"] = len(answered)
        if answered:
            fig["host_all_answers_ms"] = (max(answered) - issued) * 1000


def probe_split(fig: Dict[str, Any], vms: List[Dict[str, Any]], set_at: float) -> None:
    """Host set -> the broker sent a sampled VM its start (the probe's receive time: its host's
    start topic or the VM's own topics, whichever came first) -> the generator processed it."""
    probe = fig.get("probe") or {}
    first = probe.get("first") or {}
    broadcast = min((t for k, t in first.items() if k.startswith("host:")), default=None)
    out: List[float] = []
    lag: List[float] = []
    by_vm = {v["vm"]: v for v in vms}
    for vm in probe.get("sample") or []:
        seen = [t for t in (first.get(vm), broadcast) if t is not None]
        rec = by_vm.get(vm, {})
        if not seen or "t_start" not in rec:
            continue
        out.append(min(seen) - set_at)
        lag.append(rec["t_start"] - min(seen))
    fig["probe_n"] = len(out)
    fig["probe_out_from_set"] = stats_ms(out)
    fig["probe_to_processed"] = stats_ms(lag)
    fig["probe_broadcast_ms"] = None if broadcast is None else (broadcast - set_at) * 1000


# =========================================================================== two hosts, bridged
# ``--bridged``: a coordinator host (h1) and a member host (h2), N simulated VMs each, on two
# mosquittos joined by the bridge ``vmr-host mqtt-config --bridge-to`` writes (the product's
# ``render_bridge``; the brokers are anonymous here, as above), and the same two hosts on one
# broker as the baseline, run one after the other in the same invocation.
def start_broker(
    root: str, port: int, sampler: Sampler, name: str, extra: Sequence[str] = ()
) -> subprocess.Popen:
    """A mosquitto on ``port`` (config in ``root``), sampled as ``name``."""
    broker = spawn(
        [MOSQUITTO, "-c", write_broker_conf(root, port, extra)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=out_file(os.path.join(root, "mosquitto.err")),
    )
    wait_port(port, broker)
    sampler.add(name, broker.pid)
    return broker


def bridge_lines(root: str, coordinator_port: int) -> List[str]:
    """The ``connection`` section that ``mqtt-config --bridge-to 127.0.0.1:PORT`` writes for
    member h2 (the coordinator's broker is anonymous: the bridge's password is not checked)."""
    from vmr_handler.host.cli.mqtt_config.bridges import BridgeFiles, BridgeTo, bridge_user, render_bridge

    bridge = BridgeTo("127.0.0.1", coordinator_port, EXPERIMENT, "h2", bridge_user("h2"), "bench")
    return render_bridge(bridge, BridgeFiles.under(root))


def start_pair_host(
    root: str, port: int, n: int, first: int, role: List[str], shim: bool
) -> subprocess.Popen:
    """``vmr-host serve`` of VMs ``first .. first+n-1`` on the broker at ``port`` (``role``: its
    --host-id and --coordinator/--member flags); returns once it is connected."""
    sch, logs = os.path.join(root, "sch"), os.path.join(root, "logs")
    os.makedirs(sch)
    for i in range(first, first + n):
        with open(os.path.join(sch, vm_name(i) + ".yaml"), "w") as fh:
            fh.write("- {start_time: 1, executable: /bin/true}\n")
    herr = os.path.join(root, "host.err")
    launcher = [sys.executable, os.path.abspath(__file__), "--host-with-poll"] if shim else vmr_host()
    host = spawn(
        [
            *launcher,
            "serve",
            "--transport",
            "mqtt",
            "--broker",
            f"mqtt://127.0.0.1:{port}",
            "--experiment",
            EXPERIMENT,
            *role,
            "--schedules",
            sch,
            "--logs",
            logs,
            "--start-buffer",
            "5",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=out_file(herr),
        env=spawn_env(),
    )
    deadline = time.monotonic() + max(HOST_CONNECT_WAIT, 0.006 * n)
    while "connected to broker" not in text(herr):
        if host.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"vmr-host {role[1]} never connected: {text(herr)[-2000:]}")
        time.sleep(0.05)
    return host


def resume_side(logs: str, workers: Workers, n: int) -> Dict[str, Any]:
    """``vmr-host resume --all --force`` on one host: when the CLI was started (``t_cli``, for
    :func:`analyse_pair`) and CLI exec -> the host recorded every answer (experiment.json), ms."""
    before = workers.total("resumed")
    t_cli = time.time()
    subprocess.run(
        [*vmr_host(), "resume", "--all", "--force", "--logs", logs, "--json"],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env=spawn_env(),
    )
    workers.wait_total("resumed", before + n)
    deadline, answered = time.monotonic() + WAIT, math.nan
    while time.monotonic() < deadline:
        try:
            rec = read_json(os.path.join(logs, "experiment.json"))["resumes"][-1]
        except (OSError, ValueError, KeyError, IndexError):
            rec = {}
        got = [a["received"] for a in rec.get("answered", {}).values() if "received" in a]
        if len(got) >= n:
            answered = (max(got) - t_cli) * 1000
            break
        time.sleep(0.1)
    return {"t_cli": t_cli, "answers_ms": answered}


def run_pair(n: int, procs: int, window: float, keep: bool, shim: bool, bridged: bool) -> Dict[str, Any]:
    """h1 (coordinator, VMs 0..N-1) and h2 (member, VMs N..2N-1): on one broker, or each on its
    own with ``bridged``; the barrier -> start, RESUME to each side, CPU of hosts and brokers."""
    root = tempfile.mkdtemp(dir="/tmp", prefix="vbp")
    fig: Dict[str, Any] = {"n": n, "bridged": bridged, "root": root}
    sampler = Sampler()
    sampler.start()
    ports = {"A": free_port(), "B": free_port() if bridged else 0}
    procs_started: List[subprocess.Popen] = []
    sides: Dict[str, Workers] = {}
    t_run = time.monotonic()
    try:
        procs_started.append(start_broker(os.path.join(root, "A"), ports["A"], sampler, "broker A"))
        if bridged:
            broot = os.path.join(root, "B")
            procs_started.append(
                start_broker(broot, ports["B"], sampler, "broker B", bridge_lines(broot, ports["A"]))
            )
        port_b = ports["B"] if bridged else ports["A"]
        roles = {
            "h1": ["--host-id", "h1", "--coordinator", "--peers", "h2"],
            "h2": ["--host-id", "h2", "--member"],
        }
        for name, port, first in (("h1", ports["A"], 0), ("h2", port_b, n)):
            host = start_pair_host(os.path.join(root, name), port, n, first, roles[name], shim)
            procs_started.append(host)
            sampler.add(name, host.pid)
        names = ["h1", "h2", "broker A", *(["broker B"] if bridged else [])]
        sides = {"h1": Workers(n, procs, ports["A"], root), "h2": Workers(n, procs, port_b, root, first=n)}
        cpu0 = {k: sampler.cpu(k) for k in names}
        for w in sides.values():
            w.send("connect")
        fig["all_ready"] = all(w.wait_total("ready", n) for w in sides.values())
        time.sleep(2.0)
        cpu1 = {k: sampler.cpu(k) for k in names}
        t0 = time.time() + 0.5
        for w in sides.values():
            w.send(f"configured {t0:.6f} {window} {2 * n}")
        fig["all_started"] = all(w.wait_total("started", n) for w in sides.values())
        time.sleep(1.0)
        cpu2 = {k: sampler.cpu(k) for k in names}
        fig["resume"] = {h: resume_side(os.path.join(root, h, "logs"), sides[h], n) for h in ("h1", "h2")}
        time.sleep(0.5)
        cpu3 = {k: sampler.cpu(k) for k in names}
        fig["cpu_s"] = {
            k: {
                "connect": cpu1[k] - cpu0[k],
                "start": cpu2[k] - cpu1[k],
                "resume": cpu3[k] - cpu2[k],
                "total": cpu3[k],
            }
            for k in names
        }
        fig["rss_max_mb"] = {k: sampler.rss_max.get(k, 0) / 1e6 for k in names}
        fig["run_s"] = time.monotonic() - t_run
        vms = {h: w.report() for h, w in sides.items()}
        exps = {h: read_json(os.path.join(root, h, "logs", "experiment.json")) for h in sides}
        analyse_pair(fig, vms, exps)
        return fig
    finally:
        for w in sides.values():
            w.quit()
        for proc in reversed(procs_started):
            stop(proc, 20.0)
        sampler.stop_ev.set()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def analyse_pair(
    fig: Dict[str, Any], vms: Dict[str, List[Dict[str, Any]]], exps: Dict[str, Dict[str, Any]]
) -> None:
    """The start across both sides: last configured sent -> every VM has its start (each side
    and all), the spread of receive times, one start value; the coordinator's set -> the
    member's adoption (across the bridge); schedules per VM and disconnects."""
    every = [v for side in vms.values() for v in side]
    last_cfg = max(v["t_configured"] for v in every if "t_configured" in v)
    set_at = exps["h1"].get("start_set_at")
    fig["start_values"] = len({v.get("start_time") for v in every if "start_time" in v})
    fig["host_start_values"] = len({e.get("start_time") for e in exps.values()})
    fig["coordinator_set_after_last_cfg_ms"] = (set_at - last_cfg) * 1000 if set_at else math.nan
    member_set = exps["h2"].get("start_set_at")
    fig["member_adopted_after_set_ms"] = (member_set - set_at) * 1000 if set_at and member_set else math.nan
    for side, recs in (*vms.items(), ("all", every)):
        starts = [v["t_start"] for v in recs if "t_start" in v]
        fig[f"start_{side}"] = {
            "n": len(starts),
            "from_last_cfg": stats_ms([t - last_cfg for t in starts]),
            "from_set": stats_ms([t - set_at for t in starts]) if set_at else {},
        }
    for side, recs in vms.items():  # each VM got one RESUME: its own host's
        resumed = [v["t_resume"] for v in recs if "t_resume" in v]
        t_cli = fig["resume"][side]["t_cli"]
        fig["resume"][side]["all_have_ms"] = (max(resumed) - t_cli) * 1000 if resumed else math.nan
    starts = [v["t_start"] for v in every if "t_start" in v]
    fig["start_spread_ms"] = (max(starts) - min(starts)) * 1000 if starts else math.nan
    fig["schedules_max"] = max((v.get("schedules", 0) for v in every), default=0)
    fig["disconnects"] = sum(v.get("disconnects", 0) for v in every)


#: The processes of a pair run, as sampled.
SAMPLED = ("h1", "h2", "broker A", "broker B")


def _get(key: str) -> Any:
    return lambda r: r[key]


PAIR_ROWS: List[Tuple[str, Any, str, int]] = [
    ("VMs (h1 coordinator + h2 member)", lambda r: 2 * r["n"], "", 0),
    (
        "start values: among all VMs / the two hosts",
        lambda r: f"{r['start_values']} / {r['host_start_values']}",
        "",
        0,
    ),
    (
        "coordinator set the start, after the last configured, ms",
        _get("coordinator_set_after_last_cfg_ms"),
        "ms",
        0,
    ),
    (
        "member adopted it after the coordinator set it, ms",
        lambda r: r["member_adopted_after_set_ms"],
        "ms",
        0,
    ),
    (
        "barrier -> start: last configured sent -> all 2N have it, ms",
        lambda r: r["start_all"]["from_last_cfg"]["max"],
        "ms",
        0,
    ),
    ("  coordinator set -> h1's VMs have it p50 / max, ms", lambda r: _pm(r["start_h1"]["from_set"]), "", 0),
    ("  coordinator set -> h2's VMs have it p50 / max, ms", lambda r: _pm(r["start_h2"]["from_set"]), "", 0),
    ("start spread across both sides (first -> last VM), ms", lambda r: r["start_spread_ms"], "ms", 0),
    (
        "RESUME h1 --all: CLI exec -> all N have it / answers recorded, ms",
        lambda r: f"{r['resume']['h1']['all_have_ms']:.0f} / {r['resume']['h1']['answers_ms']:.0f}",
        "",
        0,
    ),
    (
        "RESUME h2 --all: CLI exec -> all N have it / answers recorded, ms",
        lambda r: f"{r['resume']['h2']['all_have_ms']:.0f} / {r['resume']['h2']['answers_ms']:.0f}",
        "",
        0,
    ),
    ("CPU s connect+handshakes: h1 / h2 / broker A / broker B", lambda r: _cpu(r, "connect"), "", 0),
    ("CPU s configured+start: h1 / h2 / broker A / broker B", lambda r: _cpu(r, "start"), "", 0),
    ("CPU s RESUME x2: h1 / h2 / broker A / broker B", lambda r: _cpu(r, "resume"), "", 0),
    ("CPU s whole run: h1 / h2 / broker A / broker B", lambda r: _cpu(r, "total"), "", 0),
    (
        "RSS max MB: h1 / h2 / broker A / broker B",
        lambda r: " / ".join(f"{r['rss_max_mb'][k]:.0f}" if k in r["rss_max_mb"] else "-" for k in SAMPLED),
        "",
        0,
    ),
    ("schedules per VM (max), disconnects", lambda r: f"{r['schedules_max']}, {r['disconnects']}", "", 0),
    ("run, s", lambda r: r["run_s"], "s", 0),
]


def _pm(stats: Dict[str, float]) -> str:
    return f"{stats.get('p50', math.nan):.0f} / {stats.get('max', math.nan):.0f}"


def _cpu(r: Dict[str, Any], phase: str) -> str:
    return " / ".join(
        "-" if k not in r["cpu_s"] else f"{r['cpu_s'][k][phase]:.2f}"
        for k in ("h1", "h2", "broker A", "broker B")
    )


def print_pair_table(results: Dict[int, Dict[bool, List[Dict[str, Any]]]]) -> None:
    """One row per figure; per N a column for one broker and one for the bridged pair (each a
    run's value, runs separated by ``;``)."""
    head = ["metric"] + [
        f"N={n} x 2, {'bridged' if b else 'one broker'}" for n in sorted(results) for b in (False, True)
    ]
    rows = []
    for label, get, unit, nd in PAIR_ROWS:
        row = [label]
        for n in sorted(results):
            for bridged in (False, True):
                vals = []
                for r in results[n].get(bridged, []):
                    try:
                        v = get(r)
                    except (KeyError, TypeError, IndexError, ValueError):
                        v = None
                    vals.append(v if isinstance(v, str) else _f(v, unit, nd))
                row.append("; ".join(vals) or "n/a")
        rows.append(row)
    widths = [max(len(r[i]) for r in [*rows, head]) for i in range(len(head))]
    print("| " + " | ".join(h.ljust(widths[i]) for i, h in enumerate(head)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(r)) + " |")
    print("\ncells: each run's value, runs separated by ';'. One broker: both hosts and all 2N VMs on it.")


def main_bridged(args: argparse.Namespace, sizes: List[int]) -> Dict[int, Dict[bool, List[Dict[str, Any]]]]:
    """``--bridged``: per N and run, the one-broker baseline then the bridged pair."""
    results: Dict[int, Dict[bool, List[Dict[str, Any]]]] = {}
    for n in sizes:
        shim = args.shim == "on" or (args.shim == "auto" and n > 450)
        for i in range(args.runs):
            for bridged in (False, True):
                print(
                    f"\n== 2 x N={n} run {i + 1}/{args.runs}, {'bridged' if bridged else 'one broker'} ==",
                    flush=True,
                )
                fig = run_pair(n, args.procs, args.window, args.keep, shim, bridged)
                results.setdefault(n, {}).setdefault(bridged, []).append(fig)
                last = fig["start_all"]["from_last_cfg"]["max"]
                spread, took = fig["start_spread_ms"], fig["run_s"]
                print(
                    f"  all 2N had the start {last:.0f} ms after the last configured, spread {spread:.0f} ms;"
                    f" run {took:.0f} s",
                    flush=True,
                )
    print()
    print_pair_table(results)
    return results


# =========================================================================== printing
def _f(x: Any, unit: str = "ms", nd: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if unit == "ms":
        return f"{x:.{nd}f}"
    if unit == "MB":
        return f"{x / 1e6:.1f}"
    return f"{x:.{nd}f}"


def cell(runs: List[Dict[str, Any]], get: Any, unit: str = "ms", nd: int = 0) -> str:
    vals = []
    for r in runs:
        try:
            v = get(r)
        except (KeyError, TypeError, IndexError):
            v = None
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            vals.append(float(v))
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return _f(vals[0], unit, nd)
    lo, hi = min(vals), max(vals)
    return f"{_f(statistics.median(vals), unit, nd)} ({_f(lo, unit, nd)}-{_f(hi, unit, nd)})"


ROWS: List[Tuple[str, Any, str, int]] = [
    ("connect: all N CONNACKed after the connect command, s", lambda r: r["connect_all_s"], "s", 2),
    ("connect: per client, connect() -> CONNACK p50 / p99 / max, ms", lambda r: None, "", 0),
    ("  p50", lambda r: r["connect_lat"]["p50"], "ms", 1),
    ("  p99", lambda r: r["connect_lat"]["p99"], "ms", 0),
    ("  max", lambda r: r["connect_lat"]["max"], "ms", 0),
    ("connect: CONNACK -> welcome p50 / max, ms", lambda r: None, "", 0),
    ("  p50", lambda r: r["handshake_lat"]["p50"], "ms", 0),
    ("  max", lambda r: r["handshake_lat"]["max"], "ms", 0),
    ("all N welcomed + schedule result acked, s (from connect command)", lambda r: r["ready_all_s"], "s", 2),
    (
        "broker connections ($SYS clients/connected, incl. host + $SYS watcher)",
        lambda r: r["sys_connected"],
        "",
        0,
    ),
    ("broker fds (psutil)", lambda r: r["broker_fds_idle"], "", 0),
    ("configured: span of sends (first -> last), s", lambda r: r["cfg_span_s"], "s", 2),
    ("configured: sent -> host ack p50, ms", lambda r: r["cfg_ack_lat"]["p50"], "ms", 1),
    ("configured: sent -> host ack p99, ms", lambda r: r["cfg_ack_lat"]["p99"], "ms", 0),
    ("configured: sent -> host ack max, ms", lambda r: r["cfg_ack_lat"]["max"], "ms", 0),
    ("host received the last configured after it was sent, ms", lambda r: r["host_last_cfg_lag_ms"], "ms", 1),
    (
        "host set the start after the last configured was sent, ms",
        lambda r: r["host_set_after_last_cfg_ms"],
        "ms",
        1,
    ),
    ("START: last configured sent -> start_time received, p50 ms", lambda r: r["start_recv"]["p50"], "ms", 0),
    ("START: ... p99 ms", lambda r: r["start_recv"]["p99"], "ms", 0),
    ("START: ... max (= all N have it) ms", lambda r: r["start_recv"]["max"], "ms", 0),
    ("START: host set -> received p50 ms", lambda r: r["start_recv_from_set"]["p50"], "ms", 0),
    ("START: host set -> received max ms", lambda r: r["start_recv_from_set"]["max"], "ms", 0),
    ("START: spread of receive times across VMs, ms", lambda r: r["start_spread_ms"], "ms", 0),
    (
        "START: VMs that got it first on down (rest: retained start topic)",
        lambda r: r["start_via_down"],
        "",
        0,
    ),
    ("START: VMs that got it first on their host's start topic", lambda r: r["start_via_host"], "", 0),
    ("START: start messages the generators received (all topics)", lambda r: r["start_copies"], "", 0),
    ("START: host set -> probe has the broadcast, ms", lambda r: r["probe_broadcast_ms"], "ms", 0),
    ("START: set -> probe has a VM's start p50, ms", lambda r: r["probe_out_from_set"]["p50"], "ms", 0),
    ("START: ... max, ms", lambda r: r["probe_out_from_set"]["max"], "ms", 0),
    ("START: probe has it -> generator done p50, ms", lambda r: r["probe_to_processed"]["p50"], "ms", 0),
    ("START: ... max, ms", lambda r: r["probe_to_processed"]["max"], "ms", 0),
    ("START: host set -> in the VM's socket p50, ms", lambda r: r["start_kernel_from_set"]["p50"], "ms", 0),
    ("START: ... max (kernel receive time), ms", lambda r: r["start_kernel_from_set"]["max"], "ms", 0),
    ("START: ... VMs with a kernel time", lambda r: r["start_kernel_from_set"]["n"], "", 0),
    ("START: in the socket -> processed p50, ms", lambda r: r["start_kernel_to_processed"]["p50"], "ms", 0),
    ("START: ... max, ms", lambda r: r["start_kernel_to_processed"]["max"], "ms", 0),
    ("RESUME: `vmr-host resume --all` wall time, ms", lambda r: r["cli_wall_s"] * 1000, "ms", 0),
    ("RESUME: CLI exec -> host issued (experiment.json), ms", lambda r: r["cli_to_issued_ms"], "ms", 0),
    ("RESUME: CLI exec -> received p50 ms", lambda r: r["resume_from_cli"]["p50"], "ms", 0),
    ("RESUME: CLI exec -> received max (all N) ms", lambda r: r["resume_from_cli"]["max"], "ms", 0),
    ("RESUME: host issued -> received p50 ms", lambda r: r["resume_from_issued"]["p50"], "ms", 0),
    ("RESUME: host issued -> received max ms", lambda r: r["resume_from_issued"]["max"], "ms", 0),
    ("RESUME: spread of receive times, ms", lambda r: r["resume_spread_ms"], "ms", 0),
    ("RESUME: answer sent -> host ack max, ms", lambda r: r["resume_ack_lat"]["max"], "ms", 0),
    (
        "RESUME: host issued -> host has recorded all N answers, ms",
        lambda r: r["host_all_answers_ms"],
        "ms",
        0,
    ),
    ("host: CPU s, connect + handshakes of N", lambda r: r["host_cpu_s_connect"], "s", 2),
    ("host: CPU % of a core, idle with N connected", lambda r: r["host_cpu_pct_idle"], "s", 1),
    ("host: CPU %, none connected", lambda r: r["host_cpu_pct_none"], "s", 1),
    ("host: CPU s, configured burst + start fan-out", lambda r: r["host_cpu_s_start"], "s", 2),
    ("generators: CPU s, configured burst + start", lambda r: r["gen_cpu_s_start"], "s", 2),
    ("host: CPU s, RESUME until all answers recorded", lambda r: r["host_cpu_s_resume"], "s", 2),
    ("host: CPU s, whole run (incl. start-up)", lambda r: r["host_cpu_s_total"], "s", 1),
    ("host: RSS none connected / idle N / max, MB", lambda r: None, "", 0),
    ("  none", lambda r: r["host_rss_none"], "MB", 1),
    ("  idle N", lambda r: r["host_rss_idle"], "MB", 1),
    ("  max", lambda r: r["host_rss_max"], "MB", 1),
    ("host: fds none connected / idle N", lambda r: None, "", 0),
    ("  none", lambda r: r["host_fds_none"], "", 0),
    ("  idle", lambda r: r["host_fds_idle"], "", 0),
    ("host: start-up until connected to the broker, s", lambda r: r["host_up_s"], "s", 2),
    ("broker: CPU s, connect + handshakes", lambda r: r["broker_cpu_s_connect"], "s", 2),
    ("broker: CPU % idle with N connected", lambda r: r["broker_cpu_pct_idle"], "s", 1),
    ("broker: CPU s, configured + start", lambda r: r["broker_cpu_s_start"], "s", 2),
    ("broker: CPU s, RESUME", lambda r: r["broker_cpu_s_resume"], "s", 2),
    ("broker: RSS none / idle N / max, MB", lambda r: None, "", 0),
    ("  none", lambda r: r["broker_rss_none"], "MB", 1),
    ("  idle N", lambda r: r["broker_rss_idle"], "MB", 1),
    ("  max", lambda r: r["broker_rss_max"], "MB", 1),
    ("generators: CPU % idle (all processes)", lambda r: r["gen_cpu_pct_idle"], "s", 1),
    ("generators: CPU s, whole run", lambda r: r["gen_cpu_s_total"], "s", 1),
    ("machine: CPU busy % over the run (2 cores = 100 %)", lambda r: r["machine_busy_pct"], "s", 0),
    ("machine: load1 before / after", lambda r: None, "", 0),
    ("  before", lambda r: r["load1"][0], "s", 2),
    ("  after", lambda r: r["load1"][1], "s", 2),
    ("checks: schedules per VM (max), disconnects, host warnings", lambda r: None, "", 0),
    ("  schedules per VM max", lambda r: r["schedules_per_vm"][1], "", 0),
    (
        "  VMs that got the schedule twice (2nd hello: host hello > 5 s after theirs)",
        lambda r: r["vms_schedule_twice"],
        "",
        0,
    ),
    (
        "host restarted (SIGTERM, same logs): what reaches the VMs until 5 s quiet (<= 30 s)",
        lambda r: None,
        "",
        0,
    ),
    ("  counted for, s (from the new host's start)", lambda r: r["restart_count_s"], "s", 1),
    ("  messages per VM", lambda r: r["restart_rx_msgs"] / r["n"], "", 2),
    ("  bytes per VM", lambda r: r["restart_rx_bytes"] / r["n"], "", 0),
    ("  start_time events", lambda r: r["restart_rx_types"].get("start_time", 0), "", 0),
    ("  schedule events", lambda r: r["restart_rx_types"].get("schedule", 0), "", 0),
    (
        "  hello + welcome events",
        lambda r: sum(r["restart_rx_types"].get(t, 0) for t in ("hello", "welcome")),
        "",
        0,
    ),
    ("  new host CPU s (start-up included)", lambda r: r["restart_host_cpu_s"], "s", 1),
    ("  disconnects", lambda r: r["disconnects"], "", 0),
    ("  host WARNING/ERROR lines (beyond the 4 routine ones)", lambda r: r["host_warnings"], "", 0),
    ("  host recorded answers", lambda r: r["host_answers"], "", 0),
]


def print_table(results: Dict[int, List[Dict[str, Any]]]) -> None:
    sizes = sorted(results)
    head = ["metric"] + [f"N={n} ({len(results[n])} run{'s' if len(results[n]) != 1 else ''})" for n in sizes]
    rows = []
    for label, get, unit, nd in ROWS:
        try:
            header_only = get({}) is None
        except (KeyError, TypeError, IndexError):
            header_only = False
        rows.append(
            [label]
            + (["" for _ in sizes] if header_only else [cell(results[n], get, unit, nd) for n in sizes])
        )
    widths = [max(len(r[i]) for r in [*rows, head]) for i in range(len(head))]
    print("| " + " | ".join(h.ljust(widths[i]) for i, h in enumerate(head)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(r)) + " |")
    print("\ncells: median (min-max) over the runs; one run: the value.")
    print("\nunix-socket / virtio-serial stand-in, quoted from benchmarks/README.md (bench_host.py):")
    for v in UNIX_QUOTED.values():
        print("  - " + v)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--host-with-poll":
        return host_with_poll(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vms", default="1000", help="simulated agents, or a comma list (e.g. 100,1000)")
    ap.add_argument("--runs", type=int, default=3, help="runs per N (default 3)")
    ap.add_argument("--procs", type=int, default=2, help="generator processes (default 2)")
    ap.add_argument(
        "--window", type=float, default=2.0, help="configured reports spread over this many s (default 2)"
    )
    ap.add_argument("--idle", type=float, default=10.0, help="idle measurement window, s (default 10)")
    ap.add_argument("--start-buffer", type=float, default=30.0, help="vmr-host --start-buffer (default 30)")
    ap.add_argument(
        "--shim",
        choices=["auto", "on", "off"],
        default="auto",
        help="start vmr-host with paho on poll() instead of select() (auto: N > 450; see the code)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the /tmp/vbm* run dirs")
    ap.add_argument("--src", metavar="DIR", help="run vmr-host from this source tree (before/after figures)")
    ap.add_argument("--json", metavar="FILE", help="also write every run's figures as JSON")
    ap.add_argument(
        "--bridged",
        action="store_true",
        help="2 x N VMs: a coordinator and a member host on two bridged brokers, beside both on one broker",
    )
    # worker mode (internal)
    ap.add_argument(
        "--agent-heartbeats",
        action="store_true",
        help="simulated agents heartbeat over MQTT as before the broker told liveness (baseline with --src)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--experiment", default=EXPERIMENT, help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        return worker_main(args)
    sizes = [int(x) for x in args.vms.split(",") if x.strip()]
    global SRC, AGENT_HEARTBEATS
    SRC = os.path.abspath(args.src) if args.src else None
    AGENT_HEARTBEATS = args.agent_heartbeats
    atexit.register(_cleanup)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    limit = raise_nofile(max(sizes) * 3 + 4096)
    print(f"open-files limit (inherited by broker, host, generators): {limit[0]} (hard {limit[1]})")
    print(f"mosquitto {MOSQUITTO}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")  # fmt: skip
    if args.bridged:
        raise_nofile(max(sizes) * 6 + 4096)
        pairs = main_bridged(args, sizes)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(
                    {str(k): {str(b): v for b, v in r.items()} for k, r in pairs.items()}, fh, default=str
                )
        return 0
    results: Dict[int, List[Dict[str, Any]]] = {}
    for n in sizes:
        for i in range(args.runs):
            print(f"\n== N={n} run {i + 1}/{args.runs} ==", flush=True)
            shim = args.shim == "on" or (args.shim == "auto" and n > 450)
            if shim:
                print(
                    "  vmr-host runs with paho on poll() instead of select() (--shim; see README)", flush=True
                )
            fig = run_once(n, args.procs, args.window, args.idle, args.start_buffer, args.keep, shim)
            if fig.get("host_never_connected"):
                print(
                    f"  vmr-host with {n} VMs never connected to the broker: {fig['host_never_connected']}; "
                    f"host fds {fig.get('host_fds_none')}",
                    flush=True,
                )
                continue
            results.setdefault(n, []).append(fig)
            issued_max = fig.get("resume_from_issued", {}).get("max", math.nan)
            print(
                f"  connect {fig['connect_all_s']:.2f} s; start: all N after"
                f" {fig['start_recv']['max']:.0f} ms (p50 {fig['start_recv']['p50']:.0f});"
                f" resume: all N {fig['resume_from_cli']['max']:.0f} ms"
                f" after the CLI exec ({issued_max:.0f} after issued); host CPU idle"
                f" {fig['host_cpu_pct_idle']:.1f} %; run {fig['run_s']:.0f} s; load {fig['load1'][1]:.2f}",
                flush=True,
            )
            if fig.get("host_errors"):
                print("  host errors:", *fig["host_errors"], sep="\n    ")
    print()
    if results:
        print_table(results)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({str(k): v for k, v in results.items()}, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
