"""Leader election on one coordination.k8s.io/v1 Lease, with client-go's semantics (two or more replicas).

Only the leader reconciles and writes; a standby keeps its informers warm (handlers.py), so a takeover
does not relist the world. The rules, as client-go's `leaderelection` package has them:

- **Acquire** a Lease that does not exist (create), that names nobody (released), or that this process has
  seen unchanged for its `leaseDurationSeconds`, timed by *this process's own monotonic clock* from the
  moment it last saw the Lease's resourceVersion change (client-go's `observedTime`). The renewTime a
  holder wrote is never compared with our clock: another machine's clock may be off by any amount.
- **Renew** every `retry period`, an update guarded by the resourceVersion we read (a concurrent writer
  makes ours fail with 409, never both succeed).
- **Step down** when a renewal has not succeeded for the `renew deadline` (< lease duration): the leader
  stops writing at once (`ensure()` fails, checked before every write) and the process exits, so the
  container restarts as a standby with fresh memory. A leader frozen past its lease (SIGSTOP, a VM pause)
  thaws with its monotonic clock past the deadline: it writes nothing and exits without trying to renew.
  Because the deadline is counted from when the successful renewal was *sent*, and a standby counts the
  lease duration from when it *saw* that renewal, the leader stops at least `lease - renew deadline`
  (5 s with the defaults) before anyone may take over, given clocks that run at about the same rate.
- On a graceful stop (SIGTERM: a rolling update, a drain) the leader releases the Lease (holder emptied),
  so a standby takes over within one retry period instead of a lease duration.

holderIdentity is the pod's name: a restarted container of the same pod (its previous process is dead:
the kubelet restarts a container only after it exited) takes its own Lease back at once, as client-go's
elector does with its own identity. Deployment pod names are never reused.

**Why not kopf's peering.** kopf's peering (a `KopfPeering` object where each operator posts a priority
and a lifetime) pauses the lower-priority operators while a higher one is alive: it is not an election.
Two peers of equal priority both run (kopf only warns), a peer's liveness is judged by comparing the
`lastseen` timestamps other machines wrote with our own clock, there is no fencing (a paused or
partitioned "leader" keeps writing until it notices), it needs a cluster-wide CRD and the RBAC for it,
and kopf would pause its own processing, not our informers and work queue. A Lease is what
kube-controller-manager, JobSet, Kueue and the Trainer use, and what a platform team already monitors.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from resilient_operator import metrics

log = logging.getLogger(__name__)


class NotLeader(Exception):
    """This process does not (or no longer) hold the Lease: it must not write."""


class Action(enum.Enum):
    CREATE = "create"  # no Lease exists: create it naming us
    ACQUIRE = "acquire"  # take the Lease over (expired by our clock, released, or already ours)
    RENEW = "renew"  # we lead: renew it
    WAIT = "wait"  # another holds a Lease that is still valid by our clock
    STEP_DOWN = "step-down"  # we led and cannot go on: stop writing, exit


@dataclass(frozen=True)
class Timings:
    lease_duration: float = 15.0  # how long a standby waits, after it last saw the Lease change, to take it
    renew_deadline: float = 10.0  # how long a leader keeps leading without a successful renewal
    retry_period: float = 2.0  # between tries (acquire or renew)

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs 0 < retry period < renew deadline < lease duration "
                             f"(got {self.retry_period}, {self.renew_deadline}, {self.lease_duration})")


@dataclass(frozen=True)
class Record:
    """What a Lease says (spec), plus the resourceVersion our update is guarded by."""

    holder: str
    lease_duration: float | None
    resource_version: str
    transitions: int = 0


def decide(record: Record | None, observed_at: float | None, now: float, me: str, last_renew: float | None,
           timings: Timings) -> Action:
    """The whole election rule, pure. `record`: the Lease as last read (None: it does not exist);
    `observed_at`: our monotonic time when we first saw its current resourceVersion; `now`: our monotonic
    time; `last_renew`: when our last successful acquire/renew was sent (None: we are not leading)."""
    leading = last_renew is not None
    if last_renew is not None and now - last_renew >= timings.renew_deadline:
        return Action.STEP_DOWN  # too late to renew safely: someone may be about to take it
    if record is None:
        return Action.STEP_DOWN if leading else Action.CREATE
    if record.holder == me:
        return Action.RENEW if leading else Action.ACQUIRE
    if leading:
        return Action.STEP_DOWN  # the Lease names another: it was taken (or released by an admin)
    if not record.holder:
        return Action.ACQUIRE
    duration = record.lease_duration if record.lease_duration and record.lease_duration > 0 \
        else timings.lease_duration
    if observed_at is None or now - observed_at >= duration:
        return Action.ACQUIRE
    return Action.WAIT


def record_of(lease: dict[str, Any]) -> Record:
    spec = lease.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    transitions = spec.get("leaseTransitions")
    return Record(holder=str(spec.get("holderIdentity") or ""),
                  lease_duration=float(duration) if isinstance(duration, int) else None,
                  resource_version=str(lease["metadata"].get("resourceVersion") or ""),
                  transitions=transitions if isinstance(transitions, int) else 0)


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # MicroTime (informational only)


class LeaseAPI(Protocol):
    """The three calls the elector makes; kube.Kube provides them (the only module calling the API).
    create and replace return the Lease written, or None when another writer won (409)."""

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None: ...

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any] | None: ...


class Elector:
    """Runs the election in its own thread (independent of the event loop and the reconciles)."""

    def __init__(self, api: LeaseAPI, namespace: str, name: str, identity: str, timings: Timings,
                 on_lead: Callable[[], object] = lambda: None,
                 on_lose: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.timings = timings
        self._on_lead = on_lead
        self._on_lose = on_lose or _exit
        self._clock = clock
        self._record: Record | None = None
        self._observed_at: float | None = None
        self._last_renew: float | None = None  # monotonic time our last successful write was sent
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.leading = threading.Event()
        metrics.LEADER.set(0)

    # ---- what the rest of the operator asks --------------------------------------------------------
    def holding(self) -> bool:
        """Do we hold the Lease, by our own clock (a successful renewal within the renew deadline)?"""
        with self._lock:
            last = self._last_renew
        return last is not None and self._clock() - last < self.timings.renew_deadline

    def ensure(self) -> None:
        """Raise NotLeader unless we hold the Lease: called before every write."""
        if not self.holding():
            raise NotLeader(f"{self.identity} does not hold Lease {self.namespace}/{self.name}")

    # ---- the loop ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        """Stop the loop; a leader releases the Lease (a standby then takes over within a retry period)."""
        self._stop.set()
        if release and self.holding():
            self._release()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # an API error: try again next period (the deadline bounds a leader)
                log.exception("leader election: Lease %s/%s", self.namespace, self.name)
            if self._stop.is_set():
                return
            self._stop.wait(self.next_wait())

    def next_wait(self) -> float:
        """A retry period; a standby wakes exactly when another's Lease expires by its clock, if that is
        sooner (takeover at the lease duration, not up to a retry period after it)."""
        record, observed_at = self._record, self._observed_at
        if self._last_renew is None and record is not None and record.holder and record.holder != self.identity \
                and observed_at is not None:
            duration = record.lease_duration if record.lease_duration and record.lease_duration > 0 \
                else self.timings.lease_duration
            remaining = observed_at + duration - self._clock()
            if remaining > 0:
                return min(self.timings.retry_period, remaining + 0.01)
        return self.timings.retry_period

    def _observe(self, lease: dict[str, Any] | None) -> None:
        record = record_of(lease) if lease is not None else None
        if record is None or self._record is None or record.resource_version != self._record.resource_version:
            self._observed_at = self._clock()
        self._record = record

    def step(self) -> Action:
        """One round: decide from what we know (a leader frozen past its deadline exits before any call),
        read the Lease, decide again, act."""
        with self._lock:
            last = self._last_renew
        if decide(self._record, self._observed_at, self._clock(), self.identity, last,
                  self.timings) is Action.STEP_DOWN:
            self._lose("no successful renewal within the renew deadline")
            return Action.STEP_DOWN
        self._observe(self.api.get_lease(self.namespace, self.name))
        now = self._clock()
        action = decide(self._record, self._observed_at, now, self.identity, last, self.timings)
        if action is Action.STEP_DOWN:
            self._lose(f"the Lease now names {self._record.holder if self._record else 'nobody (deleted)'}")
        elif action is Action.CREATE:
            self._write(lambda body: self.api.create_lease(self.namespace, body), acquire=True)
        elif action in (Action.ACQUIRE, Action.RENEW):
            self._write(lambda body: self.api.replace_lease(self.namespace, self.name, body),
                        acquire=action is Action.ACQUIRE)
        return action

    def _body(self, acquire: bool) -> dict[str, Any]:
        now = _micro_time()
        old = self._record
        spec: dict[str, Any] = {"holderIdentity": self.identity,
                                "leaseDurationSeconds": int(self.timings.lease_duration), "renewTime": now}
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if old is not None:
            meta["resourceVersion"] = old.resource_version  # the guard: a concurrent writer wins, not both
        taking_over = old is None or old.holder != self.identity
        spec["leaseTransitions"] = (old.transitions if old else 0) + (1 if taking_over and old is not None else 0)
        if acquire:
            spec["acquireTime"] = now
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def _write(self, call: Callable[[dict[str, Any]], dict[str, Any] | None], acquire: bool) -> None:
        if acquire and self._record is not None and self._record.holder == self.identity:
            # our own Lease (a restarted container): keep its acquireTime, as a renewal does
            acquire = False
        sent = self._clock()
        written = call(self._body(acquire))
        if written is None:  # 409: someone else wrote first; read again next round
            return
        self._observe(written)
        with self._lock:
            was = self._last_renew is not None
            self._last_renew = sent
        if not was:
            log.warning("%s is the leader now (Lease %s/%s)", self.identity, self.namespace, self.name)
            metrics.LEADER.set(1)
            self.leading.set()
            self._on_lead()

    def _release(self) -> None:
        record = self._record
        if record is None or record.holder != self.identity:
            return
        meta = {"name": self.name, "namespace": self.namespace, "resourceVersion": record.resource_version}
        spec = {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _micro_time(),
                "leaseTransitions": record.transitions}
        body: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                                "spec": spec}
        with self._lock:
            self._last_renew = None  # stop writing before the Lease can be taken
        metrics.LEADER.set(0)
        try:
            if self.api.replace_lease(self.namespace, self.name, body) is None:  # our own renewal raced it
                self._observe(self.api.get_lease(self.namespace, self.name))
                if self._record is None or self._record.holder != self.identity:
                    return
                meta["resourceVersion"] = self._record.resource_version
                if self.api.replace_lease(self.namespace, self.name, body) is None:
                    log.warning("could not release the Lease %s/%s: it changed", self.namespace, self.name)
                    return
            log.warning("%s released the Lease %s/%s", self.identity, self.namespace, self.name)
        except Exception as exc:
            log.warning("could not release the Lease %s/%s: %s", self.namespace, self.name, exc)

    def _lose(self, why: str) -> None:
        with self._lock:
            self._last_renew = None
        metrics.LEADER.set(0)
        log.error("%s lost the leadership (%s): stopping; the container restarts as a standby", self.identity, why)
        self._stop.set()
        self._on_lose()


def _exit() -> None:
    """client-go's callers exit on OnStoppedLeading; so do we, at once (no cleanup may write)."""
    logging.shutdown()
    os._exit(1)


def timings_from_environ(env: dict[str, str] | None = None) -> Timings:
    env = dict(os.environ if env is None else env)

    def seconds(name: str, default: float) -> float:
        raw = env.get(name, "").strip()
        return float(raw) if raw else default

    return Timings(lease_duration=seconds("RTJ_LEASE_DURATION_SECONDS", 15.0),
                   renew_deadline=seconds("RTJ_RENEW_DEADLINE_SECONDS", 10.0),
                   retry_period=seconds("RTJ_RETRY_PERIOD_SECONDS", 2.0))
