"""The slice of the kubelet API the apiserver proxies to: container logs (`kubectl logs [-f]`)."""

from __future__ import annotations

import http.server
import logging
import ssl
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .node_context import NodeContext

LOG = logging.getLogger("node-agent")


class KubeletServer(threading.Thread):
    """The slice of the kubelet API the apiserver proxies to: container logs (`kubectl logs [-f]`).

    HTTPS on the node's InternalIP:10250 with a CA-signed serving cert; only CA-signed clients
    (the apiserver's kubelet-client cert) are accepted, as a kubelet with x509 authn would.
    """

    def __init__(self, agent: NodeContext) -> None:
        super().__init__(daemon=True, name="kubelet-api")
        cfg = agent.cfg
        handler = self._handler(agent)
        self.httpd = http.server.ThreadingHTTPServer((cfg["address"], 10250), handler)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=cfg["ca_crt"])
        ctx.load_cert_chain(cfg["serving_cert"], cfg["serving_key"])
        ctx.verify_mode = ssl.CERT_REQUIRED
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)

    @staticmethod
    def _handler(agent: NodeContext) -> Any:
        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: Any) -> None:
                LOG.debug("kubelet api: " + fmt, *args)

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                q = urllib.parse.parse_qs(url.query)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self.send_error(404, "only /containerLogs/{namespace}/{pod}/{container} is served")
                    return
                _, ns, pod, container = parts
                rt = agent.runtime_for(ns, pod)
                path = rt.dir / f"{container}.log" if rt else None
                if path is None or not path.exists():
                    self.send_error(404, f"no logs for {ns}/{pod}/{container} on this node")
                    return
                data = path.read_bytes()
                if "tailLines" in q:
                    n = int(q["tailLines"][0])
                    data = b"".join(data.splitlines(keepends=True)[-n:]) if n else b""
                if "limitBytes" in q:
                    data = data[: int(q["limitBytes"][0])]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(data)
                if q.get("follow", ["false"])[0] != "true":
                    return
                assert rt is not None  # a path came from it
                pos = path.stat().st_size
                with path.open("rb") as f:
                    f.seek(pos)
                    while agent.runtime_for(ns, pod) is rt and not rt.removed.is_set():
                        chunk = f.read(65536)
                        if chunk:
                            self.wfile.write(chunk)
                            self.wfile.flush()
                        elif rt.stopped(container):
                            return
                        else:
                            time.sleep(0.2)

        return Handler

    def run(self) -> None:
        """Serve until the process ends."""
        self.httpd.serve_forever()

