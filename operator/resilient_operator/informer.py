"""A list+watch cache of one resource (client-go's reflector and store, on the synchronous client).

Why our own and not kopf's watches: kopf replays objects after a re-list but never says which ones
vanished while the watch was down, so a deleted pod or node would live on in a cache fed by it. Here a
re-list *replaces* the store and reports every key it no longer holds as DELETED.

The loop: list (paged, a consistent read), then watch from the list's resourceVersion with bookmarks;
a watch that ends or breaks resumes from the last resourceVersion seen; `410 Gone` (the version was
compacted away, e.g. after a long API-server outage) or any other failure to resume means a fresh
list. Objects are stored as read-only dicts (never mutate them); `transform` drops what nobody reads
(managedFields) before they are stored, to bound memory.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter

log = logging.getLogger(__name__)
Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); "" for cluster-scoped
# (event type "ADDED" | "MODIFIED" | "DELETED", old object or None, new object or None); runs on the
# informer's thread, so it must be quick and thread-safe (the operator hands it to the event loop).
Handler = Callable[[str, Obj | None, Obj | None], None]

LISTS = Counter("rtj_informer_lists_total", "Full (re-)lists of a watched resource", ["resource"])
WATCH_EVENTS = Counter("rtj_informer_events_total", "Watch events received", ["resource", "type"])
PAGE_SIZE = 500
WATCH_SECONDS = 300  # the server ends a watch after this (randomised up to 2x, as client-go does)
BACKOFF_MAX = 5.0


class Expired(Exception):
    """The resourceVersion we watch from is gone: only a fresh list can continue."""


def key_of(obj: Obj) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


def strip_managed_fields(obj: Obj) -> Obj:
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


def _resource_version(obj: Obj) -> int:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return -1


class Informer:
    """One resource's store, kept current by a thread; read it with `get`, `by_index` and `items`."""

    def __init__(self, name: str, list_call: Callable[..., Any], *, label_selector: str | None = None,
                 index: Callable[[Obj], Hashable | None] | None = None, transform: Callable[[Obj], Obj] | None = None,
                 handler: Handler | None = None, on_recover: Callable[[], None] | None = None) -> None:
        self.name = name
        self._list_call = list_call  # a client list function bound to its scope (namespace, group...)
        self._selector = label_selector
        self._index_fn = index
        self._transform = transform or strip_managed_fields
        self._handler = handler
        self._on_recover = on_recover  # called when a broken watch is current again
        self._lock = threading.Lock()
        self._store: dict[Key, Obj] = {}
        self._index: dict[Hashable, dict[Key, Obj]] = {}
        self._rv = ""
        self.synced = threading.Event()
        self.watching = threading.Event()  # the store is current: listed, and the watch is up or resuming
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # reads ------------------------------------------------------------------------------------
    def get(self, key: Key) -> Obj | None:
        with self._lock:
            return self._store.get(key)

    def by_index(self, value: Hashable) -> list[Obj]:
        with self._lock:
            return list(self._index.get(value, {}).values())

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._store.values())

    def __len__(self) -> int:
        return len(self._store)

    def store_if_newer(self, obj: Obj) -> None:
        """Write-through of an object our own write returned, so the next read is not stale (no event)."""
        obj = self._transform(obj)
        key = key_of(obj)
        with self._lock:
            old = self._store.get(key)
            if old is not None and _resource_version(obj) > _resource_version(old):
                self._put(key, old, obj)

    # the loop -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff = 0.2
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self.relist()
                    need_list = False
                self._watch()
                backoff = 0.2
            except Expired:
                log.info("%s: watch expired at resourceVersion %s; re-listing", self.name, self._rv)
                self.watching.clear()
                need_list = True
            except Exception as exc:  # the API server is down or restarting: back off, resume, re-list if needed
                self.watching.clear()
                log.warning("%s: %s: %s; retrying in %.1fs", self.name, "list" if need_list else "watch",
                            exc.__class__.__name__, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    def _call(self, **kwargs: Any) -> Any:
        if self._selector:
            kwargs["label_selector"] = self._selector
        return self._list_call(_preload_content=False, **kwargs)

    def relist(self) -> None:
        """Replace the store with a fresh list; report what changed, and what vanished as DELETED."""
        fresh: dict[Key, Obj] = {}
        cont: str | None = None
        rv = ""
        while True:
            try:
                resp = self._call(limit=PAGE_SIZE, **({"_continue": cont} if cont else {}),
                                  _request_timeout=(10, 60))
            except ApiException as exc:
                if exc.status == 410 and cont:  # the continue token expired mid-list: start over
                    fresh, cont = {}, None
                    continue
                raise
            page = json.loads(resp.data)
            for item in page.get("items") or []:
                obj = self._transform(item)
                fresh[key_of(obj)] = obj
            rv = page["metadata"].get("resourceVersion", rv)
            cont = page["metadata"].get("continue")
            if not cont:
                break
        LISTS.labels(resource=self.name).inc()
        with self._lock:
            old_store = self._store
            self._store, self._index = {}, {}
            changes: list[tuple[str, Obj | None, Obj | None]] = []
            for key, obj in fresh.items():
                self._put(key, None, obj)
                old = old_store.get(key)
                if old is None:
                    changes.append(("ADDED", None, obj))
                elif old["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                    changes.append(("MODIFIED", old, obj))
            changes.extend(("DELETED", old, None) for key, old in old_store.items() if key not in fresh)
            self._rv = rv
        log.info("%s: listed %d objects at resourceVersion %s (%d changes)", self.name, len(fresh), rv, len(changes))
        for change in changes:
            self._emit(*change)
        self._current()
        self.synced.set()

    def _watch(self) -> None:
        timeout = int(WATCH_SECONDS * (1 + random.random()))
        resp = self._call(watch=True, resource_version=self._rv, allow_watch_bookmarks=True,
                          timeout_seconds=timeout, _request_timeout=(10, timeout + 30))
        self._current()
        try:
            for line in _lines(resp):
                if self._stop.is_set():
                    return
                event = json.loads(line)
                etype, obj = event.get("type"), event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if etype == "BOOKMARK":
                    self._rv = rv or self._rv
                    continue
                WATCH_EVENTS.labels(resource=self.name, type=etype).inc()
                obj = self._transform(obj)
                key = key_of(obj)
                with self._lock:
                    old = self._store.get(key)
                    if etype == "DELETED":
                        self._drop(key, old)
                    else:
                        self._put(key, old, obj)
                    self._rv = rv or self._rv
                self._emit(etype, old, None if etype == "DELETED" else obj)
        except ApiException as exc:
            if exc.status == 410:
                raise Expired from None
            raise
        finally:
            resp.release_conn()

    def _current(self) -> None:
        if not self.watching.is_set():
            self.watching.set()
            if self.synced.is_set() and self._on_recover is not None:
                self._on_recover()

    # store internals (called with the lock held) ------------------------------------------------
    def _put(self, key: Key, old: Obj | None, obj: Obj) -> None:
        if old is not None:
            self._unindex(key, old)
        self._store[key] = obj
        if self._index_fn is not None and (value := self._index_fn(obj)) is not None:
            self._index.setdefault(value, {})[key] = obj

    def _drop(self, key: Key, old: Obj | None) -> None:
        self._store.pop(key, None)
        if old is not None:
            self._unindex(key, old)

    def _unindex(self, key: Key, old: Obj) -> None:
        if self._index_fn is not None and (value := self._index_fn(old)) is not None:
            bucket = self._index.get(value)
            if bucket is not None:
                bucket.pop(key, None)
                if not bucket:
                    del self._index[value]

    def _emit(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        if self._handler is None:
            return
        try:
            self._handler(etype, old, new)
        except Exception:
            log.exception("%s: event handler failed", self.name)


def _lines(resp: Any) -> Iterator[str]:
    """Newline-delimited JSON from a streaming response (a watch)."""
    buf = b""
    for chunk in resp.stream(64 * 1024, decode_content=False):
        parts = (buf + chunk).split(b"\n")
        buf = parts.pop()
        for line in parts:
            if line.strip():
                yield line.decode()
    if buf.strip():
        yield buf.decode()


def wait_all_synced(informers: list[Informer], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    return all(inf.synced.wait(max(deadline - time.monotonic(), 0)) for inf in informers)
