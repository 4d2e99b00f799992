"""Local control socket: ``vmr-handler status`` / ``vmr-handler resume`` talk to a running agent.

The agent listens on ``<state-dir>/control.sock`` (mode 0600). Protocol: the client sends
one JSON object per line ``{"cmd": "status"|"resume"}``; the agent answers one JSON line
``{"status": "success"|"error", "details": ..., "result": {...}}`` (seed 004 result shape).
"""

from __future__ import annotations

import json
import os
import socket

from vmr_handler.core.errors import ControlError, RequestRefused

TYPE_CHECKING = False  # no ``typing`` on the lean paths (core.commandtable.TYPE_CHECKING)
if TYPE_CHECKING:
    import asyncio
    from typing import Any, Callable, Dict, Optional

    #: What answers one command: the request dict in, the result dict out.
    Handler = Callable[[Dict[str, Any]], Dict[str, Any]]

SOCKET_NAME = "control.sock"
MAX_REQUEST = 64 * 1024
#: Longest unix socket path the kernel accepts (sun_path is 108 bytes with the NUL).
MAX_SOCKET_PATH = 107


def socket_problem(path: str, what: str, shorter: str) -> Optional[str]:
    """Why ``path`` cannot be a unix socket address (None when it can): the one rule for every
    socket of both programs (the agent's and the host's control sockets, the host's channels).

    Args:
        path: an absolute path.
        what: what the socket is, for the message (``control socket``).
        shorter: what to shorten, for the message (``--state-dir``).
    """
    size = len(path.encode())
    if size <= MAX_SOCKET_PATH:
        return None
    return (
        f"{what} path {path} is {size} bytes, longer than the unix socket limit of {MAX_SOCKET_PATH}; "
        f"use a shorter {shorter}"
    )


def checked_socket_path(path: str, shorter: str = "path") -> str:
    """``path`` made absolute, checked to fit a unix socket address (a control socket).

    Raises:
        ControlError: the path is too long for a unix socket (the message says what to shorten).
    """
    path = os.path.abspath(path)
    problem = socket_problem(path, "control socket", shorter)
    if problem is not None:
        raise ControlError(problem)
    return path


def socket_path(state_dir: str) -> str:
    """Path of the control socket of the agent using ``state_dir``.

    Raises:
        ControlError: the path is too long for a unix socket.
    """
    return checked_socket_path(os.path.join(state_dir, SOCKET_NAME), "--state-dir")


class ControlServer:
    """Serves control requests for a running engine.

    Args:
        state_dir: where the socket lives.
        handlers: ``{"status": fn, "resume": fn}``; each takes the request dict and returns a result
            dict, or raises ``RequestRefused`` (answered ``{"status": "error", "details": why}``).
        path: the socket's path instead of ``<state_dir>/control.sock`` (``vmr-host`` uses
            ``<logs>/vmr-host.sock``).
    """

    def __init__(self, state_dir: str, handlers: Dict[str, Handler], *, path: Optional[str] = None) -> None:
        self.path = socket_path(state_dir) if path is None else checked_socket_path(path)
        self._handlers = handlers
        self._server: Optional[Any] = None  # asyncio.AbstractServer

    async def start(self) -> None:
        """Bind the socket (removing a stale one; refusing if another agent answers on it).

        Raises:
            ControlError: another agent is already serving this state dir.
        """
        if os.path.exists(self.path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
            except OSError:
                os.unlink(self.path)
            else:
                raise ControlError(
                    f"another vmr-handler is running with this state dir ({self.path} answers)"
                )
            finally:
                probe.close()
        old_umask = os.umask(0o177)
        try:
            import asyncio  # here, not at import: the client side stays quick to start

            self._server = await asyncio.start_unix_server(self._serve, path=self.path, limit=MAX_REQUEST)
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import asyncio

        from vmr_handler.core.events import json_safe  # here: the clients stay quick to start

        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            try:
                try:
                    request = json.loads(line.decode("utf-8"))
                except json.JSONDecodeError as exc:
                    raise RequestRefused(str(exc)) from exc
                if not isinstance(request, dict):
                    raise RequestRefused("request must be a JSON object")
                handler = self._handlers.get(str(request.get("cmd")))
                if handler is None:
                    raise RequestRefused(
                        f"unknown command {request.get('cmd')!r}; known: {sorted(self._handlers)}"
                    )
                reply: Dict[str, Any] = {"status": "success", "result": handler(request)}
            except (RequestRefused, UnicodeDecodeError) as exc:  # a refused request; anything else is a bug
                reply = {"status": "error", "details": str(exc)}
            writer.write(json.dumps(json_safe(reply)).encode() + b"\n")
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        """Stop serving and remove the socket."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        try:
            os.unlink(self.path)
        except OSError:
            pass


def request(state_dir: str, cmd: str, timeout: float = 10.0) -> Dict[str, Any]:
    """Send one control request to the agent using ``state_dir`` and return its reply.

    Raises:
        ControlError: no agent is running there, or it answered badly.
    """
    return request_at(socket_path(state_dir), {"cmd": cmd}, timeout, program="vmr-handler")


def request_at(
    path: str, payload: Dict[str, Any], timeout: float = 10.0, program: str = "vmr-host"
) -> Dict[str, Any]:
    """Send one control request ``payload`` (``{"cmd": ..., ...}``) to the socket at ``path``
    and return the reply (``{"status", "details"|"result"}``).

    Raises:
        ControlError: nothing answers at ``path`` (``program`` names what was expected there),
            or the reply is not a JSON object.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    data = b""
    try:
        sock.connect(path)
        sock.sendall(json.dumps(payload).encode() + b"\n")
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except FileNotFoundError as exc:
        raise ControlError(f"no running {program} found: {path} does not exist") from exc
    except OSError as exc:
        raise ControlError(f"cannot talk to {program} at {path}: {exc}") from exc
    finally:
        sock.close()
    try:
        reply = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise ControlError(f"bad reply from {program} at {path}: {data[:200]!r}") from exc
    if not isinstance(reply, dict):
        raise ControlError(f"bad reply from {program} at {path}: {reply!r}")
    return reply
