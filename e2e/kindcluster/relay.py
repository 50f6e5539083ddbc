"""A TCP relay from the host's loopback into a network namespace: the kind API server's published port lives
in the engine's netns (hack/kind/docker.sh), and kubectl, helm and the Python client reach it through this.

A listener on 127.0.0.1:<free port> in the host's netns; for each connection a thread that has entered the
target netns (setns(2) switches only the calling thread) opens the upstream socket, which stays in that
netns after the thread is gone; two pump threads copy bytes both ways (TLS passes through untouched, and
kind's API certificate names 127.0.0.1).
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from e2e.controlplane.forward import splice  # both ways, half-closing at EOF

CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def run_in_netns(netns: Path, make: Callable[[], T]) -> T:
    """`make()` called by a short-lived thread that entered `netns` (setns(2) switches only the calling
    thread); a socket it makes stays in that netns after the thread is gone."""
    result: list[T | BaseException] = []

    def enter_and_make() -> None:
        try:
            fd = os.open(netns, os.O_RDONLY)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {netns}")
            finally:
                os.close(fd)
            result.append(make())
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)

    worker = threading.Thread(target=enter_and_make, daemon=True)
    worker.start()
    worker.join()
    got = result[0]
    if isinstance(got, BaseException):
        raise got
    return got


def connect_in_netns(netns: Path, address: tuple[str, int], timeout: float = 10) -> socket.socket:
    """A TCP connection to `address` made from inside `netns`."""
    got = run_in_netns(netns, lambda: socket.create_connection(address, timeout=timeout))
    got.settimeout(None)
    return got


def accept_each(listener: socket.socket, handle: Callable[[socket.socket], None]) -> None:
    """Hand each accepted connection to `handle` in a thread of its own, until the listener is closed."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


class NetnsRelay:
    """127.0.0.1:`port` on the host, relayed to `target` inside `netns` (closed by `close`)."""

    def __init__(self, netns: Path, target: tuple[str, int]) -> None:
        self.netns, self.target = netns, target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        threading.Thread(target=accept_each, args=(self.listener, self._handle), daemon=True,
                         name=f"relay:{self.port}").start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            upstream = connect_in_netns(self.netns, self.target)
        except OSError:
            conn.close()
            return
        splice(conn, upstream)
        conn.close()
        upstream.close()

    def close(self) -> None:
        self.listener.close()
