"""The console's HTTP(S) server: aiohttp on the host's event loop, so every answer
reads the live experiment without locks. Routes (docs/console.md, and the OpenAPI document
served at ``/api/v1/openapi.json``, :mod:`.openapi`):

``GET /`` the page · ``GET /static/<file>`` its script and style · ``GET /api/v1/experiment``
· ``GET /api/v1/vms`` · ``GET /api/v1/vms/{vm}`` · ``GET /api/v1/vms/{vm}/events`` ·
``GET /api/v1/vms/{vm}/kpi`` · ``GET /api/v1/timeline`` · ``GET /api/v1/stream`` (SSE) ·
``POST /api/v1/resume`` · ``POST /api/v1/release`` · ``GET /metrics``.

Errors are JSON ``{"error": sentence}`` with the status that fits (400 bad request, 401 no or
wrong token, 404 unknown VM or path, 413 too large).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import ssl
from typing import Any, Awaitable, Callable, Dict, List, Optional

from aiohttp import web

from vmr_handler.core.errors import HostSetupError, RequestRefused
from vmr_handler.core.fsutil import atomic_write
from vmr_handler.host.console.auth import is_loopback, load_token, refusal
from vmr_handler.host.console.events import EventQuery, page
from vmr_handler.host.console.live import LiveExperiment
from vmr_handler.host.console.openapi import openapi_document
from vmr_handler.host.console.stream import KEEPALIVE, sse
from vmr_handler.host.console.views import live_words, timeline_end, timeline_ends, vm_detail
from vmr_handler.host.control.commands import rest_commands
from vmr_handler.host.report.render import timeline_fragment
from vmr_handler.host.serve.config import ConsoleOptions
from vmr_handler.host.serve.control_api import ControlApi

log = logging.getLogger("vmr_host.console")

HERE = os.path.dirname(os.path.abspath(__file__))
#: Where ``/static/<file>`` is looked for: the console's own files, then the report's shared ones.
STATIC_DIRS = (os.path.join(HERE, "static"), os.path.join(os.path.dirname(HERE), "report", "static"))
#: The file with the console's URL (for scripts and tests: the port may be chosen by the system).
URL_FILE = "console.url"
#: Largest request body (a resume or release request is a few hundred bytes).
MAX_BODY = 64 * 1024
#: The timeline fragment is rendered again at most every this many seconds, and at most
#: :data:`RENDER_SHARE` of the time (in a worker thread, but it holds the GIL while it renders).
RENDER_EVERY = 1.0
RENDER_SHARE = 0.1
_STATIC_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, allow_nan=False, default=str))


def _error(status: int, text: str) -> web.Response:
    return _json({"error": text}, status)


class Console:
    """The operators' console of one ``vmr-host serve``.

    Args:
        options: where to listen (``--console``, TLS files).
        logs: the logs directory (``console.token``, ``console.url``, the ``.jsonl`` logs).
        live: the live experiment (:class:`LiveExperiment`).
        control: the control socket's requests (resume and release go through the same rules).
    """

    def __init__(self, options: ConsoleOptions, logs: str, live: LiveExperiment, control: ControlApi) -> None:
        self.options = options
        self.logs = logs
        self.live = live
        self.control = control
        self.token = load_token(logs)
        self.loopback = is_loopback(options.host)
        self.url = ""
        self._runner: Optional[web.AppRunner] = None
        self._streams: List[asyncio.Task[Any]] = []
        self._fragment: Dict[str, Any] = {"version": -1, "at": 0.0, "text": "", "cost": 0.0}
        self._render_lock = asyncio.Lock()

    def app(self) -> web.Application:
        """The aiohttp application (routes and the auth/error middleware)."""
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY)
        get, post = web.get, web.post
        app.add_routes(
            [
                get("/", self.index, allow_head=False),
                get("/static/{name}", self.static),
                get("/api/v1/openapi.json", self.openapi),
                get("/api/v1/experiment", self.experiment),
                get("/api/v1/vms", self.vms),
                get("/api/v1/vms/{vm}", self.vm),
                get("/api/v1/vms/{vm}/events", self.events),
                get("/api/v1/vms/{vm}/kpi", self.kpi),
                get("/api/v1/timeline", self.timeline),
                get("/api/v1/stream", self.stream),
                *(post(str(c.rest), self._command(c.name)) for c in rest_commands()),
                get("/metrics", self.metrics),
            ]
        )
        return app

    # ------------------------------------------------------------------ life
    async def start(self) -> None:
        """Fold the logs, bind, write ``<logs>/console.url`` and log the URL.

        Raises:
            HostSetupError: the address cannot be bound or the certificate cannot be loaded.
        """
        tls = self._tls()
        await self.live.start()
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.host, self.options.port, ssl_context=tls)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise HostSetupError(
                f"cannot bind the console to {self.options.host}:{self.options.port}: {exc.strerror or exc}"
            ) from exc
        port = self._runner.addresses[0][1]
        host = self.options.host
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if tls else 'http'}://{shown}:{port}/"
        atomic_write(os.path.join(self.logs, URL_FILE), (self.url + "\n").encode())
        log.info(
            "console at %s (token in %s)", self.url, os.path.join(os.path.abspath(self.logs), "console.token")
        )

    def _tls(self) -> Optional[ssl.SSLContext]:
        if not self.options.cert_file:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(self.options.cert_file, self.options.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise HostSetupError(f"--console-cert {self.options.cert_file}: cannot load it: {exc}") from exc
        return ctx

    async def close(self) -> None:
        """End the streams, stop listening, stop following the experiment."""
        for sub in list(self.live.hub.subscribers):
            sub.queue.put_nowait(None)
        for task in self._streams:
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.live.close()

    # ------------------------------------------------------------------ guard
    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The token rule (:func:`~.auth.refusal`) and JSON errors for every route."""
        open_page = request.method == "GET" and (request.path == "/" or request.path.startswith("/static/"))
        if not open_page:  # the page and its files hold no data; the page asks for the token
            why = refusal(
                request.headers.get("Authorization"), self.token, request.method != "GET", self.loopback
            )
            if why is not None:
                return _error(401, why)
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"request body over {MAX_BODY} bytes")
        except web.HTTPException as exc:
            if exc.status >= 400:
                return _error(
                    exc.status, exc.reason if exc.status != 404 else f"no such path: {request.path}"
                )
            raise

    def _session(self, request: web.Request) -> Any:
        name = request.match_info["vm"]
        session = self.live.experiment.sessions.get(name)
        if session is None:
            raise _NotFound(f"unknown VM {name!r}")
        return session

    # ------------------------------------------------------------------ page
    async def index(self, request: web.Request) -> web.StreamResponse:
        """The console page."""
        return self._file("console.html")

    async def static(self, request: web.Request) -> web.StreamResponse:
        """A file of the page (``console.js``, ``timeline.js``...)."""
        return self._file(request.match_info["name"])

    def _file(self, name: str) -> web.StreamResponse:
        if _STATIC_NAME.match(name):
            for directory in STATIC_DIRS:
                path = os.path.join(directory, name)
                if os.path.isfile(path):
                    kind = _TYPES.get(os.path.splitext(name)[1], "application/octet-stream")
                    return web.FileResponse(path, headers={"Content-Type": kind, "Cache-Control": "no-cache"})
        return _error(404, f"no such file: {name}")

    async def openapi(self, request: web.Request) -> web.StreamResponse:
        """The OpenAPI 3 document of this API."""
        return _json(openapi_document())

    # ------------------------------------------------------------------ reads
    async def experiment(self, request: web.Request) -> web.StreamResponse:
        """The experiment: barrier, start time, counts per state, RESUMEs."""
        _rows, view = self.live.snapshot(self.live.clock.time())
        return _json(view)

    async def vms(self, request: web.Request) -> web.StreamResponse:
        """Every VM's row, problems first; ``?state=a,b`` and ``?problems=1`` filter."""
        now = self.live.clock.time()
        rows, _view = self.live.snapshot(now)
        states = {s for s in request.query.get("state", "").split(",") if s}
        if states:
            rows = [r for r in rows if r["state"] in states]
        if request.query.get("problems") in ("1", "true"):
            rows = [r for r in rows if r["problem"]]
        return _json({"now": now, "start_time": self.live.experiment.barrier.start_time, "vms": rows})

    async def vm(self, request: web.Request) -> web.StreamResponse:
        """One VM: its status, entries and KPI series."""
        try:
            session = self._session(request)
        except _NotFound as exc:
            return _error(404, str(exc))
        timeline = self.live.timeline.vms.get(session.name)
        return _json(vm_detail(self.live.experiment, session, timeline, self.live.clock.time()))

    async def events(self, request: web.Request) -> web.StreamResponse:
        """A page of the VM's stored reports (``after``, ``limit``, ``type``, ``entry``, ``tail``)."""
        try:
            session = self._session(request)
            query = EventQuery.parse(dict(request.query))
        except _NotFound as exc:
            return _error(404, str(exc))
        except ValueError as exc:
            return _error(400, str(exc))
        try:
            answer = await asyncio.to_thread(page, session.log.jsonl_path, query)
        except FileNotFoundError:
            answer = {"events": [], "next": 0, "more": False}
        except OSError as exc:
            return _error(500, f"cannot read the log of {session.name}: {exc.strerror}")
        return _json(answer)

    async def kpi(self, request: web.Request) -> web.StreamResponse:
        """The VM's kept KPI samples as series (name -> values, oldest first)."""
        try:
            session = self._session(request)
        except _NotFound as exc:
            return _error(404, str(exc))
        return _json({"vm": session.name, "latest": session.state.kpi, "series": session.state.kpi_series()})

    async def timeline(self, request: web.Request) -> web.StreamResponse:
        """The report's timeline of the live experiment, as an HTML fragment."""
        text = await self._render()
        return web.Response(text=text, content_type="text/html", headers={"Cache-Control": "no-cache"})

    async def _render(self) -> str:
        """The fragment, rendered again (in a worker thread, :meth:`LiveExperiment.read_held`)
        when the timeline, the lost VMs or a VM's state word changed and enough time passed;
        requests meanwhile share it. A lost VM's open spans end when its agent was last heard from
        (:func:`~vmr_handler.host.console.views.timeline_ends`), a finished experiment's at its
        last event (:func:`~vmr_handler.host.console.views.timeline_end`)."""
        f, clock, exp = self._fragment, self.live.clock, self.live.experiment
        async with self._render_lock:
            began, at = clock.monotonic(), clock.time()
            ends, words = timeline_ends(exp, at), live_words(exp, at)
            key = (self.live.version, sorted(ends.items()), sorted(words.items()))
            if f["version"] != key and began - f["at"] >= max(RENDER_EVERY, f["cost"] / RENDER_SHARE):
                state, now = exp.state_dict(), timeline_end(exp, at)
                text = await self.live.read_held(
                    lambda tl: timeline_fragment(tl, state, now, None, ends, words)
                )
                f.update(version=key, at=began, text=text, cost=clock.monotonic() - began)
        return str(f["text"])

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        """The Prometheus text exposition (prometheus-client)."""
        body, kind = await self.live.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": kind})

    # ------------------------------------------------------------------ stream
    async def stream(self, request: web.Request) -> web.StreamResponse:
        """Server-Sent Events: ``experiment``, ``vm``, ``vm_event``, ``lagged`` (:mod:`.stream`)."""
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await resp.prepare(request)
        sub = self.live.hub.subscribe(self.live.first_messages())
        task = asyncio.current_task()
        if task is not None:
            self._streams.append(task)
        try:
            while True:
                message = await sub.get(KEEPALIVE)
                if message is None:
                    await resp.write(
                        sse("lagged", {"reason": "this client fell behind; reload and reconnect"})
                    )
                    break
                kind, data = message
                await resp.write(sse(kind, data) if kind else b": keepalive\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.live.hub.unsubscribe(sub)
            if task in self._streams:
                self._streams.remove(task)
        return resp

    # ------------------------------------------------------------------ writes
    async def _body(self, request: web.Request) -> Dict[str, Any]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestRefused(f"the body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise RequestRefused("the body must be a JSON object")
        return body

    def _command(self, name: str) -> Handler:
        """The route of control command ``name`` (``POST`` its declared ``rest`` path,
        :mod:`vmr_handler.host.control.commands`): the body is the request, checked and answered
        as the control socket does (e.g. ``resume``: ``vms`` or ``all``, ``force``, ``dry_run``)."""

        async def write(request: web.Request) -> web.StreamResponse:
            return await self._write(request, name, self.control.handlers()[name])

        return write

    async def _write(
        self, request: web.Request, what: str, act: Callable[[Dict[str, Any]], Dict[str, Any]]
    ) -> web.StreamResponse:
        try:
            body = await self._body(request)
            answer = act(body)
        except ValueError as exc:
            return _error(400, f"{what} refused: {exc}")
        if not body.get("dry_run"):
            log.info("console: %s by %s: %s", what, request.remote, json.dumps(body, default=str)[:200])
        return _json(answer)


class _NotFound(Exception):
    """An unknown VM in the path."""
