"""The package-index proxy that `docker build` in the kind engine's netns reaches PyPI through: a client inside
a network namespace gets a tunnel to an allowed host and port on the host's side, and nothing else.

Real sockets, a real netns made for the test; the "outside" is a TCP echo server on the host's loopback, which
a process inside the netns cannot reach on its own (its loopback is its own).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.kindcluster.egress import EgressProxy
from e2e.kindcluster.relay import connect_in_netns

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace of its own needs root")]


@pytest.fixture
def netns() -> Iterator[Path]:
    name = f"rtj-egress-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=30)
        yield Path("/run/netns") / name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False, timeout=30)


@pytest.fixture
def echo() -> Iterator[int]:
    """An echo server on the host's loopback: the 'package index' outside the netns."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def ask(netns: Path, proxy: EgressProxy, request: bytes) -> tuple[socket.socket, bytes]:
    """A client inside the netns sends `request` to the proxy and reads its answer's head."""
    conn = connect_in_netns(netns, ("127.0.0.1", proxy.port))
    conn.settimeout(10)
    conn.sendall(request)
    head = b""
    while b"\r\n\r\n" not in head and (chunk := conn.recv(1)):
        head += chunk
    return conn, head


def test_a_client_in_the_netns_gets_a_tunnel_to_an_allowed_host(netns: Path, echo: int) -> None:
    with pytest.raises(OSError):  # the netns has no way out by itself
        connect_in_netns(netns, ("127.0.0.1", echo), timeout=2).close()
    with EgressProxy(netns, allow=["127.0.0.1"], ports=[echo], port=0) as proxy:
        conn, head = ask(netns, proxy, f"CONNECT 127.0.0.1:{echo} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        with conn:
            assert head.startswith(b"HTTP/1.1 200 ")
            conn.sendall(b"bytes through the tunnel")
            assert conn.recv(100) == b"bytes through the tunnel"
        assert proxy.tunnels == 1 and proxy.refused == []


@pytest.mark.parametrize("request_line", [
    "CONNECT 127.0.0.2:{port} HTTP/1.1",  # a host not on the list
    "CONNECT 127.0.0.1:{other} HTTP/1.1",  # an allowed host, another port
    "GET http://127.0.0.1:{port}/ HTTP/1.1",  # plain forwarding: not offered
])
def test_anything_else_is_refused_and_never_dialed(netns: Path, echo: int, request_line: str) -> None:
    with EgressProxy(netns, allow=["127.0.0.1"], ports=[echo], port=0) as proxy:
        line = request_line.format(port=echo, other=echo + 1)
        conn, head = ask(netns, proxy, f"{line}\r\nHost: x\r\n\r\n".encode())
        conn.close()
        assert head.startswith(b"HTTP/1.1 403 ")
        assert proxy.tunnels == 0 and len(proxy.refused) == 1


def test_an_endless_request_head_is_cut_at_its_bound(netns: Path, echo: int) -> None:
    with EgressProxy(netns, allow=["127.0.0.1"], ports=[echo], port=0) as proxy:
        conn = connect_in_netns(netns, ("127.0.0.1", proxy.port))
        conn.settimeout(10)
        answer = b""
        with conn, contextlib.suppress(OSError):  # the proxy may close (and reset) while we still send
            conn.sendall(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nX: " + b"a" * 20000)
            answer = conn.recv(100)
        assert answer.startswith(b"HTTP/1.1 403") or answer == b""
        assert proxy.tunnels == 0 and len(proxy.refused) == 1
