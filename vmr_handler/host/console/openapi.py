"""The OpenAPI 3 document of the console's REST API, served at
``/api/v1/openapi.json``: every route of :mod:`.app` with its parameters and answers, so
operators can generate a client or read it in any OpenAPI viewer."""

from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

from vmr_handler import __version__
from vmr_handler.host.control.commands import answer_schema, request_schema, rest_commands, schema_name

_VM = {"name": "vm", "in": "path", "required": True, "schema": {"type": "string"}, "description": "VM name"}
_ERROR = {
    "description": 'refused: {"error": sentence}',
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}


def _q(name: str, kind: str, text: str) -> Dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": {"type": kind}, "description": text}


def _get(
    summary: str, ref: str, params: Sequence[Dict[str, Any]] = (), media: str = "application/json"
) -> Dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{ref}"} if ref else {"type": "string"}
    return {
        "get": {
            "summary": summary,
            "parameters": list(params),
            "responses": {
                "200": {"description": "OK", "content": {media: {"schema": schema}}},
                "401": _ERROR,
                "404": _ERROR,
            },
        }
    }


def _post(summary: str, body: str, ref: str) -> Dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}},
            },
            "responses": {
                "200": {
                    "description": "done",
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
                },
                "400": _ERROR,
                "401": _ERROR,
            },
        }
    }


def _obj(**props: Any) -> Dict[str, Any]:
    return {"type": "object", "properties": props}


_NUM = {"type": "number"}
_NUM_NULL = {"type": "number", "nullable": True}
_STR = {"type": "string"}
_STRS = {"type": "array", "items": _STR}

_SCHEMAS: Dict[str, Any] = {
    "Error": _obj(error=_STR),
    "Row": _obj(
        vm=_STR,
        state=_STR,
        problem={"type": "boolean"},
        expected={"type": "boolean"},
        connected={"type": "boolean"},
        gone_for=_NUM_NULL,
        stage={"type": "string", "nullable": True},
        at_break={"type": "integer", "nullable": True},
        paused={"type": "integer", "nullable": True},
        running={"type": "integer"},
        failures={"type": "integer"},
        failed_entry={"type": "integer", "nullable": True},
        max_lateness=_NUM_NULL,
        last_seen=_NUM_NULL,
        kpi={"type": "object", "nullable": True},
    ),
    "Experiment": _obj(
        now=_NUM,
        name=_STR,
        run_id=_STR,
        mode=_STR,
        start_time=_NUM_NULL,
        barrier={"type": "object"},
        counts={"type": "object", "additionalProperties": {"type": "integer"}},
        states=_STRS,
        problem_states=_STRS,
        vms={"type": "integer"},
        connected={"type": "integer"},
        problems={"type": "integer"},
        resumes={"type": "array", "items": {"type": "object"}},
    ),
    "Vms": _obj(
        now=_NUM, start_time=_NUM_NULL, vms={"type": "array", "items": {"$ref": "#/components/schemas/Row"}}
    ),
    "Vm": {
        "type": "object",
        "description": "vmr-host status --json of the VM, plus row, entries and kpi_series",
        "properties": {
            "row": {"$ref": "#/components/schemas/Row"},
            "entries": {"type": "array", "items": {"type": "object"}},
            "kpi_series": {"type": "object"},
        },
    },
    "Events": _obj(
        events={
            "type": "array",
            "items": _obj(cursor={"type": "integer"}, host_received=_NUM, event={"type": "object"}),
        },
        next={"type": "integer"},
        more={"type": "boolean"},
    ),
    "Kpi": _obj(vm=_STR, latest={"type": "object", "nullable": True}, series={"type": "object"}),
    # the control commands' requests and answers: from their declarations (_commands())
}


def _commands() -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The paths and schemas of the control commands the console serves, from their
    declarations (:mod:`vmr_handler.host.control.commands`): ``POST`` the route, the request
    ``<Name>Request`` and the answer ``<Name>Answer``."""
    paths, schemas = {}, {}
    for command in rest_commands():
        name = schema_name(command)
        paths[str(command.rest)] = _post(command.summary, f"{name}Request", f"{name}Answer")
        schemas[f"{name}Request"] = request_schema(command)
        schemas[f"{name}Answer"] = answer_schema(command)
    return paths, schemas


def openapi_document() -> Dict[str, Any]:
    """The OpenAPI 3.0 document (a JSON-safe dict)."""
    events_params = [
        _VM,
        _q("after", "integer", "byte offset to read from (a 'next' of an earlier page)"),
        _q("limit", "integer", "records per page (1-1000, default 100)"),
        _q("type", "string", "event types kept, comma separated (e.g. output,entry_exited)"),
        _q("entry", "integer", "keep the records of this entry index only"),
        _q("tail", "integer", "the last N matching records instead of the first"),
    ]
    command_paths, command_schemas = _commands()
    return {
        "openapi": "3.0.3",
        "info": {"title": "vmr-host console", "version": __version__, "description": "docs/console.md"},
        "components": {
            "schemas": {**_SCHEMAS, **command_schemas},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/v1/experiment": _get(
                "the experiment: barrier, start time, counts per state, RESUMEs", "Experiment"
            ),
            "/api/v1/vms": _get(
                "every VM's row, problems first",
                "Vms",
                [
                    _q("state", "string", "keep these states, comma separated"),
                    _q("problems", "integer", "1: problems only"),
                ],
            ),
            "/api/v1/vms/{vm}": _get("one VM: status, entries, KPI series", "Vm", [_VM]),
            "/api/v1/vms/{vm}/events": _get("a page of the VM's stored reports", "Events", events_params),
            "/api/v1/vms/{vm}/kpi": _get("the VM's latest KPIs and kept series", "Kpi", [_VM]),
            "/api/v1/timeline": _get(
                "the report's timeline of the live experiment (HTML fragment)", "", media="text/html"
            ),
            "/api/v1/stream": _get(
                "Server-Sent Events: experiment, vm, vm_event, lagged", "", media="text/event-stream"
            ),
            **command_paths,
            "/metrics": _get("Prometheus text exposition", "", media="text/plain"),
        },
    }
