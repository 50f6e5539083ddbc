"""Checkpoint discovery in a sandbox: worker processes with resource limits and a wall-clock deadline.

Checkpoint roots are written by user pods, so `storage.discover` never runs in the operator's address
space. A small pool of workers, each a fresh interpreter (`python -P -m resilient_operator.discovery`,
exec'd, never a fork of the threaded operator) that imports only the torch-free contracts, sets its
own RLIMIT_AS (memory), RLIMIT_CPU (per call), RLIMIT_CORE and RLIMIT_FSIZE (zero), then serves one
request at a time over its stdin/stdout as JSON lines. The answer is a plain-data `Listing`
(`Listing.to_dict`): no pickle crosses the boundary, and the operator reads at most 1 MiB of it.

A call that overruns its deadline gets `DiscoveryTimedOut`, and its worker is killed and replaced; a
worker that dies (CPU limit, OOM kill) gives `DiscoveryFailed`. Either way the root is not tried again
for a cooldown (six deadlines) and the same answer is returned at once, so a handful of hostile jobs
cannot keep every worker busy: a healthy job waits at most one deadline for a free worker.

Fair across tenants (issue 25): workers are handed out round-robin across namespaces, and one namespace
never holds more than `workers - 1` of them at once (all of them in a one-worker pool), so a noisy
namespace's queue never stands in front of another's. Every root is charged for the time its call took:
one that cost more than CHARGE_MIN_SECONDS answers from that call again for CHARGE_FACTOR times as long
(no worker used), however the call ended. Negative verdicts on a `.metadata` are remembered by the same
identity as positive ones (storage/completeness.py), so an unchanged costly-to-reject file is parsed once. A
replacement is started as soon as its predecessor is gone, so its start-up overlaps the wait for it. Start-up is never
blamed on a root: a call whose worker is still starting (a loaded node), like one that found every worker
busy, answers `DiscoveryBusy`, holds nothing back, and the reconcile simply asks again soon.

A worker says when it is ready (`READY`); `warm` (at operator start) waits for that outside any call, and
with object-store areas configured a worker also loads the S3 client before it is ready. An `s3://` root
is matched to one of its namespace's areas lexically, here, before any request; that area's read-only
keys are read from the mounted Secret at each call and sent on the worker's stdin (never its command
line), and an error the store echoes is redacted before it leaves the worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import queue
import re
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from resilient_contract import dcp_metadata, progress, storage
from resilient_contract.storage import errors, roots, s3
from resilient_contract.storage.listing import Listing, Verdict
from resilient_contract.storage.names import parse_step_dir
from resilient_contract.storage.s3 import S3Credentials
from resilient_operator.settings import DiscoverySettings, SettingsError

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 1 << 20
MAX_REQUEST_BYTES = 1 << 16
MAX_ROOT_CHARS = 4096
RECYCLE_RSS_BYTES = 128 * 1024 * 1024  # a worker that still holds this much is replaced after answering
COOLDOWN_DEADLINES = 6  # a root that timed out or killed its worker is not retried for this many deadlines
MAX_COOLDOWN_ENTRIES = 4096
STARTUP_SECONDS = 60.0  # `warm`'s bound on start-up (an interpreter; with object-store areas, the S3 client too)
READY = b'{"ready": true}'  # a worker's first line, once it is ready to serve
MAX_REPORTED_PODS = 512  # progress reports read per call (each at most progress.MAX_REPORT_BYTES)
MAX_REFUSED = 16  # step directories a request may refuse (status.badCheckpoints holds no more)
_POD_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?", re.ASCII)
THREAD_STACK_BYTES = 1 << 20  # the S3 client's threads' stacks (8 MiB by default, counted by RLIMIT_AS)
CHARGE_MIN_SECONDS = 0.25  # a call that took longer charges its root (a cheap answer charges nothing)
CHARGE_FACTOR = 4.0  # ... with this many times its cost during which the root answers from that call


class FairSlots:
    """`n` worker slots handed out round-robin across namespaces, at most `per_namespace` to one at a time.

    A waiter is served when a slot is free, its namespace is under the cap, and it is the first waiter of
    the first eligible namespace in turn order; a namespace served goes to the back of the turn."""

    def __init__(self, n: int, per_namespace: int) -> None:
        self.free = n
        self.per_namespace = max(1, per_namespace)
        self._cond = threading.Condition()
        self._waiting: dict[str, list[object]] = {}  # namespace -> its waiters, first come first
        self._turn: list[str] = []  # namespaces with waiters, the next to be served first
        self.busy: dict[str, int] = {}  # namespace -> slots it holds

    def _next(self) -> object | None:
        if self.free <= 0:
            return None
        for ns in self._turn:
            if self.busy.get(ns, 0) < self.per_namespace:
                return self._waiting[ns][0]
        return None

    def _leave(self, ns: str, token: object) -> None:
        queue_ = self._waiting[ns]
        queue_.remove(token)
        if not queue_:
            del self._waiting[ns]
            self._turn.remove(ns)

    def acquire(self, ns: str, timeout: float) -> bool:
        token = object()
        deadline = time.monotonic() + timeout
        with self._cond:
            if ns not in self._waiting:
                self._waiting[ns] = []
                self._turn.append(ns)
            self._waiting[ns].append(token)
            while self._next() is not token:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._leave(ns, token)
                    self._cond.notify_all()  # the next waiter may be eligible now
                    return False
                self._cond.wait(left)
            self._leave(ns, token)
            if ns in self._turn:  # its other waiters queue behind every other namespace's
                self._turn.remove(ns)
                self._turn.append(ns)
            self.free -= 1
            self.busy[ns] = self.busy.get(ns, 0) + 1
            self._cond.notify_all()
            return True

    def release(self, ns: str) -> None:
        with self._cond:
            self.free += 1
            self.busy[ns] -= 1
            if not self.busy[ns]:
                del self.busy[ns]
            self._cond.notify_all()


def _failed(root: str, reason: str, message: str) -> Listing:
    return Listing(root, None, (), message, reason=reason)


@dataclass
class _Worker:
    proc: subprocess.Popen[bytes]
    calls: int = 0
    ready: bool = False  # its start-up line was read: start-up (imports) never counts against a call's deadline


@dataclass
class DiscoveryPool:
    """Runs `storage.discover` for (root, namespace) in sandboxed workers; thread-safe; never raises."""

    config: DiscoverySettings
    prefix: tuple[str, ...] = ()  # a command to start workers under (e.g. setpriv dropping capabilities)
    _slots: queue.Queue[_Worker | None] = field(default_factory=queue.Queue, init=False)
    _cooldown: dict[tuple[str, str], tuple[float, Listing]] = field(default_factory=dict, init=False)
    _dying: list[subprocess.Popen[bytes]] = field(default_factory=list, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _fair: FairSlots = field(init=False)

    def __post_init__(self) -> None:
        workers = self.config.workers
        self._fair = FairSlots(workers, workers - 1 if workers > 1 else 1)
        for _ in range(workers):
            self._slots.put(None)  # spawned on first use

    # ---- the call ------------------------------------------------------------------------------
    def discover(self, root: str, namespace: str, job: str | None = None,
                 starts: Sequence[tuple[int, int | None]] = ()) -> Listing:
        return self.discover_with_reports(root, namespace, job, starts)[0]

    def discover_with_reports(self, root: str, namespace: str, job: str | None = None,
                              starts: Sequence[tuple[int, int | None]] = (), pods: Sequence[str] = (),
                              refused: Sequence[str] = ()) -> tuple[Listing, dict[str, progress.Report]]:
        """`discover`, plus the progress reports of `pods` (the job's own current pods), read by the same worker
        relative to the root's directory fd, following no link anywhere on the way (local roots only).
        `refused`: step directory names never to offer as the latest (status.badCheckpoints)."""
        reports: dict[str, progress.Report] = {}
        pods = [p for p in pods if isinstance(p, str) and _POD_NAME_RE.fullmatch(p)][:MAX_REPORTED_PODS]
        refused = [n for n in refused if isinstance(n, str) and parse_step_dir(n) is not None][:MAX_REFUSED]
        listing = self._discover(root, namespace, job, starts, pods, reports, refused)
        return listing, reports

    def _discover(self, root: str, namespace: str, job: str | None, starts: Sequence[tuple[int, int | None]],
                  pods: Sequence[str], reports: dict[str, progress.Report], refused: Sequence[str] = ()) -> Listing:
        """The root's Listing, within about one deadline (two if every worker was busy). With `job` (its uid)
        and `starts` (attempt, resumed step), directories a fenced attempt wrote are refused (lineage.py)."""
        if not isinstance(root, str) or len(root) > MAX_ROOT_CHARS:
            return _failed(str(root)[:200], errors.REASON_INVALID_ROOT, "checkpoint root is too long")
        s3: S3Credentials | None = None
        if roots.is_object_store(root):
            try:
                area, s3 = self._object_store(root, namespace)
            except errors.StorageError as exc:  # refused lexically, or the operator's keys are not mounted
                return _failed(root, exc.reason, str(exc))
        else:
            area = self.config.area_for(namespace)
        key = (root, area)
        timeout = self.config.timeout_seconds
        with self._lock:
            held = self._cooldown.get(key)
            if held and held[0] > time.monotonic():
                return held[1]
        if not self._fair.acquire(namespace, timeout):
            return _failed(root, errors.REASON_DISCOVERY_BUSY,
                           f"every checkpoint discovery worker this namespace may use stayed busy for {timeout:g} s "
                           "(other roots are slow); discovery will be retried")  # fmt: skip
        try:
            try:
                worker = self._slots.get(timeout=timeout)  # the fair gate counts these very slots: one is free
            except queue.Empty:  # only after close(): it took the workers away
                return _failed(root, errors.REASON_DISCOVERY_BUSY, "the checkpoint discovery pool is closed")
            used = [0.0]
            try:
                listing, worker = self._call(worker, root, area, job, starts, s3, used,
                                             pods=pods if s3 is None else (), reports=reports, refused=refused)
            finally:
                self._slots.put(worker)
        finally:
            self._fair.release(namespace)
        if listing.reason in (errors.REASON_DISCOVERY_TIMED_OUT, errors.REASON_DISCOVERY_FAILED):
            self._hold(key, listing)
        elif listing.reason != errors.REASON_DISCOVERY_BUSY and used[0] >= CHARGE_MIN_SECONDS:
            self._charge(key, listing, used[0])
        return listing

    def _charge(self, key: tuple[str, str], listing: Listing, seconds: float) -> None:
        """The root cost `seconds` of a worker: it answers from this call for CHARGE_FACTOR times as long."""
        with self._lock:
            self._trim(time.monotonic())
            self._cooldown[key] = (time.monotonic() + CHARGE_FACTOR * seconds, listing)

    def _object_store(self, root: str, namespace: str) -> tuple[str, S3Credentials]:
        """The namespace's object-store area holding `root` (lexically: no request) and the operator's keys for
        it, read from the mounted Secret now. Each request's timeout is a quarter of the deadline, so an
        endpoint that is down answers with the store's error before the worker would be killed."""
        areas = self.config.object_areas_for(namespace)
        uri = roots.object_area(root, [a.uri for a in areas])
        area = next(a for a in areas if a.uri == uri)
        try:
            return uri, area.credentials(self.config.object_secrets_dir, self.config.timeout_seconds / 4)
        except SettingsError as exc:
            raise errors.StorageError(str(exc)) from None

    def _hold(self, key: tuple[str, str], listing: Listing) -> None:
        pause = COOLDOWN_DEADLINES * self.config.timeout_seconds
        held = Listing(listing.root, None, (), f"{listing.error}; not retried for {pause:g} s",
                              reason=listing.reason)  # fmt: skip
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            self._cooldown[key] = (now + pause, held)

    def _trim(self, now: float) -> None:
        """Room for one more held root (called with the lock held)."""
        if len(self._cooldown) >= MAX_COOLDOWN_ENTRIES:
            for stale in [k for k, (until, _) in self._cooldown.items() if until <= now]:
                del self._cooldown[stale]
            while len(self._cooldown) >= MAX_COOLDOWN_ENTRIES:
                del self._cooldown[next(iter(self._cooldown))]

    def _call(self, worker: _Worker | None, root: str, area: str, job: str | None = None,
              starts: Sequence[tuple[int, int | None]] = (), s3: S3Credentials | None = None,
              used: list[float] | None = None, pods: Sequence[str] = (),
              reports: dict[str, progress.Report] | None = None,
              refused: Sequence[str] = ()) -> tuple[Listing, _Worker | None]:
        """Answer one request on `worker` (or a fresh one); the listing and the worker to put back in its slot
        (a replacement, already starting, when this one had to go). `used[0]` gets the seconds the request
        itself took (a worker's start-up is not the root's doing)."""
        self._reap()
        # Keys travel on the worker's stdin, never its command line (visible to every process on the node).
        message: dict[str, Any] = {"root": root, "area": area, "job": job, "starts": list(starts)}
        if pods:
            message["pods"] = list(pods)
        if refused:
            message["refused"] = list(refused)
        if s3 is not None:
            message["s3"] = dataclasses.asdict(s3)
        request = json.dumps(message).encode() + b"\n"
        timeout = self.config.timeout_seconds
        deadline = time.monotonic() + timeout
        # An idle worker can die for reasons of its own (killed between calls): a ready one that answers
        # nothing gets one fresh try.
        retry = worker is not None and worker.ready and worker.proc.poll() is None
        if worker is None or worker.proc.poll() is not None:
            if worker is not None:
                self._kill(worker)
            worker = self._spawn()
        while True:
            if worker is None:
                return _failed(root, errors.REASON_DISCOVERY_FAILED, "cannot start a discovery worker"), None
            if not worker.ready:
                started = _read_line(worker.proc, deadline)
                if started is None:  # not this root's doing: the worker keeps starting for the next call
                    return _failed(root, errors.REASON_DISCOVERY_BUSY,
                                   f"a checkpoint discovery worker is still starting after {timeout:g} s "
                                   "(a loaded node?); discovery will be retried"), worker  # fmt: skip
                if started != READY:
                    why = _death(worker.proc)
                    self._kill(worker)
                    return _failed(root, errors.REASON_DISCOVERY_FAILED,
                                   f"a checkpoint discovery worker {why} while starting"), self._spawn()
                worker.ready = True
            began = time.monotonic()
            line = self._exchange(worker, request, deadline)
            if used is not None:
                used[0] += time.monotonic() - began
            if line == b"" and retry:
                retry = False
                self._kill(worker)
                worker = self._spawn()
                continue
            break
        if line is None:
            self._kill(worker)
            return _failed(root, errors.REASON_DISCOVERY_TIMED_OUT,
                           f"checkpoint discovery took longer than {timeout:g} s "
                           "(slow or hanging storage?)"), self._spawn()  # fmt: skip
        if not line:
            why = _death(worker.proc)
            self._kill(worker)
            return (_failed(root, errors.REASON_DISCOVERY_FAILED, f"the checkpoint discovery worker {why}"),
                    self._spawn())
        try:
            answer = json.loads(line)
            listing = Listing.from_dict(answer["listing"])
            recycle = bool(answer.get("recycle"))
            if reports is not None:
                reports.update(_reports_from(answer.get("reports"), pods))
        except (ValueError, KeyError, TypeError):
            self._kill(worker)
            return (_failed(root, errors.REASON_DISCOVERY_FAILED, "the discovery worker gave a malformed answer"),
                    self._spawn())
        if recycle:
            self._retire(worker)
            return listing, self._spawn()
        return listing, worker

    @staticmethod
    def _exchange(worker: _Worker, request: bytes, deadline: float) -> bytes | None:
        """Send one request to a ready worker; the answer line, b"" if the worker died, None past the deadline."""
        worker.calls += 1
        try:
            assert worker.proc.stdin is not None
            worker.proc.stdin.write(request)
            worker.proc.stdin.flush()
            return _read_line(worker.proc, deadline)
        except OSError:  # BrokenPipeError: it died before reading
            return b""

    # ---- workers -------------------------------------------------------------------------------
    def _spawn(self) -> _Worker | None:
        cpu = int(self.config.timeout_seconds) + 2
        command = [*self.prefix, sys.executable, "-P", "-m", "resilient_operator.discovery", "--worker",
               *(a for root in self.config.read_roots() for a in ("--read-root", root)),
                   "--memory-bytes", str(self.config.memory_bytes), "--cpu-seconds", str(cpu),
                   "--metadata-max-bytes", str(self.config.metadata_max_bytes),
                   "--max-steps", str(self.config.max_steps)]  # fmt: skip
        if self.config.object_areas:
            command.append("--object-store")  # import s3fs at start-up, not inside a call's deadline
        try:
            # MALLOC_ARENA_MAX: glibc reserves 64 MiB of address space per thread's arena, which RLIMIT_AS counts
            env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/", close_fds=True,
                                    bufsize=0, env=env)  # fmt: skip
        except OSError:
            log.exception("cannot start a checkpoint discovery worker")
            return None
        return _Worker(proc)

    def _kill(self, worker: _Worker) -> None:
        """SIGKILL; a worker stuck in the kernel (hung NFS) dies later and is reaped then."""
        with contextlib.suppress(OSError):
            worker.proc.kill()
        _close_pipes(worker.proc)
        try:
            worker.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            with self._lock:
                self._dying.append(worker.proc)

    def _retire(self, worker: _Worker) -> None:
        _close_pipes(worker.proc)  # EOF on stdin: the worker exits on its own
        try:
            worker.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._kill(worker)

    def _reap(self) -> None:
        with self._lock:
            self._dying = [p for p in self._dying if p.poll() is None]

    def warm(self) -> None:
        """Start every worker now and wait until each is ready (at most STARTUP_SECONDS), so the first
        reconciles pay neither for interpreter start-up nor for loading the S3 client."""
        slots = []
        while True:
            try:
                slots.append(self._slots.get_nowait())
            except queue.Empty:
                break
        started = [worker if worker is not None and worker.proc.poll() is None else self._spawn() for worker in slots]
        deadline = time.monotonic() + STARTUP_SECONDS
        for worker in started:
            if worker is not None and not worker.ready:
                worker.ready = _read_line(worker.proc, deadline) == READY
                if not worker.ready:
                    self._kill(worker)
            self._slots.put(worker if worker is None or worker.ready else None)

    def pids(self) -> list[int]:
        """Process ids of the idle workers (for tests and metrics)."""
        with self._slots.mutex:
            return [w.proc.pid for w in self._slots.queue if w is not None]

    def close(self) -> None:
        while True:
            try:
                worker = self._slots.get_nowait()
            except queue.Empty:
                break
            if worker is not None:
                self._retire(worker)
        self._reap()


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout):
        try:
            if pipe is not None:
                pipe.close()
        except OSError:
            pass


def _read_line(proc: subprocess.Popen[bytes], deadline: float) -> bytes | None:
    """One answer line; b"" if the worker died, None past the deadline. Reads at most 1 MiB."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return b""
        buf += chunk
        if b"\n" in chunk:
            return bytes(buf.split(b"\n", 1)[0])
        if len(buf) > MAX_RESPONSE_BYTES:
            return b""


def _death(proc: subprocess.Popen[bytes]) -> str:
    try:
        code = proc.wait(timeout=0.5)
    except subprocess.TimeoutExpired:
        return "stopped answering"
    if code == -signal.SIGXCPU:
        return "used up its CPU-time limit"
    if code == -signal.SIGKILL:
        return "was killed (out of memory?)"
    return f"exited unexpectedly (status {code})"


# ---- the operator-wide pool ---------------------------------------------------------------------
_pool: DiscoveryPool | None = None
_pool_lock = threading.Lock()


def start(config: DiscoverySettings) -> DiscoveryPool:
    """Create (or replace) the operator's pool and start its workers."""
    global _pool
    with _pool_lock:
        old, _pool = _pool, DiscoveryPool(config)
        pool = _pool
    if old is not None:
        old.close()
    pool.warm()
    return pool


def shutdown() -> None:
    global _pool
    with _pool_lock:
        old, _pool = _pool, None
    if old is not None:
        old.close()


def discover_with_reports(root: str, namespace: str, job: str | None = None,
                          starts: Sequence[tuple[int, int | None]] = (), pods: Sequence[str] = (),
                          refused: Sequence[str] = ()) -> tuple[Listing, dict[str, progress.Report]]:
    """The operator's entry point for a job's checkpoints and its own pods' progress reports."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = DiscoveryPool(DiscoverySettings.from_environ())
        pool = _pool
    return pool.discover_with_reports(root, namespace, job, starts, pods, refused)


def discover(root: str, namespace: str, job: str | None = None,
             starts: Sequence[tuple[int, int | None]] = ()) -> Listing:
    """The operator's entry point: the pool from `start`, or one built from the environment on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = DiscoveryPool(DiscoverySettings.from_environ())
        pool = _pool
    return pool.discover(root, namespace, job, starts)


# ---- the worker side ----------------------------------------------------------------------------
def _limit(which: int, soft: int, hard: int | None = None) -> None:
    """Set a limit, never asking for more than the current hard limit (an unprivileged process cannot)."""
    infinity = resource.RLIM_INFINITY
    _, current = resource.getrlimit(which)
    hard = current if hard is None else hard
    if current != infinity:
        hard = current if hard == infinity else min(hard, current)
    if hard != infinity:
        soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _current_rss() -> int:
    """Resident bytes now (ru_maxrss would include the pre-exec parent's pages on Linux)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def serve(stdin: Any, stdout: Any, limits: storage.ScanLimits, cpu_seconds: int) -> None:
    """Say it is ready, then answer one JSON request line at a time until EOF. Runs inside the worker process."""
    stdout.write(READY + b"\n")
    stdout.flush()
    while True:
        line = stdin.readline(MAX_REQUEST_BYTES)
        if not line:
            return
        _limit(resource.RLIMIT_CPU, int(_cpu_used()) + cpu_seconds)  # per call: SIGXCPU past it
        found: dict[str, Any] = {}
        try:
            request = json.loads(line)
            job = request.get("job")
            starts = [(int(a), None if r is None else int(r)) for a, r in request.get("starts") or []]
            s3 = _credentials(request.get("s3"))
            refused = [str(n) for n in (request.get("refused") or [])[:MAX_REFUSED]]
            listing = storage.discover(str(request["root"]), str(request["area"]), limits,
                                      job=str(job) if job is not None else None, starts=starts, s3=s3,
                                      refused=refused)
            pods = request.get("pods") or []
            if pods and s3 is None and not listing.error:
                found = read_reports(str(request["root"]), str(request["area"]), pods)
            if s3 is not None:
                listing = _redacted(listing, s3.secrets())
        except MemoryError:
            listing = _failed("?", errors.REASON_DISCOVERY_FAILED, "checkpoint discovery ran out of memory")
        except Exception:
            listing = _failed("?", errors.REASON_DISCOVERY_FAILED, "the discovery worker got a malformed request")
        rss = _current_rss()
        recycle = rss > RECYCLE_RSS_BYTES or listing.reason == errors.REASON_DISCOVERY_FAILED
        stdout.write(json.dumps({"listing": listing.to_dict(), "recycle": recycle, "reports": found}).encode()
                     + b"\n")
        stdout.flush()
        if recycle:
            return


def read_reports(root: str, area: str, pods: Any) -> dict[str, Any]:
    """Inside the worker: each named pod's progress report, read relative to the root's directory fd (the root
    opened as discovery opens it: inside the area, no symlink below it), no link followed on the way, at most
    MAX_REPORT_BYTES each, parsed and bounded; pod -> its fields, absent when there is no valid report."""
    out: dict[str, Any] = {}
    if not isinstance(pods, list):
        return out
    try:
        store = roots.open_store(root, area=area)
    except (OSError, ValueError):
        return out
    try:
        for pod in pods[:MAX_REPORTED_PODS]:
            if not isinstance(pod, str) or not _POD_NAME_RE.fullmatch(pod):
                continue
            report = progress.read_report_from(store, pod)  # a symlink, FIFO, oversize file...: no report
            if report is not None:
                out[pod] = progress.to_json(report)  # the file's own format: parse_report reads it again
    finally:
        store.close()
    return out


def _reports_from(data: Any, pods: Sequence[str]) -> dict[str, progress.Report]:
    """The worker's reports, checked again on this side: only pods asked for, every field re-validated."""
    out: dict[str, progress.Report] = {}
    if not isinstance(data, dict):
        return out
    for pod in pods:
        fields = data.get(pod)
        if not isinstance(fields, dict):
            continue
        try:
            report = progress.parse_report(json.dumps(fields).encode(), pod)
        except (TypeError, ValueError):
            continue
        if report is not None:
            out[pod] = report
    return out


def _credentials(data: Any) -> S3Credentials | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError("s3 must be an object")
    fields = {f.name: f.type for f in dataclasses.fields(S3Credentials)}
    if not set(data) <= set(fields):
        raise ValueError("unknown s3 field")
    timeout = data.get("timeout_s")
    if timeout is not None and not isinstance(timeout, (int, float)):
        raise ValueError("s3.timeout_s must be a number")
    strings = {k: v for k, v in data.items() if k != "timeout_s"}
    if not all(v is None or isinstance(v, str) for v in strings.values()):
        raise ValueError("s3 fields must be strings")
    return S3Credentials(**strings, timeout_s=None if timeout is None else float(timeout))


def _redacted(listing: Listing, secrets: Sequence[str]) -> Listing:
    """The listing with any key the store echoed in an error replaced (a condition is readable by the tenant)."""

    def clean(text: str | None) -> str | None:
        for secret in secrets:
            if text is not None and secret in text:
                text = text.replace(secret, "<redacted>")
        return text

    def verdict(v: Verdict | None) -> Verdict | None:
        return None if v is None else dataclasses.replace(v, reason=clean(v.reason) or "", path=clean(v.path) or "")

    return dataclasses.replace(listing, error=clean(listing.error), latest=verdict(listing.latest),
                               skipped=tuple(v for s in listing.skipped if (v := verdict(s)) is not None))


def worker_main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="checkpoint discovery worker (started by the operator)")
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("--memory-bytes", type=int, required=True)
    parser.add_argument("--cpu-seconds", type=int, required=True)
    parser.add_argument("--metadata-max-bytes", type=int, required=True)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--object-store", action="store_true", help="import the S3 client now")
    parser.add_argument("--read-root", action="append", default=[], help="a tree the worker may read")
    args = parser.parse_args(argv)
    _limit(resource.RLIMIT_CORE, 0, 0)
    _limit(resource.RLIMIT_FSIZE, 0, 0)
    _limit(resource.RLIMIT_AS, args.memory_bytes, args.memory_bytes)
    if args.object_store:
        # The S3 client runs an event-loop thread (and resolver threads): small stacks keep its address space,
        # which RLIMIT_AS counts, well inside the limit (see MALLOC_ARENA_MAX in `_spawn`).
        threading.stack_size(THREAD_STACK_BYTES)
        with contextlib.suppress(Exception):  # without the client an s3:// root gets DiscoveryFailed, with a reason
            s3.warm_up()
    limits = storage.ScanLimits(max_steps=args.max_steps,
                               metadata=dcp_metadata.Limits(max_bytes=args.metadata_max_bytes))  # fmt: skip
    if args.read_root and not confine(args.read_root):
        sys.stderr.write("discovery worker: Landlock is not available; the worker is not confined to the "
                         "checkpoint storage (it can read what the operator's uid can)\n")
    serve(sys.stdin.buffer, sys.stdout.buffer, limits, args.cpu_seconds)


# ---- confinement (Landlock) ----------------------------------------------------------------------------
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446  # every Linux arch
_PR_SET_NO_NEW_PRIVS = 38
_FS_ALL_V1 = (1 << 13) - 1  # every filesystem right of Landlock ABI 1 (execute ... make_sym)
_FS_READ = (1 << 2) | (1 << 3)  # READ_FILE | READ_DIR


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def confine(read_roots: Sequence[str]) -> bool:
    """Restrict this process, for good, to reading the checkpoint storage (`read_roots`), its own Python
    installation and the few system files a TLS client needs: the operator's ServiceAccount token, the mounted
    object-store keys and everything else of the operator's stay unreadable even though the worker runs
    under the operator's uid. Landlock needs no privilege (Linux 5.13+); False where it is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        attr = _RulesetAttr(_FS_ALL_V1)
        ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    except (OSError, AttributeError):
        return False
    if ruleset < 0:
        return False
    try:
        python = {sys.prefix, sys.base_prefix, sys.exec_prefix, *(p for p in sys.path if p)}
        system = ("/etc/ssl", "/etc/pki", "/etc/ca-certificates", "/usr/share/ca-certificates", "/etc/resolv.conf",
                  "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/localtime", "/usr/share/zoneinfo",
                  "/proc/self", "/dev/null", "/dev/urandom")  # fmt: skip
        for path in [*read_roots, *sorted(python), *system]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # absent here
            try:
                rule = _PathBeneath(_FS_READ if os.path.isdir(path) else 1 << 2, fd)
                libc.syscall(_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0)  # 1: PATH_BENEATH
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        return bool(libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0) == 0)
    finally:
        os.close(ruleset)


if __name__ == "__main__":
    worker_main(sys.argv[1:])
