"""Every control command of ``vmr-host serve``, declared once, and what is derived from it.

A :class:`ControlCommand` names the request (``{"cmd": name, field: value, ...}`` on the
control socket, ``docs/host.md``), its typed :class:`Field` s (kind, default, help and how the
CLI spells it), the fields of its answer, the :class:`~vmr_handler.core.errors.VmrError`
classes it refuses a request with, and the console's REST route when it has one. From
:data:`COMMANDS`:

* :func:`validate` checks a request as the control socket and the console take it: an
  unknown field or a field of the wrong kind is refused naming it, absent fields get their
  defaults (``serve/control_api.py`` dispatches every declared command through it);
* :func:`add_arguments` adds a command's request fields to its CLI parser and
  :func:`request_of` makes the request from the parsed values (``cli/control_client.py``);
* :func:`request_schema` and :func:`answer_schema` are the JSON schemas of the console's
  OpenAPI document (``console/openapi.py``), whose routes are :func:`rest_commands`.

Adding a command: one :class:`ControlCommand` here and one method of the same name on
``serve/control_api.py``'s ``ControlApi``; the CLI and the console take it from here.

Refusals: every request can be refused with :class:`~vmr_handler.core.errors.RequestRefused`
(malformed, unknown command or field); the control socket answers the classes of
:data:`REFUSALS` as ``{"status": "error", "details": message}``, anything else is a bug.
"""

from __future__ import annotations

from vmr_handler.core.errors import (
    BarrierError,
    BatchError,
    EntryNotRunning,
    RequestRefused,
    ResourcesMissing,
    VmNotConnected,
    VmrError,
)

TYPE_CHECKING = False  # no ``typing`` on the lean paths (core.commandtable.TYPE_CHECKING)
if TYPE_CHECKING:
    import argparse
    from typing import Any, Dict, List, Mapping, Optional, Tuple, Type

#: The signals ``kill`` may send first (``vmr_handler.core.wire.protocol.KILL_SIGNALS``, kept
#: here too: the lean CLI imports nothing of the protocol), and its longest grace, seconds.
KILL_SIGNALS = ("TERM", "KILL", "INT", "HUP")
MAX_GRACE = 3600.0

#: The kinds a field can have, with the JSON schema of each.
KINDS: Dict[str, Dict[str, Any]] = {
    "names": {"type": "array", "items": {"type": "string"}},  # VM names
    "bool": {"type": "boolean"},
    "text": {"type": "string"},
    "int": {"type": "integer"},
    "number": {"type": "number"},  # seconds
}


class Field:
    """One field of a request (plain classes here: the lean ``vmr-host resume`` imports them).

    Attributes:
        name: its key in the request (and the CLI's ``dest``).
        kind: one of :data:`KINDS`.
        default: its value when the request has none (or null).
        help: what it means (the CLI's help and the schema's description).
        flags: how the CLI spells it: option strings, ``()`` a positional, None not on the
            command line (the client computes it).
        cli_default: what the CLI sends when the option is not given (None: :attr:`default`).
        nargs: a ``names`` field's number of words on the command line.
        choices: the values a ``text`` field may take (None: any).
        bounds: the ``(least, most)`` an ``int`` or ``number`` field may be (None: any).
    """

    __slots__ = ("bounds", "choices", "cli_default", "default", "flags", "help", "kind", "name", "nargs")

    def __init__(
        self,
        name: str,
        kind: str,
        default: Any,
        help: str = "",
        flags: Optional[Tuple[str, ...]] = None,
        cli_default: Any = None,
        nargs: str = "*",
        choices: Optional[Tuple[str, ...]] = None,
        bounds: Optional[Tuple[float, float]] = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.default = default
        self.help = help
        self.flags = flags
        self.cli_default = cli_default
        self.nargs = nargs
        self.choices = choices
        self.bounds = bounds


class ControlCommand:
    """One control command.

    Attributes:
        name: the request's ``cmd`` (and the ``ControlApi`` method that answers it).
        summary: what it does.
        fields: the request's fields (besides ``cmd``).
        answer: the answer's fields, name -> JSON schema.
        refusals: the error classes a request is refused with (besides ``RequestRefused``).
        rest: the console's ``POST`` route, None when the console does not serve it.
    """

    __slots__ = ("answer", "fields", "name", "refusals", "rest", "summary")

    def __init__(
        self,
        name: str,
        summary: str,
        fields: Tuple[Field, ...] = (),
        answer: Optional[Mapping[str, Dict[str, Any]]] = None,
        refusals: Tuple[Type[VmrError], ...] = (),
        rest: Optional[str] = None,
    ) -> None:
        self.name = name
        self.summary = summary
        self.fields = fields
        self.answer: Mapping[str, Dict[str, Any]] = answer or {}
        self.refusals = refusals
        self.rest = rest


_NAMES = KINDS["names"]
_STR = KINDS["text"]
_NUM = {"type": "number"}
_NUM_NULL = {"type": "number", "nullable": True}
_OBJ = {"type": "object"}
_INT = {"type": "integer"}

_VMS = Field("vms", "names", [], flags=())
_ALL = Field("all", "bool", False, "every VM", flags=("--all",))

#: Every control command, by name.
COMMANDS: Dict[str, ControlCommand] = {
    c.name: c
    for c in (
        ControlCommand(
            "status",
            "the experiment and every VM",
            answer={"now": _NUM, "mode": _STR, "role": _STR, "experiment": _OBJ, "resumes": {"type": "array"},
                    "vms": {"type": "array", "items": _OBJ}},
        ),
        ControlCommand(
            "resume",
            "send a RESUME: it ends the break a VM is at (same rules as vmr-host resume)",
            (
                _VMS,
                _ALL,
                Field("force", "bool", False,
                      "send it also to VMs not at a break (their agent ignores it, unless a break "
                      "began before its report reached the host); without: --all resumes the VMs at "
                      "a break, a VM named must be at one",
                      flags=("--force", "--yes")),
                Field("dry_run", "bool", False, "say whom it would reach; send nothing",
                      flags=("--dry-run",)),
            ),
            answer={"id": _STR, "at": _NUM, "targets": _NAMES, "sent_now": _NAMES, "pending": _NAMES,
                    "at_break": _OBJ, "not_at_break": _NAMES},
            rest="/api/v1/resume",
        ),
        ControlCommand(
            "release",
            "start without missing VMs (same as vmr-host release)",
            (
                Field("exclude", "names", [],
                      "drop these VMs from the barrier (without: start without everyone still missing)",
                      flags=("--exclude",), nargs="+"),
            ),
            answer={"start_time": _NUM_NULL, "waiting_for": _NAMES, "excluded": _NAMES, "released": _NAMES},
            refusals=(BarrierError,),
            rest="/api/v1/release",
        ),
        ControlCommand(
            "schedule_add",
            "append the entries of a schedule file on this host to the VMs' running schedules",
            (
                Field("vms", "names", [], "the VMs (or all)"),
                Field("all", "bool", False, "every VM"),
                Field("path", "text", "", "the schedule file, on this host"),
                Field("sha256", "text", "", "its sha256 as the client read it"),
            ),
            answer={"id": _STR, "entries": _INT, "targets": _NAMES, "sent_now": _NAMES, "pending": _NAMES},
            refusals=(BatchError, ResourcesMissing),
        ),
        ControlCommand(
            "kill",
            "end a running entry's process tree in VMs (SIGTERM, then SIGKILL after the grace)",
            (
                _VMS,
                Field("all", "bool", False, "every VM where the entry runs", flags=("--all",)),
                Field("entry", "int", None, "the entry's index (vmr-host schedule show VM lists them)",
                      flags=("--entry",), bounds=(0, 2**31)),
                Field("signal", "text", "TERM", "the signal sent first (default TERM)",
                      flags=("--signal",), choices=KILL_SIGNALS),
                Field("grace", "number", 10.0, "seconds before SIGKILL ends what is left (default 10)",
                      flags=("--grace",), bounds=(0.0, MAX_GRACE)),
                Field("by", "text", "", "who asks (the CLI sends user@host)"),
            ),
            answer={"id": _STR, "entry": _INT, "signal": _STR, "grace": _NUM, "targets": _NAMES,
                    "sent_now": _NAMES, "not_running": _OBJ, "stage": _OBJ},
            refusals=(EntryNotRunning, VmNotConnected),
            rest="/api/v1/kill",
        ),
    )
}  # fmt: skip

#: What the control socket answers as a refused request (every command's refusals).
REFUSALS: Tuple[Type[VmrError], ...] = tuple(
    dict.fromkeys([RequestRefused, *(r for c in COMMANDS.values() for r in c.refusals)])
)


def _checked(command: ControlCommand, field: Field, value: Any) -> Any:
    """``value`` of ``field``, checked to be of its kind.

    Raises:
        RequestRefused: it is not (the message names the field).
    """
    if field.kind == "names":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RequestRefused(f"'{field.name}' must be a list of VM names")
    elif field.kind == "bool" and not isinstance(value, bool):
        raise RequestRefused(f"{command.name}: '{field.name}' must be true or false, not {value!r}")
    elif field.kind == "text" and not isinstance(value, str):
        raise RequestRefused(f"{command.name}: '{field.name}' must be a string, not {value!r}")
    elif field.kind in ("int", "number") and (
        isinstance(value, bool) or not isinstance(value, int if field.kind == "int" else (int, float))
    ):
        what = "an integer" if field.kind == "int" else "a number (seconds)"
        raise RequestRefused(f"{command.name}: '{field.name}' must be {what}, not {value!r}")
    if field.choices is not None and value not in field.choices:
        raise RequestRefused(
            f"{command.name}: '{field.name}' must be one of {', '.join(field.choices)}, not {value!r}"
        )
    if field.bounds is not None and not field.bounds[0] <= value <= field.bounds[1]:
        least, most = (int(b) if field.kind == "int" else f"{b:g}" for b in field.bounds)
        raise RequestRefused(f"{command.name}: '{field.name}' must be {least}-{most}, not {value!r}")
    return value


def validate(command: ControlCommand, request: Mapping[str, Any]) -> Dict[str, Any]:
    """``request`` (its ``cmd`` aside) as ``command`` takes it: every field of its kind, absent
    or null fields at their defaults.

    Raises:
        RequestRefused: a field ``command`` does not declare, or one of the wrong kind (named).
    """
    known = {f.name: f for f in command.fields}
    unknown = sorted(set(request) - set(known) - {"cmd"})
    if unknown:
        raise RequestRefused(
            f"{command.name}: unknown field(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(known) or 'none'}"
        )
    checked: Dict[str, Any] = {"cmd": command.name}
    for name, field in known.items():
        value = request.get(name)
        checked[name] = list(field.default) if value is None and field.kind == "names" else (
            field.default if value is None else _checked(command, field, value)
        )  # fmt: skip
    return checked


def add_arguments(parser: argparse.ArgumentParser, command: ControlCommand) -> None:
    """The CLI arguments of ``command``'s fields that the command line spells, in their order."""
    for field in command.fields:
        if field.flags is None:
            continue
        default = field.default if field.cli_default is None else field.cli_default
        extra: Dict[str, Any] = {"help": field.help} if field.help else {}
        if field.kind == "bool":
            parser.add_argument(*field.flags, dest=field.name, action="store_true", **extra)
        elif field.kind != "names":
            kind = {"int": int, "number": float, "text": str}[field.kind]
            metavar = {"int": "N", "number": "S"}.get(field.kind)  # text: its choices
            parser.add_argument(*field.flags, dest=field.name, type=kind, default=default, metavar=metavar,
                                choices=field.choices, required=default is None, **extra)  # fmt: skip
        elif field.flags:
            parser.add_argument(*field.flags, dest=field.name, nargs=field.nargs, default=default,
                                metavar="VM", **extra)  # fmt: skip
        else:
            parser.add_argument(field.name, nargs=field.nargs, metavar="VM", **extra)


def request_of(command: ControlCommand, values: Mapping[str, Any]) -> Dict[str, Any]:
    """The request of ``command`` with the fields the CLI spells taken from ``values`` (the
    parsed arguments, by field name)."""
    request: Dict[str, Any] = {"cmd": command.name}
    for field in command.fields:
        if field.flags is not None:
            value = values[field.name]
            request[field.name] = list(value) if field.kind == "names" else value
    return request


def rest_commands() -> List[ControlCommand]:
    """The commands the console serves (``POST`` :attr:`ControlCommand.rest`), in order."""
    return [c for c in COMMANDS.values() if c.rest is not None]


def schema_name(command: ControlCommand) -> str:
    """``resume`` -> ``Resume``, ``schedule_add`` -> ``ScheduleAdd`` (the OpenAPI schemas'
    ``ResumeRequest``/``ResumeAnswer``)."""
    return "".join(part.capitalize() for part in command.name.split("_"))


def request_schema(command: ControlCommand) -> Dict[str, Any]:
    """The JSON schema of ``command``'s request body (the console's; no ``cmd``)."""
    props = {f.name: {**KINDS[f.kind], "default": f.default, **({"description": f.help} if f.help else {})}
             for f in command.fields}  # fmt: skip
    return {"type": "object", "properties": props, "additionalProperties": False}


def answer_schema(command: ControlCommand) -> Dict[str, Any]:
    """The JSON schema of ``command``'s answer."""
    return {"type": "object", "properties": dict(command.answer)}
