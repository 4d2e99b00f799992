"""``vmr-handler`` command line: argparse front end only, no logic of its own.

Commands: ``run --local``, ``plan``, ``check``, ``status``, ``resume``, ``completion``, one
table (:data:`COMMANDS`) for help, completion, parsing and dispatch. ``status`` and ``resume``
run :mod:`vmr_handler.agent.cli.control_client`, and ``plan`` and ``check`` run, with no logging
set up: this module imports nothing heavy at the top (no ``typing`` either), each command
imports what it needs when it runs.
Exit codes: 0 success; 1 the VM failed (run) or the agent could not be reached
(status/resume); 2 bad usage or a schedule that cannot be used.
"""

from __future__ import annotations

import functools
import os
import sys

from vmr_handler.agent.cli.control_client import DEFAULT_STATE_DIR, number_text
from vmr_handler.core.commandtable import (
    ALL,
    Command,
    build_parser,
    command_word,
    completion_command,
    join_negative_values,
    resolve,
    top_parser,
)
from vmr_handler.core.errors import ControlError, JournalError, ScheduleError, UsageError, VmrError

TYPE_CHECKING = False  # no ``typing`` on the lean paths (core.commandtable.TYPE_CHECKING)
if TYPE_CHECKING:  # argparse is imported where used: `--version`, `status` and `resume` start quickly
    import argparse
    from typing import Any, Callable, Dict, List, Optional, Sequence

    from vmr_handler.core.schedule import Schedule
    from vmr_handler.core.timeline import Plan

EXIT_USAGE = 2
DEFAULT_LAUNCH_DIR = "/var/launch"
DEFAULT_CONFIG = "/etc/vmr-handler/config.yaml"
#: Per-VM settings passed by QEMU ``-fw_cfg name=opt/org.vmr/config,file=...`` (docs/mqtt.md).
DEFAULT_FW_CFG = "/sys/firmware/qemu_fw_cfg/by_name/opt/org.vmr/config/raw"


def _seconds(text: str) -> float:
    """A time in seconds (float; ``inf`` and ``-inf`` too, given as a separate word as well:
    :func:`~vmr_handler.core.commandtable.join_negative_values`).

    Raises:
        argparse.ArgumentTypeError: NaN (``float`` raises ValueError for words that are no number).
    """
    import argparse

    value = float(text)  # accepts inf / -inf
    if value != value:  # NaN
        raise argparse.ArgumentTypeError("NaN is not a time")
    return value


def _timeout(text: str) -> float:
    import argparse

    value = _seconds(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be seconds > 0, got {text!r}")
    return value


_CLI = "vmr_handler.agent.cli."
_CONTROL = _CLI + "control_client:"

#: Every ``vmr-handler`` command, in the order ``vmr-handler --help`` lists them
#: (:mod:`vmr_handler.core.commandtable`).
COMMANDS: Dict[str, Command] = {
    "run": Command("play a schedule on this machine",
                   _CLI + "commandline:add_run", _CLI + "commandline:cmd_run"),
    "plan": Command("print when every entry fires (pure timeline, nothing runs)",
                    _CLI + "commandline:add_plan", _CLI + "commandline:cmd_plan", lean=True),
    "check": Command("validate a schedule (exit 2 with the errors); warn about programs not found here "
                     "and shell syntax errors in command lines",
                     _CLI + "commandline:add_check", _CLI + "commandline:cmd_check", lean=True),
    "status": Command("show where the running agent is",
                      _CONTROL + "add_status", _CONTROL + "run", lean=True),
    "resume": Command("send RESUME to the running agent",
                      _CONTROL + "add_resume", _CONTROL + "run", lean=True),
    "completion": completion_command("vmr-handler", _CLI + "commandline:run_completion"),
}  # fmt: skip


def _parser(only: Optional[str] = ALL) -> argparse.ArgumentParser:
    """The ``vmr-handler`` argument parser: global flags, then one sub-command per
    :data:`COMMANDS` row (only ``only``'s arguments added; every command's by default)."""
    parser = top_parser(
        "vmr-handler",
        "Plays this VM's part of an experiment: stages, start barrier, timed entries, pause/break/RESUME.",
        about=_about,
    )
    return build_parser(parser, COMMANDS, only)


def _about() -> List[str]:
    """``--version``'s lines after the version: whether signature checks are built in."""
    from vmr_handler.agent.machine.features import about_lines

    return about_lines()


def _add_allow_class(p: argparse.ArgumentParser) -> None:
    """``--allow-class`` (repeatable), shared by the commands that load a schedule."""
    p.add_argument(
        "--allow-class",
        action="append",
        default=[],
        metavar="MODULE.NAME",
        help="also admit this schedule-entry class name in pickles (repeatable)",
    )


def add_run(run: argparse.ArgumentParser) -> None:
    """``run``: connection flags, the MQTT group, then local-run flags (this order is the help's)."""
    _add_run_connection_options(run)
    _add_mqtt_options(run.add_argument_group("MQTT transport (docs/mqtt.md)"))
    _add_run_local_options(run)
    _add_allow_class(run)


def _add_run_connection_options(run: argparse.ArgumentParser) -> None:
    """``run``: what to play and how the host is reached and trusted."""
    run.add_argument(
        "--local",
        metavar="SCHEDULE",
        help="run SCHEDULE with no host (pickle, YAML or JSON); without it the agent talks to vmr-host",
    )
    run.add_argument(
        "--config",
        metavar="FILE",
        help=f"config file (YAML mapping; every key is also a flag; default {DEFAULT_CONFIG} if present)",
    )
    run.add_argument(
        "--port",
        metavar="PATH",
        help="channel to the host: a character device (default /dev/virtio-ports/org.vmr.handler.0) "
        "or unix:PATH for a unix socket",
    )
    run.add_argument("--vm-name", metavar="NAME", help="this VM's name in logs (default: hostname)")
    run.add_argument(
        "--public-key",
        metavar="PEM|FILE",
        help="the host's Ed25519 public key: apply only signed schedules, start times and RESUMEs",
    )
    run.add_argument(
        "--http-ca-file",
        metavar="FILE",
        help="CA certificate of vmr-host's HTTPS resource server (default: the broker's CA, else system)",
    )


def _add_mqtt_options(mq: argparse._ArgumentGroup) -> None:
    """``run``: the MQTT transport group (docs/mqtt.md)."""
    mq.add_argument(
        "--transport",
        choices=["virtio-serial", "mqtt"],
        help="how the host is reached (default virtio-serial, i.e. --port)",
    )
    mq.add_argument("--broker", metavar="URL", help="mqtt://HOST:PORT or mqtts://HOST:PORT")
    mq.add_argument("--experiment", metavar="NAME", help="experiment name (topic vmr/NAME/VM/...)")
    mq.add_argument("--username", metavar="NAME", help="broker username (default: the VM name)")
    mq.add_argument("--password-file", metavar="FILE", help="file holding the broker password")
    mq.add_argument("--ca-file", metavar="FILE", help="CA certificate of the broker (mqtts)")
    mq.add_argument("--cert-file", metavar="FILE", help="client certificate (when the broker wants one)")
    mq.add_argument("--key-file", metavar="FILE", help="client key")
    mq.add_argument(
        "--fw-cfg",
        metavar="FILE",
        help=f"per-VM settings blob from QEMU fw_cfg (default {DEFAULT_FW_CFG} if present; '' = none)",
    )


def _add_run_local_options(run: argparse.ArgumentParser) -> None:
    """``run``: timing, directories, reporting and reboot flags."""
    import argparse

    run.add_argument("--debug-clock-skew", type=float, help=argparse.SUPPRESS)
    run.add_argument(
        "--start-buffer",
        type=_seconds,
        metavar="SECONDS",
        help="experiment start = configured + SECONDS (default 60)",
    )
    run.add_argument("--launch-dir", help=f"working dirs root (default {DEFAULT_LAUNCH_DIR})")
    run.add_argument("--state-dir", help=f"journal, outbox + control socket (default {DEFAULT_STATE_DIR})")
    run.add_argument(
        "--resources",
        metavar="DIR",
        help="VM-resource files for `filename` drops (default: the schedule's dir)",
    )
    run.add_argument("--report", metavar="FILE", help="append every event as a JSON line to FILE")
    run.add_argument(
        "--reboot-command",
        metavar="CMD",
        default=None,
        help="shell command run on a reboot request (default: systemctl reboot || reboot)",
    )
    run.add_argument("--quiet", action="store_true", help="no readable log on stderr")
    run.add_argument(
        "--default-timeout",
        type=_timeout,
        metavar="SECONDS",
        help="end a program entry without a timeout of its own after SECONDS (SIGTERM, then SIGKILL "
        "10 s later; default: none, or the host's serve --default-timeout)",
    )
    run.add_argument(
        "--kpi-interval",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="--local: report this VM's CPU, memory, disk and network every SECONDS (default 0 = off; "
        "under vmr-host, the host sets it)",
    )


def add_plan(plan: argparse.ArgumentParser) -> None:
    """``plan SCHEDULE [--resume SECONDS]... [--json] [--launch-dir DIR]``."""
    plan.add_argument("schedule")
    plan.add_argument(
        "--resume",
        type=_seconds,
        action="append",
        default=[],
        metavar="SECONDS",
        help="a RESUME at this experiment time (repeatable; -inf = before the start)",
    )
    plan.add_argument("--json", action="store_true", help="one JSON object on stdout")
    plan.add_argument(
        "--launch-dir",
        default=DEFAULT_LAUNCH_DIR,
        metavar="DIR",
        help=f"root of the working dirs shown in command lines (default {DEFAULT_LAUNCH_DIR})",
    )
    _add_allow_class(plan)


def add_check(check: argparse.ArgumentParser) -> None:
    """``check SCHEDULE [--strict]``."""
    check.add_argument("schedule")
    check.add_argument("--strict", action="store_true", help="warnings are errors (exit 2)")
    _add_allow_class(check)


# ---------------------------------------------------------------------------- plan
_num = number_text


def plan_json(plan: Plan, commands: Optional[Dict[int, str]] = None) -> Dict[str, Any]:
    """The ``plan --json`` object; ``command``: the exact command line of
    each entry that runs one, else null."""
    commands = commands or {}
    return {
        "entries": [
            {
                "index": p.index,
                "start_time": _num(p.start_time),
                "kind": p.kind.value,
                "stage": p.stage,
                "fire_at": _num(p.fire_at),
                "command": commands.get(p.index),
            }
            for p in plan.entries
        ],
        "resumes": [{"at": _num(r.at), "ended_break": r.ended_break} for r in plan.resumes],
    }


def _fmt(value: Any) -> str:
    return "-" if value is None else str(value)


def plan_table(schedule: Schedule, plan: Plan, commands: Optional[Dict[int, str]] = None) -> str:
    """A readable table of the plan, in firing order (negative stages first); ``commands``:
    the exact command line of each entry that runs one."""
    commands = commands or {}

    def order(p: Any) -> Any:
        if p.stage is not None:
            return (0, p.stage, p.index)
        if p.fire_at is None:
            return (2, 0.0, p.index)
        return (1, p.fire_at, p.index)

    rows = [("index", "start_time", "kind", "stage", "fire_at", "what")]
    for p in sorted(plan.entries, key=order):
        entry = schedule.entries[p.index]
        if entry.pause:
            what = "break" if p.kind.value == "break" else f"pause {_num(entry.pause_duration)} s"
        elif entry.is_resume:
            what = "RESUME (stored by firewheel vm resume): applied when the agent loads the schedule"
        else:
            what = commands.get(p.index) or "(data only)"
        fire = _fmt(_num(p.fire_at))
        if p.fire_at is None and p.kind.value in ("positive", "pause", "break", "host") and p.start_time >= 0:
            fire = "held (break)"
        rows.append((str(p.index), _fmt(_num(p.start_time)), p.kind.value, _fmt(p.stage), fire, what))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5] for r in rows]
    if plan.initial_delay:
        lines.append(f"-inf pauses delay stage 0 and every positive entry by {_num(plan.initial_delay)} s")
    for r in plan.resumes:
        lines.append(
            f"RESUME at {_num(r.at)}: "
            + (f"ends break {r.ended_break}" if r.ended_break is not None else "ignored (no active break)")
        )
    if plan.blocked_by is not None:
        lines.append(f"break {plan.blocked_by} holds everything after it until a RESUME")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- commands
def _load(path: str, allow: Sequence[str]) -> Schedule:
    from vmr_handler.core.schedule import load_schedule

    return load_schedule(path, allow)


def _commands(schedule: Schedule, launch_dir: str) -> Dict[int, str]:
    """The exact command line of every entry that runs one (working dirs under ``launch_dir``)."""
    from vmr_handler.core.schedule.commands import command_lines

    return command_lines(schedule.entries, launch_dir)


def cmd_plan(args: argparse.Namespace) -> int:
    """``plan``: stored RESUME entries count as RESUMEs before the start (the agent applies them
    when it loads the schedule), before the ``--resume`` ones. ``--json``: :mod:`._planout`."""
    if args.json:
        from vmr_handler.agent.cli._planout import PlanRequest, print_plan_json

        return print_plan_json(PlanRequest(args.schedule, args.resume, args.launch_dir, args.allow_class))
    schedule = _load(args.schedule, args.allow_class)
    from vmr_handler.core.timeline import build_plan

    stored = [-float("inf") for e in schedule.entries if e.data and e.is_resume]  # kind RESUME
    plan = build_plan(schedule.entries, [*stored, *args.resume])
    print(plan_table(schedule, plan, _commands(schedule, args.launch_dir)))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """``check``: validation errors exit 2; warnings (extra pickle attributes, programs not found
    on this machine, shell syntax errors) exit 0, or 2 with ``--strict``. Every line names the
    format the file was read as (its content decides: pickle, yaml or json).

    Raises:
        ScheduleError: (exit 2) it cannot be used; the message names the file and its format.
    """
    from vmr_handler.core.schedule.loader import load_schedule_columns

    try:  # (as columns: no object per entry that cannot get a warning)
        schedule = load_schedule_columns(args.schedule, args.allow_class)
    except ScheduleError as exc:
        from vmr_handler.core.schedule.loader import format_label

        what = str(exc).removeprefix(f"{args.schedule}: ")
        label = format_label(args.schedule)
        raise ScheduleError(f"{args.schedule}{f' ({label})' if label else ''}: {what}") from exc
    from vmr_handler.core.schedule.lint import lint_schedule

    warnings = [*schedule.warnings, *lint_schedule(schedule)]
    label = "error" if args.strict else "warning"
    for warning in warnings:
        print(f"{label}: {warning}", file=sys.stderr)
    summary = (
        f"{schedule.source_format}, {len(schedule.starts)} entries, {len(schedule.stage_times())} stages"
    )
    if args.strict and warnings:
        print(f"{args.schedule}: {len(warnings)} problem(s) with --strict ({summary})", file=sys.stderr)
        return 2
    more = f", {len(warnings)} warning(s)" if warnings else ""
    print(f"{args.schedule}: OK ({summary}{more})")
    return 0


#: Keys of the config file (each is also a ``run`` flag: ``state_dir`` is ``--state-dir``).
CONFIG_KEYS = {
    "port": str, "state_dir": str, "launch_dir": str, "reboot_command": str, "vm_name": str,
    "allow_class": list, "start_buffer": (int, float), "heartbeat": (int, float),
    "peer_timeout": (int, float), "transport": str, "broker": str, "experiment": str,
    "username": str, "password": str, "password_file": str, "ca_file": str, "ca_pem": str,
    "cert_file": str, "key_file": str, "cert_pem": str, "key_pem": str, "keepalive": int,
    "public_key": str,
    "signature_max_age": (int, float), "http_ca_file": str,
    "report_hold_events": int, "report_hold_bytes": int, "default_timeout": (int, float),
}  # fmt: skip


def load_config(path: Optional[str], default: str = DEFAULT_CONFIG) -> Dict[str, Any]:
    """Read the agent's config file or fw_cfg blob (a YAML mapping of :data:`CONFIG_KEYS`).

    ``path`` None reads ``default`` when it exists; ``""`` reads nothing.

    Raises:
        VmrError: unreadable file, not a mapping, unknown key or wrong type (named).
    """
    import yaml

    if path is None:
        if not os.path.exists(default):
            return {}
        path = default
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise VmrError(f"cannot read config {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise VmrError(f"config {path}: must be a mapping of keys {sorted(CONFIG_KEYS)}")
    for key, value in doc.items():
        if key not in CONFIG_KEYS:
            raise VmrError(f"config {path}: unknown key {key!r}; known: {sorted(CONFIG_KEYS)}")
        if not isinstance(value, CONFIG_KEYS[key]) or isinstance(value, bool):  # type: ignore[arg-type]
            raise VmrError(f"config {path}: key {key!r} has the wrong type ({type(value).__name__})")
    return doc


def _setting(args: argparse.Namespace, config: Dict[str, Any], key: str, default: Any) -> Any:
    value = getattr(args, key, None)
    if value is not None and value != []:
        return value
    return config.get(key, default)


def cmd_run(args: argparse.Namespace) -> int:
    from vmr_handler.agent.engine.engine import DEFAULT_REBOOT_COMMAND, EngineConfig

    # identity and credentials, first found wins: command line, fw_cfg blob, config file, hostname
    settings = load_config(args.config)
    if args.local is None:
        settings.update(load_config(args.fw_cfg, DEFAULT_FW_CFG))
    state_dir = _setting(args, settings, "state_dir", DEFAULT_STATE_DIR)
    launch_dir = _setting(args, settings, "launch_dir", DEFAULT_LAUNCH_DIR)
    allow = _setting(args, settings, "allow_class", [])
    if args.local is None:
        from vmr_handler.agent.connected.agent import AgentConfig, channel_opener, run_connected
        from vmr_handler.agent.connected.link import machine_boot_id
        from vmr_handler.transports.virtio_serial import DEFAULT_PORT

        agent_config = AgentConfig(
            port=_setting(args, settings, "port", DEFAULT_PORT),
            state_dir=state_dir,
            launch_dir=launch_dir,
            reboot_command=_setting(args, settings, "reboot_command", None),
            allow_classes=list(allow),
            clock_skew=args.debug_clock_skew or 0.0,
            quiet=args.quiet,
            default_timeout=_default_timeout(args, settings),
        )
        name = _setting(args, settings, "vm_name", None)
        if name:
            agent_config.vm_name = name
        agent_config.public_key = _setting(args, settings, "public_key", None)
        if agent_config.public_key:  # before anything starts: a key this build cannot check
            from vmr_handler.agent.machine.features import require_signature_checks

            require_signature_checks(_key_setting(args))
        agent_config.http_ca_file = _setting(args, settings, "http_ca_file", None)
        if "signature_max_age" in settings:
            agent_config.signature_max_age = float(settings["signature_max_age"])
        if _setting(args, settings, "transport", "virtio-serial") == "mqtt":
            agent_config.mqtt = _mqtt_options(args, settings, agent_config.vm_name)
        for key in ("heartbeat", "peer_timeout"):
            if key in settings:
                setattr(agent_config, key, float(settings[key]))
        for key in ("report_hold_events", "report_hold_bytes"):  # a full state dir (docs/agent.md)
            if key in settings:
                if settings[key] < 1:
                    raise VmrError(f"config: {key} must be at least 1, not {settings[key]}")
                setattr(agent_config, key, int(settings[key]))
        import asyncio

        boot_id = machine_boot_id()
        return asyncio.run(run_connected(agent_config, channel_opener(agent_config, boot_id), boot_id))
    schedule = _load(args.local, allow)
    config = EngineConfig(
        launch_dir=launch_dir,
        state_dir=state_dir,
        resources_dir=args.resources or os.path.dirname(os.path.abspath(args.local)),
        start_buffer=float(_setting(args, settings, "start_buffer", 60.0)),
        reboot_command=_setting(args, settings, "reboot_command", None) or DEFAULT_REBOOT_COMMAND,
        default_timeout=_default_timeout(args, settings),
    )
    import asyncio

    from vmr_handler.agent.cli._localrun import run_local

    return asyncio.run(run_local(schedule, config, args.report, args.quiet, args.kpi_interval))


def _key_setting(args: argparse.Namespace) -> str:
    """Where ``run``'s public key is set, for messages: ``--public-key``, else ``public_key in
    FILE`` (the fw_cfg blob, which wins, then the config file)."""
    if args.public_key:
        return "--public-key"
    for path, default in ((args.fw_cfg, DEFAULT_FW_CFG), (args.config, DEFAULT_CONFIG)):
        if load_config(path, default).get("public_key"):
            return f"public_key in {path or default}"
    return "public_key"


def _default_timeout(args: argparse.Namespace, settings: Dict[str, Any]) -> Optional[float]:
    """``--default-timeout`` or the config's ``default_timeout``: seconds > 0, or None.

    Raises:
        VmrError: a config value that is not seconds > 0 and finite.
    """
    value = _setting(args, settings, "default_timeout", None)
    if value is not None and not 0 < value < float("inf"):
        raise VmrError(f"config: default_timeout must be seconds > 0, not {value!r}")
    return None if value is None else float(value)


def _mqtt_options(args: argparse.Namespace, settings: Dict[str, Any], vm_name: str) -> Any:
    """MQTT options from flags over settings; the username defaults to the VM name.

    Raises:
        VmrError (MqttError): options the MQTT transport cannot use (named).
    """
    from vmr_handler.transports.mqtt.options import OPTION_KEYS, options_from

    merged = {k: settings[k] for k in OPTION_KEYS if k in settings}
    for key in OPTION_KEYS:
        value = getattr(args, key, None)
        if value:
            merged[key] = value
            if key == "password_file":
                merged.pop("password", None)
    merged.setdefault("username", vm_name)
    return options_from(merged, "agent settings (flags, fw_cfg, config file)")


def run_completion(args: argparse.Namespace) -> int:
    """``completion SHELL``: the shell completion script (:mod:`vmr_handler.core.completion`)."""
    from vmr_handler.core.completion import completion_script

    print(completion_script(_parser(), args.shell))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``vmr-handler`` console script. Returns the exit code."""
    words = sys.argv[1:] if argv is None else argv
    name = command_word(words, COMMANDS)
    parser = _parser(name)
    args = parser.parse_args(join_negative_values(words, parser, _seconds))
    if name is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    command = COMMANDS[name]
    if not command.lean:  # run: its engine and connection log
        import logging

        level = logging.DEBUG if args.verbose else logging.WARNING
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    return _outcome(functools.partial(resolve(command.run), args))


def _outcome(command: Callable[[], int]) -> int:
    """The exit code of ``command``; its errors printed on stderr (exit 2: the schedule or the
    usage; 1: the agent, the journal, anything else vmr-handler raises)."""
    try:
        return command()
    except (ScheduleError, UsageError) as exc:
        print(f"vmr-handler: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ControlError as exc:
        print(f"vmr-handler: error: {exc}", file=sys.stderr)
        return 1
    except (JournalError, VmrError) as exc:
        print(f"vmr-handler: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
