"""The control commands are declared once (``vmr_handler/host/control/commands.py``) and every
surface is derived from the declarations: the control socket's dispatch and validation, the
CLI's arguments, the console's REST routes and its OpenAPI document."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict

import pytest

from vmr_handler.core.control import ControlServer, request_at
from vmr_handler.core.errors import BarrierError, RequestRefused
from vmr_handler.host.cli.vmr_host import parser
from vmr_handler.host.console.openapi import openapi_document
from vmr_handler.host.control.commands import (
    COMMANDS,
    REFUSALS,
    request_of,
    rest_commands,
    schema_name,
    validate,
)
from vmr_handler.host.serve.control_api import ControlApi


def _api() -> ControlApi:
    """A ControlApi whose handlers are never reached (no experiment)."""
    return ControlApi.__new__(ControlApi)


def test_every_declared_command_has_a_socket_handler() -> None:
    api = _api()
    assert set(api.handlers()) == set(COMMANDS)
    for name in COMMANDS:
        assert callable(getattr(api, name)), name


_SPELLED = [n for n, c in COMMANDS.items() if any(f.flags is not None for f in c.fields)]


@pytest.mark.parametrize("name", _SPELLED)
def test_every_field_the_cli_spells_is_an_argument_of_its_command(name: str) -> None:
    command = COMMANDS[name]
    required = [w for f in command.fields if f.flags and f.kind != "names" and f.default is None
                for w in (f.flags[0], "1")]  # fmt: skip
    args = parser().parse_args([name, *required])
    values = vars(args)
    spelled = [f for f in command.fields if f.flags is not None]
    assert all(f.name in values for f in spelled)
    request = request_of(command, values)
    assert validate(command, request) == {**validate(command, {}), **request}


def test_every_rest_command_has_a_route_and_an_openapi_path() -> None:
    from vmr_handler.host.console.app import Console

    console = Console.__new__(Console)
    routes = {(r.method, r.resource.canonical)  # type: ignore[attr-defined]
              for r in console.app().router.routes() if r.resource is not None}  # fmt: skip
    doc = openapi_document()
    assert rest_commands(), "the console serves resume and release"
    for command in rest_commands():
        assert ("POST", command.rest) in routes
        post = doc["paths"][command.rest]["post"]
        assert post["summary"] == command.summary
        request = doc["components"]["schemas"][f"{schema_name(command)}Request"]
        assert set(request["properties"]) == {f.name for f in command.fields}
        answer = doc["components"]["schemas"][f"{schema_name(command)}Answer"]
        assert set(answer["properties"]) == set(command.answer)


def test_an_unknown_field_is_refused_naming_it() -> None:
    wanted = r"resume: unknown field.*'bogus'.*known: vms, all, force, dry_run"
    with pytest.raises(RequestRefused, match=wanted):
        validate(COMMANDS["resume"], {"cmd": "resume", "all": True, "bogus": 1})


def test_a_field_of_the_wrong_kind_is_refused_as_before() -> None:
    with pytest.raises(RequestRefused, match=r"^'vms' must be a list of VM names$"):
        validate(COMMANDS["resume"], {"cmd": "resume", "vms": "vm1"})
    with pytest.raises(RequestRefused, match="'force' must be true or false"):
        validate(COMMANDS["resume"], {"cmd": "resume", "all": True, "force": "yes"})


def test_absent_fields_take_their_declared_defaults() -> None:
    # one default for every surface: without force, the rule of SPEC section 8 (the VMs at a break)
    assert validate(COMMANDS["resume"], {"cmd": "resume", "all": True}) == {
        "cmd": "resume", "vms": [], "all": True, "force": False, "dry_run": False,
    }  # fmt: skip
    assert validate(COMMANDS["release"], {"exclude": None}) == {"cmd": "release", "exclude": []}


def test_declared_refusals_are_answered_as_refused_requests(tmp_path: Path) -> None:
    """A refusal class (here ``BarrierError`` of ``release``) and a malformed request are the
    same JSON error as before: ``{"status": "error", "details": message}``."""
    assert BarrierError in REFUSALS and BarrierError in COMMANDS["release"].refusals
    api = _api()

    def release(request: Dict[str, Any]) -> Dict[str, Any]:
        raise BarrierError("the experiment start time is already set")

    api.release = release  # type: ignore[method-assign]
    path = str(tmp_path / "c.sock")

    async def run() -> Dict[str, Any]:
        server = ControlServer(str(tmp_path), api.handlers(), path=path)
        await server.start()
        try:
            loop = asyncio.get_running_loop()
            answers = {}
            for name, payload in (
                ("refused", {"cmd": "release"}),
                ("unknown field", {"cmd": "release", "exclude": [], "vms": ["a"]}),
                ("unknown command", {"cmd": "nope"}),
            ):
                answers[name] = await loop.run_in_executor(None, request_at, path, payload)
            return answers
        finally:
            await server.close()

    answers = asyncio.run(run())
    assert answers["refused"] == {"status": "error", "details": "the experiment start time is already set"}
    assert answers["unknown field"] == {
        "status": "error", "details": "release: unknown field(s) 'vms'; known: exclude",
    }  # fmt: skip
    assert answers["unknown command"]["status"] == "error"
    assert "unknown command 'nope'" in answers["unknown command"]["details"]


def test_kill_fields_are_checked_by_kind_choice_and_bounds() -> None:
    kill = COMMANDS["kill"]
    assert validate(kill, {"vms": ["a"], "entry": 3}) == {
        "cmd": "kill", "vms": ["a"], "all": False, "entry": 3, "signal": "TERM", "grace": 10.0, "by": "",
    }  # fmt: skip
    for request, wanted in (
        ({"entry": "3"}, "kill: 'entry' must be an integer, not '3'"),
        ({"entry": True}, "kill: 'entry' must be an integer, not True"),
        ({"entry": -1}, "kill: 'entry' must be 0-2147483648, not -1"),
        ({"entry": 1, "grace": "soon"}, r"kill: 'grace' must be a number \(seconds\), not 'soon'"),
        ({"entry": 1, "grace": 7200}, "kill: 'grace' must be 0-3600, not 7200"),
        ({"entry": 1, "grace": float("nan")}, "kill: 'grace' must be 0-3600, not nan"),
        ({"entry": 1, "signal": "STOP"}, "kill: 'signal' must be one of TERM, KILL, INT, HUP, not 'STOP'"),
    ):
        with pytest.raises(RequestRefused, match=f"^{wanted}$"):
            validate(kill, {"vms": ["a"], **request})


def test_the_kill_signals_the_cli_offers_are_those_the_agent_takes() -> None:
    from vmr_handler.core.wire import protocol
    from vmr_handler.host.control import commands

    assert commands.KILL_SIGNALS == protocol.KILL_SIGNALS and commands.MAX_GRACE == protocol.MAX_GRACE
