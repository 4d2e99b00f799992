"""Scan a pickle's opcodes before unpickling it: refuse what would allocate beyond the file.

The C unpickler trusts counts it reads from the stream: ``BINBYTES8`` or
``BYTEARRAY8`` allocate the length they declare before reading a byte of it (9 bytes of pickle,
1 GiB of memory), a ``FRAME`` or ``BINUNICODE8`` length makes the input stream allocate it, a
``LONG_BINPUT``/``PUT`` index sizes the memo table (``r\\x00\\x00\\x00\\x04``: 1 GiB), and hashing
a tuple nested a million deep (1 byte a level: ``TUPLE1``) overflows the C stack. The scan walks
the opcodes once and refuses, naming the opcode and its byte offset:

* a declared length longer than the bytes that follow it;
* a memo index of 2**20 or more that is larger than the offset of its opcode (a pickler numbers
  its memo from 0, one index per put, so a real index is always smaller; a smaller index costs
  at most 16 MiB of memo table);
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

Speed: the opcodes that need no check (nearly all of a schedule's: memo gets and
small puts, empty containers, floats, ints, short strings, ...) are stepped over by one regular
expression (:func:`_run_pattern`, matched in C, ~20 ns an opcode), which stops at the first
opcode it does not know to be harmless; the Python loop checks that one and hands back. The
pattern accepts exactly what the loop would pass without a check (it is built from the same
opcode table), so the refusals and their messages are the loop's. 100 000 reference entries:
~30 ms, was ~110 ms (the loop alone), against ~55 ms for unpickling them. Where the pattern
stops at once (hostile input: a run of opcodes the loop must check), the loop walks on for 256
bytes (:data:`PLAIN_BYTES`) before trying it again, so no input costs much more than the loop
alone (~1.4x at worst, measured). Before Python 3.11 the walk is the loop alone
(:data:`_POSSESSIVE`).
"""

from __future__ import annotations

import functools
import pickle
import pickletools
import re
import struct
import sys
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
#: A memo index below this is never refused (its memo table is at most 16 MiB).
SMALL_MEMO_INDEX = 1 << 20

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
_CODES = {op.name: op.code.encode("latin-1") for op in pickletools.opcodes}
_INST = _CODES["INST"][0]


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

#: Longest counted string (``BINUNICODE``, ``SHORT_BINUNICODE``, ...) :func:`_run_pattern`
#: steps over itself: one branch of the pattern per length (a longer string, rare in a
#: schedule, takes the loop's step; more branches cost compile time in every process).
RUN_MAX_COUNT = 64
#: The commonest opcodes of reference pickles (``MARK``: those without argument, ``BINUNICODE``:
#: those with a 4-byte count, ...): the pattern tries them first, as sre tries the branches of an
#: alternation in turn.
_HOT = ("BINGET", "LONG_BINPUT", "MARK", "SHORT_BINUNICODE", "BINUNICODE", "BINFLOAT")
#: Possessive repeats (``*+``: no state kept per repetition) came with Python 3.11; before it the
#: walk is the loop alone (a plain ``*`` keeps ~100 bytes per opcode and is slower than the loop).
_POSSESSIVE = sys.version_info >= (3, 11)


#: Where the pattern stepped over less than 32 bytes, the loop walks on this many bytes alone
#: before trying it again.
PLAIN_BYTES = 256
#: Kinds the loop checks itself when one follows another (the pattern would stop at once, or
#: cost a call per opcode on a run of them).
_CHECKED = frozenset({_LONG_BINPUT, _PUT, _TUPLE, _CONTAINER, _COUNT1, _COUNT4, _COUNT4S, _COUNT8, _FRAME})


@functools.cache
def _run_pattern(counting: bool) -> re.Pattern[bytes]:
    """A pattern matching the longest run of opcodes, from where it is matched, that
    :func:`_walk` (with :data:`_COUNTING_STEPS` if ``counting``, else :data:`_STEPS`) would
    step over without refusing anything: fixed-size arguments, lines, counted strings of up
    to :data:`RUN_MAX_COUNT` bytes that follow, ``LONG_BINPUT`` below 2**20, ``PUT`` of up to
    6 digits, ``PROTO`` up to :data:`pickle.HIGHEST_PROTOCOL`; never a tuple, ``STOP``,
    ``FRAME``, an 8-byte count, an unknown opcode, nor (``counting``) a container. Built from
    the walk's own table; compiled on first use (~2 ms). Before Python 3.11 the empty pattern
    (:data:`_POSSESSIVE`)."""
    if not _POSSESSIVE:
        return re.compile(b"")
    steps = _COUNTING_STEPS if counting else _STEPS
    lengths = range(RUN_MAX_COUNT + 1)

    def any_bytes(n: int) -> bytes:  # (``.`` is faster than ``.{1}``)
        return b"." * n if n <= 8 else b".{%d}" % n

    def counted(width: int) -> bytes:  # the count's bytes, then as many bytes
        zeros = b"\\x00" * (width - 1)
        return b"(?:" + b"|".join(re.escape(bytes([n])) + zeros + any_bytes(n) for n in lengths) + b")"

    args = {_COUNT1: counted(1), _COUNT4: counted(4), _COUNT4S: counted(4), _LINE: b"[^\\n]*\\n"}
    args[_LINES2] = b"[^\\n]*\\n[^\\n]*\\n"
    args[_LONG_BINPUT] = b"..[\\x00-\\x0f]\\x00"  # (an index below 2**20)
    args[_PUT] = b"[0-9]{1,6}\\n"
    args[_PROTO] = b"[\\x00-" + re.escape(bytes([pickle.HIGHEST_PROTOCOL])) + b"]"
    args.update({step: any_bytes(step - 1) for step in set(steps) if step > 0})
    by_arg: Dict[bytes, List[bytes]] = {}  # one branch per argument (each ``counted`` once: compile time)
    for code, step in enumerate(steps):
        if step in args:
            by_arg.setdefault(args[step], []).append(re.escape(bytes([code])))

    def one_of(codes: List[bytes], arg: bytes) -> bytes:  # (no argument: any run of them)
        return b"[" + b"".join(codes) + b"]" + (arg or b"++")

    alternatives = []
    for name in _HOT:
        literal, arg = re.escape(_CODES[name]), args.get(steps[_CODES[name][0]])
        if arg and len(arg) < 32:  # alone: sre tries a literal faster than a set
            alternatives.append(literal + arg)
            by_arg[arg].remove(literal)
        elif arg is not None and arg in by_arg:
            alternatives.append(one_of(by_arg.pop(arg), arg))
    alternatives += [one_of(codes, arg) for arg, codes in by_arg.items() if codes]
    return re.compile(b"(?:" + b"|".join(alternatives) + b")*+", re.DOTALL)


def _refused(data: bytes, pos: int, what: str) -> ScheduleFormatError:
    return ScheduleFormatError(f"pickle refused before unpickling: {_NAMES[data[pos]]} at byte {pos} {what}")


def scan_pickle(data: bytes) -> None:
    """Refuse a pickle whose opcodes would make the unpickler allocate more than the file
    pays for (see the module doc). A reference schedule's scan takes about half the time of
    unpickling it (the loop alone, before Python 3.11: about twice that time).

    Raises:
        ScheduleFormatError: naming the opcode, its byte offset and the count it declares; or
            how many containers it builds, when over :data:`PICKLE_BYTES_PER_CONTAINER`.
    """
    allowed = len(data) // PICKLE_BYTES_PER_CONTAINER + 65536
    # the container opcode bytes wherever they stand (in strings too), counted in C: when even
    # this over-estimate is within the limit, the walk need not count them (it is faster so)
    estimate = len(data) - len(data.translate(None, _CONTAINERS))
    tuples = _walk(data, estimate > allowed, allowed)
    if tuples > TUPLE_OPS_UNCHECKED:
        check_tuple_nesting(data)


def _walk(data: bytes, counting: bool, allowed: int) -> int:
    """Walk the opcodes of ``data`` (counting the containers, to refuse more than ``allowed``,
    if ``counting``), checking what :func:`scan_pickle` says; the number of tuple-building
    opcodes met. Runs of opcodes that need no check are stepped over by :func:`_run_pattern`.

    Raises:
        ScheduleFormatError: as :func:`scan_pickle`.
    """
    pattern = _run_pattern(counting)
    end, i, tuples, containers = len(data), 0, 0, 0
    plain = 0 if pattern.pattern else end  # (the loop alone up to ``plain``)
    steps = _COUNTING_STEPS if counting else _STEPS
    u4, s4, skip, plain_bytes = _U4.unpack_from, _S4.unpack_from, pattern.match, PLAIN_BYTES
    try:  # the loop ends with an IndexError (or struct.error) at the end of the bytes, or at STOP
        while True:
            kind = steps[data[i]]
            if kind > 0:  # (the pattern stops at none of these, but where the bytes end)
                i += kind
                continue
            if kind == _LONG_BINPUT:  # the commonest checked opcode (protocols 1-3; the pattern
                # passes those below 2**20: here in a pickle of over a million puts, or on 3.9)
                if (data[i + 4] or data[i + 3] > 15) and u4(data, i + 1)[0] > i:  # (2**20 and over)
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
                if data[pos] == _INST:  # its two lines are no opcodes
                    i = _rare(data, i, _LINES2)
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
            # checked: the pattern takes over, unless a checked opcode follows (a run of them stays
            # here), or it stopped at once last time (then not before ``plain``: else, on some
            # input, a call per opcode, 3x the loop's time)
            if i >= plain and steps[data[i]] not in _CHECKED:
                start, i = i, skip(data, i).end()  # type: ignore[union-attr]  # (matches, maybe nothing)
                if i - start < 32:
                    plain = i + plain_bytes
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
        if index > pos and index >= SMALL_MEMO_INDEX:
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
