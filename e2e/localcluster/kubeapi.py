"""The node agent's view of the API: a small TLS client and a list+watch informer (raw dicts, no models).

The agent is a kubelet stand-in, so it talks to the apiserver as one does: client-certificate auth,
JSON over HTTPS, watches with bookmarks, relists after any error (an apiserver restart included).
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

LOG = logging.getLogger("node-agent")


def now() -> str:
    """RFC 3339 timestamp (seconds), as the API stores Time."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro(skew_file: Path | None = None) -> str:
    """RFC 3339 timestamp with microseconds, as the API stores MicroTime. A test skews this node's clock
    by writing seconds (e.g. -60) to `skew_file` (<node dir>/clock_skew_s); it is read on every call."""
    skew = 0.0
    if skew_file is not None and skew_file.exists():
        skew = float(skew_file.read_text() or 0)
    return (datetime.now(UTC) + timedelta(seconds=skew)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiError(Exception):
    """A non-2xx answer from the apiserver."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:500]}")
        self.status = status


class Api:
    """A minimal apiserver client (TLS client cert): raw dicts, no generated models."""

    def __init__(self, host: str, port: int, ca: str, cert: str, key: str) -> None:
        self.host, self.port = host, port
        self.ctx = ssl.create_default_context(cafile=ca)
        self.ctx.load_cert_chain(cert, key)

    def _conn(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None, *, query: dict[str, Any] | None = None,
                content_type: str = "application/json", timeout: float = 30) -> Any:
        """One request; returns the decoded JSON answer."""
        if query:
            path += "?" + urllib.parse.urlencode(query)
        conn = self._conn(timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": content_type,
                                                           "Accept": "application/json"})
            resp = conn.getresponse()
            text = resp.read().decode()
        except http.client.HTTPException as exc:
            # The server went away mid-answer (a restart): callers treat it like a refused connection.
            raise ConnectionError(f"{method} {path}: {exc!r}") from exc
        finally:
            conn.close()
        if resp.status >= 300:
            raise ApiError(resp.status, text)
        return json.loads(text) if text else None

    def patch(self, path: str, body: Any, strategic: bool = True) -> Any:
        """Strategic-merge (or JSON-merge) patch."""
        ct = "application/strategic-merge-patch+json" if strategic else "application/merge-patch+json"
        return self.request("PATCH", path, body, content_type=ct)

    def watch(self, path: str, query: dict[str, Any], timeout_s: int = 60) -> Iterator[dict[str, Any]]:
        """Stream watch events until the server closes the watch."""
        q = {**query, "watch": "true", "timeoutSeconds": timeout_s, "allowWatchBookmarks": "true"}
        conn = self._conn(timeout_s + 15)
        try:
            conn.request("GET", path + "?" + urllib.parse.urlencode(q), headers={"Accept": "application/json"})
            resp = conn.getresponse()
            if resp.status >= 300:
                raise ApiError(resp.status, resp.read().decode())
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()


class Informer(threading.Thread):
    """List+watch one resource into a dict keyed by uid; calls `changed()` on every update, or with `key` only
    on those that change `key(object)` (a deletion included): a reader of a few fields of every pod in the
    cluster is not woken by the relabels and status writes of hundreds of pods it does not care about."""

    def __init__(self, api: Api, path: str, changed: Callable[[], None], query: dict[str, Any] | None = None,
                 key: Callable[[dict[str, Any] | None], Any] | None = None) -> None:
        super().__init__(daemon=True, name=f"informer {path}")
        self.api, self.path, self.changed, self.query, self.key = api, path, changed, query or {}, key
        self.items: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()

    def snapshot(self) -> list[dict[str, Any]]:
        """A copy of the current items."""
        with self.lock:
            return list(self.items.values())

    def run(self) -> None:
        """Relist after any error or expired resourceVersion, forever."""
        while True:
            try:
                lst = self.api.request("GET", self.path, query=self.query)
                with self.lock:
                    self.items = {o["metadata"]["uid"]: o for o in lst.get("items") or []}
                rv = lst["metadata"]["resourceVersion"]
                self.synced.set()
                self.changed()
                while True:
                    for ev in self.api.watch(self.path, {**self.query, "resourceVersion": rv}):
                        obj = ev["object"]
                        if ev["type"] == "ERROR":
                            raise ApiError(obj.get("code", 500), json.dumps(obj))
                        rv = obj["metadata"]["resourceVersion"]
                        if ev["type"] == "BOOKMARK":
                            continue
                        with self.lock:
                            if ev["type"] == "DELETED":
                                old = self.items.pop(obj["metadata"]["uid"], None)
                                new = None
                            else:
                                old = self.items.get(obj["metadata"]["uid"])
                                self.items[obj["metadata"]["uid"]] = new = obj
                        if self.key is None or self.key(old) != self.key(new):
                            self.changed()
            except Exception as exc:
                LOG.warning("informer %s: %s; relisting", self.path, exc)
                time.sleep(0.5)

