"""A QEMU-free stand-in for a virtio-serial port: a pty the agent opens as its character
device, relayed to the host's unix socket the way QEMU's ``-chardev socket,reconnect=1``
client does.

Like the real device (``qemu-mqtt-lab.md``): the guest cannot see the host side drop and
come back; while no host is connected nothing is read from the guest side, so its writes
back up (EAGAIN) until the host returns; bytes are delivered in arbitrary pieces.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time
import tty
from typing import Optional


class VirtioSerialStandIn:
    """Relay between a pty (guest side, :attr:`guest_path`) and ``host_socket`` (host side).

    Args:
        host_socket: the unix socket vmr-host listens on for this VM.
        chunk: largest piece relayed at once (small values exercise partial reads/writes).
    """

    def __init__(self, host_socket: str, chunk: int = 4096) -> None:
        self.host_socket = host_socket
        self.chunk = chunk
        self._master, slave = os.openpty()
        tty.setraw(slave)  # no echo, no line editing: a byte pipe like the real port
        self.guest_path = os.ttyname(slave)
        os.close(slave)  # the agent opens it by path
        os.set_blocking(self._master, False)
        self._sock: Optional[socket.socket] = None
        self._connect = True
        self._stop = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.host_bytes = 0
        self.guest_bytes = 0

    def start(self) -> VirtioSerialStandIn:
        self._thread.start()
        return self

    def drop_host(self) -> None:
        """Close the host side and stay away until :meth:`restore_host`."""
        with self._lock:
            self._connect = False
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def restore_host(self) -> None:
        """Reconnect to the host socket (as QEMU's reconnect=1 would)."""
        with self._lock:
            self._connect = True

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=5)
        with self._lock:
            if self._sock is not None:
                self._sock.close()
        os.close(self._master)

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        while not self._stop:
            with self._lock:
                sock = self._sock
                want = self._connect
            if sock is None:
                if want:
                    try:
                        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                        s.connect(self.host_socket)
                        s.setblocking(False)
                        with self._lock:
                            self._sock = s
                        continue
                    except OSError:
                        s.close()
                time.sleep(0.05)
                continue
            sel.register(sock, selectors.EVENT_READ)
            sel.register(self._master, selectors.EVENT_READ)
            try:
                for key, _ in sel.select(timeout=0.1):
                    if key.fileobj is sock:
                        try:
                            data = sock.recv(self.chunk)
                        except OSError:
                            data = b""
                        if not data:
                            self._host_gone(sock)
                            break
                        self.host_bytes += len(data)
                        self._write_all_master(data)
                    else:
                        try:
                            data = os.read(self._master, self.chunk)
                        except (BlockingIOError, OSError):
                            continue
                        self.guest_bytes += len(data)
                        try:
                            sock.sendall(data)
                        except OSError:
                            self._host_gone(sock)
                            break
            finally:
                sel.unregister(self._master)
                try:
                    sel.unregister(sock)
                except (KeyError, ValueError):
                    pass

    def _host_gone(self, sock: socket.socket) -> None:
        with self._lock:
            if self._sock is sock:
                sock.close()
                self._sock = None

    def _write_all_master(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self._stop:
            try:
                n = os.write(self._master, view)
                view = view[n:]
            except BlockingIOError:
                time.sleep(0.005)
