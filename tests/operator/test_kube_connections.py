"""The operator's writes whose answers it does not read still hand their connection back to the client's pool:
a recovery makes thousands of them (relabels, creates, deletes, events), and an unread answer dropped its
connection, so every next request paid a new TCP and TLS handshake on the operator and the API server alike.
Against a real HTTP server (plain HTTP on loopback: the pooling is the same), counting the connections."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from resilient_operator.kube import Kube

CALLS = 12


class _Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server
    peers: set[tuple[str, int]] = set()
    lock = threading.Lock()

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.lock:
            self.peers.add(self.client_address)
        body = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"}})
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    do_POST = do_PATCH = do_DELETE = _answer  # noqa: N815 (http.server's names)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def kube() -> Iterator[Kube]:
    _Api.peers = set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_port}"
    k = Kube(api_client=client.ApiClient(cfg))
    try:
        yield k
    finally:
        server.shutdown()
        server.server_close()


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team"}, "spec": {}}


def test_unread_answers_reuse_one_connection(kube: Kube) -> None:
    for i in range(CALLS):
        assert kube.create(pod(f"p{i}"))
        kube.delete_pod("team", f"p{i}", force=True)
        assert kube.patch_pod_metadata("team", f"p{i}", "uid", {"a": "b"}, {})
        kube.delete_pdb("team", f"b{i}")
    assert len(_Api.peers) == 1


def test_events_reuse_their_shards_connection(kube: Kube) -> None:
    job = {"metadata": {"name": "j", "namespace": "team", "uid": "u", "resourceVersion": "1"}}
    for i in range(CALLS):
        kube.emit_event(job, "Normal", "Test", f"event {i}")
    assert kube.flush_events(10)
    assert len(_Api.peers) == 1  # one job: one shard, one connection
