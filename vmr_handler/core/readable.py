"""Numbers and bytes as people read them, in every output.

The readable logs (the agent's stderr, the host's ``<vm>.log``), ``vmr-host status`` and the
error texts print times as ISO UTC, durations with a unit and sensible precision, other
numbers with at most 3 decimals, structures as compact JSON (never a Python repr) and bytes
that are not UTF-8 with ``\\xNN`` escapes (never hidden). The ``.jsonl`` logs keep every value
exactly; these are for eyes only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from vmr_handler.core.fsutil import utc_text

TYPE_CHECKING = False  # no ``typing`` on the lean paths (core.commandtable.TYPE_CHECKING)
if TYPE_CHECKING:
    from typing import Any, List, Optional, Sequence

#: A float at least this large in an event is a UTC time, seconds since the epoch (2001-09-09 on);
#: experiment and schedule times are far smaller.
EPOCH_MIN = 1e9
#: Event fields that are durations, seconds.
DURATION_KEYS = frozenset({"duration", "lateness", "late", "buffer", "waited", "elapsed", "delay", "timeout"})


def duration(seconds: float) -> str:
    """A duration with a unit and sensible precision: ``2.1 ms``, ``1.01 s``, ``16.5 s``,
    ``3.2 min``, ``1.5 h`` (negative durations keep their sign)."""
    s = abs(seconds)
    if not math.isfinite(s):
        return "inf" if seconds > 0 else "-inf"
    if s < 1:
        return f"{seconds * 1000:.1f} ms"
    if s < 10:
        return f"{seconds:.2f} s"
    if s < 120:
        return f"{seconds:.1f} s"
    if s < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def number(value: float) -> str:
    """A plain number with at most 3 decimals and no trailing zeros (``-5``, ``12.5``, ``0.123``)."""
    if not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def field_text(key: str, value: Any) -> str:
    """One event field's value for a readable log line (see the module docstring)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if key in DURATION_KEYS:
            return duration(value)
        if abs(value) >= EPOCH_MIN and math.isfinite(value):
            return utc_text(value)
        return number(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return str(value)


def escaped(data: bytes) -> str:
    """``data`` as text: UTF-8 where it is, ``\\xNN`` for every byte that is not."""
    return data.decode("utf-8", "backslashreplace")


def size(count: float) -> str:
    """A byte count with a binary unit: ``512 B``, ``1.5 KiB``, ``3.2 MiB``, ``1.21 GiB``."""
    if not math.isfinite(count):
        return number(count) + " B"
    value, unit = float(count), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024:
            break
        value, unit = value / 1024, bigger
    if unit == "B":
        return f"{value:.0f} B"
    return f"{value:.2f} {unit}" if abs(value) < 10 else f"{value:.1f} {unit}"


def _finite(data: Mapping[str, Any], key: str) -> Optional[float]:
    """``data[key]`` when it is a finite number (not a bool), else None (guest data: any value)."""
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


#: Interfaces named in a readable KPI line (the rest are counted).
KPI_INTERFACES_SHOWN = 4


def kpi_brief(data: Mapping[str, Any]) -> str:
    """The short form of a ``kpi`` sample (``vmr-host status``): ``cpu 12.5%, mem 1.21 GiB/3.85
    GiB, load 0.52``; parts the sample lacks are left out ('-' when none is there)."""
    parts: List[str] = []
    cpu = _finite(data, "cpu_percent")
    if cpu is not None:
        parts.append(f"cpu {number(round(cpu, 1))}%")
    used, total = _finite(data, "mem_used"), _finite(data, "mem_total")
    if used is not None:
        parts.append(f"mem {size(used)}" + (f"/{size(total)}" if total is not None else ""))
    load = data.get("load")
    first = _finite({"v": load[0]}, "v") if isinstance(load, list) and load else None
    if first is not None:
        parts.append(f"load {number(round(first, 2))}")
    return ", ".join(parts) or "-"


def kpi_text(data: Mapping[str, Any]) -> str:
    """The readable line of a ``kpi`` event's data: CPU, load, memory, disk and its
    I/O rates, the network rates of the first :data:`KPI_INTERFACES_SHOWN` interfaces, what
    could not be read, how long the sample took. Any value may be missing or odd (a guest's):
    such parts are left out."""
    parts: List[str] = []
    cpu = _finite(data, "cpu_percent")
    if cpu is not None:
        parts.append(f"cpu {number(round(cpu, 1))}%")
    load = data.get("load")
    loads = [_finite({"v": v}, "v") for v in load[:3]] if isinstance(load, list) else []
    if loads and None not in loads:
        parts.append("load " + " ".join(number(round(v or 0.0, 2)) for v in loads))
    mem = [_finite(data, k) for k in ("mem_used", "mem_total", "mem_available")]
    if mem[0] is not None and mem[1] is not None:
        avail = f" ({size(mem[2])} available)" if mem[2] is not None else ""
        parts.append(f"mem {size(mem[0])}/{size(mem[1])}{avail}")
    disk = [_finite(data, k) for k in ("disk_used", "disk_total", "disk_read_rate", "disk_write_rate")]
    if disk[0] is not None and disk[1] is not None:
        parts.append(f"disk {size(disk[0])}/{size(disk[1])}")
    if disk[2] is not None and disk[3] is not None:
        parts.append(f"disk read {size(disk[2])}/s write {size(disk[3])}/s")
    net = data.get("net")
    if isinstance(net, Mapping) and net:
        shown = []
        for name, rates in list(net.items())[:KPI_INTERFACES_SHOWN]:
            rates = rates if isinstance(rates, Mapping) else {}
            rx, tx = _finite(rates, "bytes_recv"), _finite(rates, "bytes_sent")
            io = f" in {size(rx)}/s out {size(tx)}/s" if rx is not None and tx is not None else ""
            shown.append(str(name)[:32] + io)
        more = f" (+{len(net) - KPI_INTERFACES_SHOWN} more)" if len(net) > KPI_INTERFACES_SHOWN else ""
        parts.append("net " + ", ".join(shown) + more)
    errors = data.get("errors")
    if isinstance(errors, Mapping) and errors:
        parts.append("unavailable: " + field_text("errors", dict(list(errors.items())[:8]))[:300])
    took = _finite(data, "duration")
    if took is not None:
        parts.append(f"sampled in {duration(took)}")
    return "; ".join(parts) or "(no values)"


def few_names(names: Sequence[str], shown: int = 8) -> str:
    """``names`` for a line people read: all of them when there are at most ``shown``, else the
    first ``shown`` and how many more (``"vm1, vm2 and 9,998 more"``); ``""`` for none. A line
    naming every one of 10 000 VMs is unreadable and, logged per event, quadratic."""
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown:,} more"  # slices: no copy of all


def unknown_text(unknown: Sequence[str], known: Sequence[str]) -> str:
    """VM names someone gave that are not known, with a few of those that are, for an error:
    ``unknown VM vm9 (this host's VMs: vm1, vm2, ... and 998 more)``."""
    return (f"unknown VM{'s' if len(unknown) > 1 else ''} {few_names(list(unknown))} "
            f"(this host's VMs: {few_names(list(known)) or 'none'})")  # fmt: skip
