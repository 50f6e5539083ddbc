"""Hand kept pods their next attempt's plan (in-place restarts), off the reconcile, each call bounded.

The core emits `core.plan.Delivery`s; `Deliverer.submit` queues them and returns at once. A small pool of
threads then, per delivery: checks that this replica still leads (`kube.write_guard`: a standby never
steers an agent), POSTs the signed plan to the agent (`resilient_contract.plan`: `POST /plan`), and on its
200 merge-patches the pod's labels and annotations (the pod joins the new attempt). Everything an agent
does is a tenant's: a refusal, a timeout, a refused connection or a nonsense answer is logged and counted
(`rtj_plan_deliveries_total{result}`), never raised; the core notices what did not happen (the labels did
not change) and falls back by its own clock. An answer that cannot change however often the plan is sent (a
refused connection: no agent listens; a 403, 409 or 4xx/5xx; a nonsense answer) is also kept for the core
(`failed`), which replaces that pod at once instead of waiting out the acknowledgement bound: a pod that runs
no agent costs a recovery one reconcile, not 20 s. Only a timeout is left to the clock (an agent may still be
stopping its workers, and the resend answers 200 once it has).

Bounds: each POST takes at most `timeout` seconds from the connect to the last byte read, whatever the
agent does (a socket timeout bounds each read; a watchdog shuts the socket at the deadline, so an answer
dripped a byte at a time cannot hold a thread), and at most `workers` are in flight. A delivery already
queued or in flight for the same (namespace, pod, pod uid, attempt) is not queued again; one that failed is
sent again when the core asks again, but not more than once a second.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import Counter, Histogram

from resilient_contract import plan as agent_plan
from resilient_operator import constants as c
from resilient_operator.core.plan import Delivery
from resilient_operator.leader import NotLeader

log = logging.getLogger(__name__)

DELIVERIES = Counter("rtj_plan_deliveries", "In-place plans sent to agents, by result", ["result"])
ACKNOWLEDGED_SECONDS = Histogram(
    "rtj_plan_delivery_seconds", "From the reconcile's submit to the agent's 200 (workers stopped and restarted)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30))

# results (the counter's label values; the core's fallback messages name them too: constants.DELIVERY_*)
ACKNOWLEDGED = c.DELIVERY_ACKNOWLEDGED  # 200 from the agent and the pod relabelled
REFUSED = c.DELIVERY_REFUSED  # 403: not the operator's signature, or not this pod's / job's plan (e.g. an old key)
STALE = c.DELIVERY_STALE  # 409: the agent runs a newer attempt
MALFORMED = c.DELIVERY_MALFORMED  # 400
HTTP_ERROR = c.DELIVERY_HTTP_ERROR  # any other status
BAD_ANSWER = c.DELIVERY_BAD_ANSWER  # a 200 that does not say this attempt started, or no HTTP at all
TIMEOUT = c.DELIVERY_TIMEOUT
UNREACHABLE = c.DELIVERY_UNREACHABLE  # connection refused or reset, no route
BAD_ADDRESS = c.DELIVERY_BAD_ADDRESS  # not an IP literal: never resolved (a DNS lookup has no bound)
NOT_LEADER = "not_leader"  # this replica does not lead: nothing was sent
POD_GONE = "pod_gone"  # acknowledged, but the pod (that uid) is gone: not relabelled
PATCH_FAILED = "patch_failed"  # acknowledged, but the relabel failed (API error): sent again when asked
ERROR = "error"  # a bug in this module (logged with its traceback)
# Sent again, the same plan gets the same answer: the core need not wait for an acknowledgement from this pod.
DEFINITIVE = frozenset({REFUSED, STALE, MALFORMED, HTTP_ERROR, BAD_ANSWER, UNREACHABLE, BAD_ADDRESS})

RESEND_SECONDS = 1.0
# A lost SYN costs TCP's own backoff (resent after 1 s, then 3 s, then 7 s): past a 5 s bound that is a timeout
# and a resend seconds later. The connect is tried afresh every CONNECT_TRY_SECONDS instead, within the bound.
CONNECT_TRY_SECONDS = 0.5
MAX_ANSWER_BYTES = 16 * 1024  # status line, headers and body together: an agent's answer is ~200 bytes
FORGET_SECONDS = 600.0  # how long a sent delivery is remembered (each (pod, attempt) is asked for briefly)

Key = tuple[str, str, str, int]  # namespace, pod, pod uid, attempt


class PodWriter(Protocol):
    """The one API write a delivery makes (kube.Kube), behind the leader check every write passes."""

    def write_guard(self) -> None: ...

    def patch_pod_metadata(self, namespace: str, name: str, uid: str, labels: Mapping[str, str],
                           annotations: Mapping[str, str]) -> bool: ...


@dataclass(frozen=True)
class Outcome:
    """What became of one delivery; `seconds` runs from its submit to its end (for the benches and tests)."""

    namespace: str
    pod: str
    attempt: int
    result: str
    seconds: float


@dataclass
class _Sent:
    at: float  # when it was last queued
    done: bool = False  # acknowledged and relabelled: never sent again
    running: bool = True  # queued or in flight


class Deliverer:
    """Send the core's deliveries from a bounded pool; see the module docstring."""

    def __init__(self, kube: PodWriter, private_key: bytes, workers: int = 64, timeout: float = 5.0,
                 on_outcome: Callable[[Outcome], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._kube, self._key, self._timeout = kube, private_key, timeout
        self._on_outcome, self._clock = on_outcome, clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="plan-delivery")
        self._lock = threading.Lock()
        self._sent: dict[Key, _Sent] = {}
        self._failed: dict[Key, str] = {}  # the last answer for a key, when DEFINITIVE
        self._pruned = clock()
        self._watchdog = _Watchdog()
        self._closed = False

    def submit(self, namespace: str, deliveries: Iterable[Delivery]) -> int:
        """Queue the deliveries not already queued, in flight, done, or tried within the last second; returns at
        once with how many were queued."""
        now = self._clock()
        queued = 0
        with self._lock:
            if self._closed:  # shutting down: the next leader's reconcile asks again
                return 0
            self._prune(now)
            for d in deliveries:
                key = (namespace, d.pod, d.plan.pod_uid, d.plan.attempt)
                sent = self._sent.get(key)
                if sent is not None and (sent.running or sent.done or now - sent.at < RESEND_SECONDS):
                    continue
                self._sent[key] = _Sent(at=now)
                self._pool.submit(self._run, namespace, d, key, now)
                queued += 1
        return queued

    def failed(self, namespace: str, attempt: int) -> dict[str, str]:
        """Pod uid -> result for `attempt`'s plans in `namespace` whose last answer was DEFINITIVE (uids are
        unique, so the caller takes the ones of its own pods)."""
        with self._lock:
            return {key[2]: result for key, result in self._failed.items()
                    if key[0] == namespace and key[3] == attempt}

    def close(self) -> None:
        """Drop what is queued; what is in flight ends within its timeout."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._watchdog.stop()

    def _prune(self, now: float) -> None:
        if now - self._pruned < 60:
            return
        self._pruned = now
        for key in [k for k, s in self._sent.items() if not s.running and now - s.at > FORGET_SECONDS]:
            del self._sent[key]
            self._failed.pop(key, None)

    def _run(self, namespace: str, d: Delivery, key: Key, submitted: float) -> None:
        result = UNREACHABLE
        try:
            result = self._deliver(namespace, d, submitted)
        except Exception:  # a bug here must not kill the pool's thread silently
            log.exception("plan delivery to %s/%s (attempt %d) failed", namespace, d.pod, d.plan.attempt)
            result = ERROR
        finally:
            seconds = self._clock() - submitted
            with self._lock:
                sent = self._sent.get(key)
                if sent is not None:
                    sent.running, sent.done = False, result == ACKNOWLEDGED
                    if result in DEFINITIVE:
                        self._failed[key] = result
                    else:
                        self._failed.pop(key, None)
            DELIVERIES.labels(result=result).inc()
            level = logging.DEBUG if result == ACKNOWLEDGED else logging.INFO
            log.log(level, "plan for %s/%s (attempt %d, rank %d): %s after %.2fs", namespace, d.pod,
                    d.plan.attempt, d.plan.node_rank, result, seconds)
            if self._on_outcome is not None:
                try:
                    self._on_outcome(Outcome(namespace, d.pod, d.plan.attempt, result, seconds))
                except Exception:
                    log.exception("plan delivery outcome hook failed")

    def _deliver(self, namespace: str, d: Delivery, submitted: float) -> str:
        try:
            self._kube.write_guard()
        except NotLeader:
            return NOT_LEADER
        try:
            ipaddress.ip_address(d.address)
        except ValueError:
            return BAD_ADDRESS
        status, answer = self._post(d.address, d.port, agent_plan.sign(d.plan, self._key))
        if isinstance(status, str):
            return status
        if status != 200:
            return {403: REFUSED, 409: STALE, 400: MALFORMED}.get(status, HTTP_ERROR)
        if not _started(answer, d.plan.attempt):
            return BAD_ANSWER
        ACKNOWLEDGED_SECONDS.observe(self._clock() - submitted)
        try:
            relabelled = self._kube.patch_pod_metadata(namespace, d.pod, d.plan.pod_uid, d.labels, d.annotations)
        except NotLeader:
            return NOT_LEADER
        except Exception as exc:
            log.warning("pod %s/%s acknowledged attempt %d but could not be relabelled: %s", namespace, d.pod,
                        d.plan.attempt, exc)
            return PATCH_FAILED
        return ACKNOWLEDGED if relabelled else POD_GONE

    def _post(self, address: str, port: int, body: bytes) -> tuple[int | str, bytes]:
        """(HTTP status, the answer's body), or (a result, b"") when no answer came or it was over
        MAX_ANSWER_BYTES."""
        deadline = time.monotonic() + self._timeout
        conn = _Connection(address, port, timeout=self._timeout)
        alarm: _Alarm | None = None
        try:
            tries = 0
            while True:  # each try bounded by CONNECT_TRY_SECONDS, all of them by the deadline
                tries += 1
                conn.timeout = max(0.01, min(CONNECT_TRY_SECONDS, deadline - time.monotonic()))
                try:
                    conn.connect()
                    break
                except TimeoutError:
                    conn.close()
                    if time.monotonic() >= deadline:
                        raise
            if tries > 1:
                log.debug("connected to %s:%d at the %d. try", address, port, tries)
            assert conn.sock is not None
            conn.sock.settimeout(max(0.01, deadline - time.monotonic()))
            with self._watchdog.guard(conn.sock, deadline) as alarm:
                conn.request("POST", agent_plan.PATH, body, {"Content-Type": "application/json",
                                                             "Connection": "close"})
                response = conn.getresponse()
                return response.status, response.read(MAX_ANSWER_BYTES)
        except TimeoutError:
            return TIMEOUT, b""
        except OSError:  # refused, reset, no route; or shut by the watchdog mid-answer
            return (TIMEOUT if alarm is not None and alarm.fired else UNREACHABLE), b""
        except http.client.HTTPException:  # not HTTP, or cut short by the watchdog
            return (TIMEOUT if alarm is not None and alarm.fired else BAD_ANSWER), b""
        finally:
            conn.close()


class _Budget(io.RawIOBase):
    """The answer as a stream that ends after MAX_ANSWER_BYTES: http.client would otherwise read 100 header
    lines of 64 KiB each from a hostile agent, per delivery in flight."""

    def __init__(self, fp: Any) -> None:
        super().__init__()
        self.fp, self.left = fp, MAX_ANSWER_BYTES

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.left <= 0:
            return 0  # an early end: http.client raises (IncompleteRead, RemoteDisconnected): BAD_ANSWER
        n = int(self.fp.readinto1(memoryview(buffer)[: self.left]))
        self.left -= n
        return n

    def close(self) -> None:
        self.fp.close()  # the socket's own reader: closing it lets the socket close
        super().close()


class _Response(http.client.HTTPResponse):
    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp = io.BufferedReader(_Budget(self.fp), 4096)


class _Connection(http.client.HTTPConnection):
    response_class = _Response


def _started(answer: bytes, attempt: int) -> bool:
    """Does the agent's 200 say this attempt's workers started (`{"attempt": N, "state": "started"}`)?"""
    try:
        raw = json.loads(answer)
    except ValueError:
        return False
    return isinstance(raw, dict) and raw.get("attempt") == attempt and raw.get("state") == agent_plan.STARTED


class _Alarm:
    fired = False


class _Watchdog:
    """Shuts a socket down at its deadline. A socket timeout bounds each read, not the whole answer: an agent
    dripping a byte per second would hold a delivery thread for as long as it liked. One thread for all."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, socket.socket, _Alarm]] = {}
        self._next = 0
        self._stopped = False
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def guard(self, sock: socket.socket, deadline: float) -> Iterator[_Alarm]:
        alarm = _Alarm()
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="plan-delivery-watchdog", daemon=True)
                self._thread.start()
            token = self._next
            self._next += 1
            self._armed[token] = (deadline, sock, alarm)
            self._cond.notify()
        try:
            yield alarm
        finally:
            with self._cond:  # removed before the caller closes it: never shut down a reused descriptor
                self._armed.pop(token, None)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _loop(self) -> None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                for token, (deadline, sock, alarm) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[token]
                        alarm.fired = True
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                wait = min((d for d, _, _ in self._armed.values()), default=now + 60) - now
                self._cond.wait(max(wait, 0.01))
