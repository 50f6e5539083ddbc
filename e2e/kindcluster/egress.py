"""A package-index proxy for `docker build` in the engine's network namespace.

The netns engine (hack/kind/docker.sh) has no route out, and giving it one would mean a veth, ip_forward and
NAT on the host. A laptop's `docker build` reaches PyPI directly; here RUN steps reach it through this: an
HTTP CONNECT proxy whose listening socket lives inside the netns (127.0.0.1:`port`, made by a thread that
entered it: a socket stays in the netns it was made in) and whose outgoing connections are made from the
host's netns, as the host's own pip makes them. Only CONNECT, only to the allowed hosts and ports: a build
step can fetch packages and reach nothing else. TLS passes through untouched (pip checks the certificates).
Builds run with `--network host` (the engine's netns) and `--build-arg HTTPS_PROXY=http://127.0.0.1:<port>`,
one of Docker's predefined build args, which changes no layer's cache key.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterable
from pathlib import Path

from e2e.controlplane.forward import splice  # both ways, half-closing at EOF
from e2e.kindcluster.relay import accept_each, run_in_netns

PYPI_HOSTS = ("pypi.org", "files.pythonhosted.org")  # the index pip asks, and where its files are
HEAD_LIMIT = 8192  # a CONNECT request's head; anything longer is refused unread
_CONNECT = re.compile(rb"CONNECT ([A-Za-z0-9.-]+):(\d{1,5}) HTTP/1\.[01]\r\n")


class EgressProxy:
    """CONNECT-only proxy: listens on 127.0.0.1:`port` inside `netns`, dials `allow`ed host:port pairs from
    the host's netns. `refused` lists what was asked for and not allowed (for the caller's error message)."""

    def __init__(self, netns: Path, allow: Iterable[str] = PYPI_HOSTS, ports: Iterable[int] = (443,),
                 port: int = 3128, timeout: float = 30) -> None:
        self.allow, self.ports, self.timeout = frozenset(allow), frozenset(ports), timeout
        self.listener = run_in_netns(netns, lambda: socket.create_server(("127.0.0.1", port)))
        self.port: int = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.refused: list[str] = []
        self.tunnels = 0
        threading.Thread(target=accept_each, args=(self.listener, self._handle), daemon=True,
                         name=f"egress:{self.port}").start()

    def _read_head(self, conn: socket.socket) -> bytes | None:
        conn.settimeout(self.timeout)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(HEAD_LIMIT - len(head))
            if not chunk or len(head) + len(chunk) >= HEAD_LIMIT:
                return None
            head += chunk
        return head

    def _handle(self, conn: socket.socket) -> None:
        with contextlib.closing(conn):
            try:
                head = self._read_head(conn)
            except OSError:
                return
            match = _CONNECT.match(head or b"")
            target = (match.group(1).decode().lower(), int(match.group(2))) if match else None
            if target is None or target[0] not in self.allow or target[1] not in self.ports:
                self.refused.append(f"{target[0]}:{target[1]}" if target else repr((head or b"")[:80]))
                with contextlib.suppress(OSError):
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            try:
                upstream = socket.create_connection(target, timeout=self.timeout)
            except OSError:
                with contextlib.suppress(OSError):
                    conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            with contextlib.closing(upstream):
                self.tunnels += 1
                upstream.settimeout(None)
                conn.settimeout(None)
                try:
                    conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                except OSError:
                    return
                # The client waits for the 200 before its TLS hello, so nothing followed the head.
                splice(conn, upstream)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def __enter__(self) -> EgressProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
