"""Scan a pickle's opcodes before unpickling it: refuse what would allocate beyond the file.

The C unpickler trusts counts it reads from the stream (issue 16 item 6): ``BINBYTES8`` or
``BYTEARRAY8`` allocate the length they declare before reading a byte of it (9 bytes of pickle,
1 GiB of memory), a ``FRAME`` or ``BINUNICODE8`` length makes the input stream allocate it, a
``LONG_BINPUT``/``PUT`` index sizes the memo table (``r\\x00\\x00\\x00\\x04``: 1 GiB), and hashing
a tuple nested a million deep (1 byte a level: ``TUPLE1``) overflows the C stack. The scan walks
the opcodes once (a table lookup and a jump for the common ones) and refuses, naming the opcode
and its byte offset:

* a declared length longer than the bytes that follow it;
* a memo index larger than the offset of its opcode (a pickler numbers its memo from 0, one
  index per put, so a real index is always smaller);
* a protocol above :data:`pickle.HIGHEST_PROTOCOL`;
* more containers (lists, dicts, tuples, objects: 50-100 bytes from one opcode byte) than one
  per :data:`PICKLE_BYTES_PER_CONTAINER` bytes of the file (counted only when a quick count of
  their opcode bytes anywhere in the file says it could be over);
* tuples nested deeper than :data:`~vmr_handler.core.schedule.limits.MAX_NESTING` (worked out
  exactly, by a slower pass, only when the pickle has more tuple-building opcodes than
  :data:`TUPLE_OPS_UNCHECKED`: fewer cannot nest deeply).

What it does not refuse (an unknown opcode, a truncated stream) the unpickler reports. After
the scan every object the unpickler builds is paid for by bytes of the file: memory is a
bounded multiple of its size.
"""

from __future__ import annotations

import pickle
import pickletools
import struct
from typing import Dict, List

from vmr_handler.core.errors import ScheduleFormatError
from vmr_handler.core.schedule.limits import MAX_NESTING

#: With at most this many tuple-building opcodes tuples cannot nest deep enough to overflow the
#: C stack when hashed (100 000 levels hash fine on an 8 MiB stack); above it the nesting is
#: worked out exactly (about 1 s per 1.5 million opcodes).
TUPLE_OPS_UNCHECKED = 10_000
#: A pickle may build one list, dict, tuple, set or object per this many bytes of it (plus
#: 65 536): one opcode byte builds a container of 50-100 bytes, so unpickling stays within about
#: 40 times the file's size (10 MB of ``EMPTY_LIST`` were 814 MB). A reference pickle builds one
#: per 11-18 bytes.
PICKLE_BYTES_PER_CONTAINER = 2

# Opcode kinds: >= 0 is the length of a fixed-size argument (skipped); below 0, what to check.
_UNKNOWN, _LINE, _LINES2, _COUNT1, _COUNT4S, _COUNT4, _COUNT8 = -1, -2, -3, -4, -5, -6, -7
_PROTO, _FRAME, _PUT, _LONG_BINPUT, _TUPLE, _STOP, _CONTAINER = -8, -9, -10, -11, -12, -13, -14

_COUNTED = {
    pickletools.UP_TO_NEWLINE: _LINE,
    pickletools.TAKEN_FROM_ARGUMENT1: _COUNT1,
    pickletools.TAKEN_FROM_ARGUMENT4: _COUNT4S,
    pickletools.TAKEN_FROM_ARGUMENT4U: _COUNT4,
    pickletools.TAKEN_FROM_ARGUMENT8U: _COUNT8,
}
_SPECIAL = {
    "PROTO": _PROTO,
    "FRAME": _FRAME,
    "PUT": _PUT,
    "LONG_BINPUT": _LONG_BINPUT,
    "STOP": _STOP,
    "TUPLE": _TUPLE,
    "TUPLE1": _TUPLE,
    "TUPLE2": _TUPLE,
    "TUPLE3": _TUPLE,
}
_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}


def _kinds() -> List[int]:
    """The kind of every opcode byte (see above)."""
    kinds = [_UNKNOWN] * 256
    for op in pickletools.opcodes:
        n = op.arg.n if op.arg is not None else 0
        kind = _COUNTED[n] if n < 0 else n
        if op.arg is not None and op.arg.name == "stringnl_noescape_pair":
            kind = _LINES2
        kinds[op.code.encode("latin-1")[0]] = _SPECIAL.get(op.name, kind)
    return kinds


_KINDS = _kinds()


#: Bytes to skip for an opcode byte with a fixed-size argument that needs no check, else its
#: kind (below 0).
_STEPS = [kind + 1 if kind >= 0 else kind for kind in _KINDS]
#: Opcodes that build a container or object of 50-100 bytes from one byte (tuples aside: they
#: are counted anyway).
_CONTAINERS = bytes(
    op.code.encode("latin-1")[0]
    for op in pickletools.opcodes
    if op.name
    in {"EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE", "EMPTY_SET", "LIST", "DICT", "FROZENSET", "NEWOBJ"}
    | {"NEWOBJ_EX", "REDUCE", "OBJ", "INST"}
)
_PER_BYTES = (
    f"more than one per {PICKLE_BYTES_PER_CONTAINER} bytes of the pickle (lists, dicts, tuples, objects)"
)
#: :data:`_STEPS` that also counts the :data:`_CONTAINERS`.
_COUNTING_STEPS = [_CONTAINER if code in _CONTAINERS else step for code, step in enumerate(_STEPS)]
_U4, _S4, _U8 = struct.Struct("<I"), struct.Struct("<i"), struct.Struct("<Q")


def _refused(data: bytes, pos: int, what: str) -> ScheduleFormatError:
    return ScheduleFormatError(f"pickle refused before unpickling: {_NAMES[data[pos]]} at byte {pos} {what}")


def scan_pickle(data: bytes) -> None:
    """Refuse a pickle whose opcodes would make the unpickler allocate more than the file
    pays for (see the module doc). Takes about a third of the time of unpickling it.

    Raises:
        ScheduleFormatError: naming the opcode, its byte offset and the count it declares; or
            how many containers it builds, when over :data:`PICKLE_BYTES_PER_CONTAINER`.
    """
    allowed = len(data) // PICKLE_BYTES_PER_CONTAINER + 65536
    # the container opcode bytes wherever they stand (in strings too), counted in C: when even
    # this over-estimate is within the limit, the walk need not count them (it is faster so)
    estimate = len(data) - len(data.translate(None, _CONTAINERS))
    tuples = _walk(data, _COUNTING_STEPS if estimate > allowed else _STEPS, allowed)
    if tuples > TUPLE_OPS_UNCHECKED:
        check_tuple_nesting(data)


def _walk(data: bytes, steps: List[int], allowed: int) -> int:
    """Walk the opcodes of ``data`` with the table ``steps`` (:data:`_STEPS`, or
    :data:`_COUNTING_STEPS` to refuse more than ``allowed`` containers), checking what
    :func:`scan_pickle` says; the number of tuple-building opcodes met.

    Raises:
        ScheduleFormatError: as :func:`scan_pickle`.
    """
    end, i, tuples, containers = len(data), 0, 0, 0
    u4, s4 = _U4.unpack_from, _S4.unpack_from
    try:  # the loop ends with an IndexError (or struct.error) at the end of the bytes, or at STOP
        while True:
            kind = steps[data[i]]
            if kind > 0:
                i += kind
                continue
            if kind == _LONG_BINPUT:  # the commonest checked opcode (protocols 1-3)
                if (data[i + 4] or data[i + 3] > 15) and u4(data, i + 1)[0] > i:  # (below 2**20: fine)
                    raise _refused(
                        data, i, f"puts memo index {u4(data, i + 1)[0]:,}, more than the puts before it"
                    )
                i += 5
                continue
            pos, i = i, i + 1
            if kind == _COUNT1:
                i += 1 + data[i]
            elif kind in (_COUNT4, _COUNT4S):
                count = (u4 if kind == _COUNT4 else s4)(data, i)[0]
                i += 4
                if count > end - i:
                    raise _refused(data, pos, f"declares {count:,} bytes, only {end - i:,} follow")
                i += max(count, 0)
            elif kind == _CONTAINER:
                containers += 1
                if containers + tuples > allowed:
                    raise _refused(data, pos, f"builds more than {allowed:,} containers, {_PER_BYTES}")
            elif kind == _LINE:
                i = data.find(b"\n", i) + 1 or end
            elif kind == _TUPLE:
                tuples += 1
                if tuples > allowed:
                    raise _refused(data, pos, f"builds more than {allowed:,} tuples, {_PER_BYTES}")
            elif kind == _STOP:
                break
            else:
                i = _rare(data, i, kind)
    except (IndexError, struct.error):
        pass  # truncated: the unpickler says so
    return tuples


def _rare(data: bytes, i: int, kind: int) -> int:
    """Check the argument at ``i`` of a rarer opcode of ``kind`` (at ``i - 1``); the offset
    after it (``len(data)`` to stop: the unpickler reports an unknown opcode).

    Raises:
        ScheduleFormatError: as :func:`scan_pickle`.
    """
    pos, end = i - 1, len(data)
    if kind in (_COUNT8, _FRAME):
        count = int(_U8.unpack_from(data, i)[0]) if i + 8 <= end else 0
        i += 8
        if count > end - i:
            raise _refused(data, pos, f"declares {count:,} bytes, only {max(end - i, 0):,} follow")
        return i if kind == _FRAME else i + count  # a frame's bytes are opcodes
    if kind == _PUT:
        i, index = _memo_index(data, i, kind)
        if index > pos:
            raise _refused(data, pos, f"puts memo index {index:,}, more than the puts before it")
        return i
    if kind == _LINES2:
        i = data.find(b"\n", i) + 1 or end
        return data.find(b"\n", i) + 1 or end
    if kind == _PROTO:
        if i < end and data[i] > pickle.HIGHEST_PROTOCOL:
            raise _refused(data, pos, f"asks for protocol {data[i]}, above {pickle.HIGHEST_PROTOCOL}")
        return i + 1
    return end  # unknown


def _memo_index(data: bytes, i: int, kind: int) -> tuple[int, int]:
    """``(offset after the argument, memo index)`` of a ``LONG_BINPUT`` or ``PUT`` at ``i``
    (index -1 when the argument is unreadable: the unpickler reports it)."""
    if kind == _LONG_BINPUT:
        return i + 4, int(_U4.unpack_from(data, i)[0]) if i + 4 <= len(data) else -1
    stop = data.find(b"\n", i)
    if stop < 0:
        return len(data), -1
    try:
        return stop + 1, int(data[i:stop])
    except ValueError:
        return stop + 1, -1


_TUPLES = frozenset({"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"})
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"})


def check_tuple_nesting(data: bytes) -> None:
    """Follow the unpickler's stack (the nesting depth of the tuples on it, through the memo)
    and refuse a tuple nested deeper than :data:`MAX_NESTING`. Stops quietly where
    :func:`pickletools.genops` cannot read on (the unpickler reports that place).

    Raises:
        ScheduleFormatError: naming the opcode and its byte offset.
    """
    stack: List[int] = []
    marks: List[int] = []
    memo: Dict[int, int] = {}
    try:
        for op, arg, pos in pickletools.genops(data):
            name = op.name
            if name == "MARK":
                marks.append(len(stack))
                continue
            if name in _PUTS:  # the stack stays as it is
                memo[len(memo) if arg is None else int(arg)] = stack[-1] if stack else 0
                continue
            before = op.stack_before
            below = len(before)
            popped: List[int] = []
            if pickletools.markobject in before:
                base = marks.pop() if marks else 0
                popped, below = stack[base:], before.index(pickletools.markobject)
                del stack[base:]
            if below:
                popped += stack[-below:]
                del stack[-below:]
            depth = memo.get(int(arg or 0), 0) if name in _GETS else 0
            if name in _TUPLES:
                depth = 1 + max(popped, default=0)
                if depth > MAX_NESTING:
                    raise _refused(data, int(pos or 0), f"nests tuples more than {MAX_NESTING} deep")
            stack.extend(popped * 2 if name == "DUP" else [depth] * len(op.stack_after))
    except ValueError:
        return
