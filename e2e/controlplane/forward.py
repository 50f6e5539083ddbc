"""A TCP forwarder from host loopback into the cluster's network namespace: how the host reaches the apiserver.

The harness binds the listening socket on the host (127.0.0.1, a port the kernel picks, so there is
no race for it) and starts this process inside the cluster's namespace with that socket inherited.
Connections it accepts are therefore made on the host, and the ones it opens to the apiserver from
inside the namespace: the host needs no interface, route, forwarding or NAT rule. TLS passes through
untouched (the apiserver's certificate names 127.0.0.1).

Run (by plane.py): python -m e2e.controlplane.forward --listen-fd N --target 10.100.0.1:6443 --cluster-dir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import threading

LOG = logging.getLogger("api-forward")
CHUNK = 65536


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy one direction until EOF, then pass the EOF on (half-close), so watches and uploads end cleanly."""
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _serve_one(client: socket.socket, target: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(target, timeout=10)
    except OSError as exc:  # the apiserver is down (a restart test): the client sees a closed connection
        LOG.info("connect %s:%d: %s", *target, exc)
        client.close()
        return
    upstream.settimeout(None)
    splice(client, upstream)
    client.close()
    upstream.close()


def splice(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until both directions reached EOF (the caller closes the sockets)."""
    back = threading.Thread(target=pump, args=(b, a), daemon=True)
    back.start()
    pump(a, b)
    back.join()


def serve(listener: socket.socket, target: tuple[str, int]) -> None:
    """Accept forever; one thread per connection (a handful of clients, some long watches)."""
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_serve_one, args=(client, target), daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """Entry point; see the module docstring."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen-fd", type=int, required=True)
    ap.add_argument("--target", required=True, help="host:port inside the namespace")
    ap.add_argument("--cluster-dir", help="recorded so `down` can tell this process is the cluster's")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    host, _, port = args.target.rpartition(":")
    listener = socket.socket(fileno=args.listen_fd)
    serve(listener, (host, int(port)))


if __name__ == "__main__":
    main()
