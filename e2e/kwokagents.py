"""The agents KWOK's pods do not run: one per pod, at the pod's own IP, so the operator's in-place plans land.

A KWOK pod is a record with no process, so nothing listens at its IP and every in-place plan would be
refused at once (the operator then recreates). `AgentFleet` answers for them, inside the bench process:

- The cluster's network namespace routes KWOK's whole pod CIDR to its loopback (`ip route add local
  10.240.0.0/12 dev lo`, Linux's "AnyIP"), so a socket can be bound to any pod IP there and the operator's
  pod, whose default route is the cluster bridge, reaches it as it would a real pod.
- Each pod with an agent port in its injected environment gets a listening socket at `podIP:port`, served by
  the real agent's HTTP server (`resilient_trainer.agent._Server`: its request bounds, its answers) around a
  `PodAgent` that checks each plan with the real agent's verification (`resilient_contract.plan.verify`: the
  operator's signature, this job's uid, this pod's uid) and keeps its attempt, as `agent.Agent.offer` does.
- What it leaves out is the worker processes: a plan is taken at once, with nothing to stop or start. So
  the figures it gives are the control plane's and the operator's (signing, the POSTs, the relabels, the
  pod creates), not a trainer's restart, which the process and real-node lanes measure.

One thread, inside the namespace, owns every listening socket (a selector; sockets are bound there, so they
live in the namespace); each request gets a thread of the agent's server, as in a real pod.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import selectors
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from e2e.controlplane import network
from e2e.kwokcluster import POD_CIDR
from resilient_contract import environment, plan
from resilient_operator import constants as c
from resilient_trainer import agent as real_agent


@dataclass
class PodAgent:
    """One pod's agent without its workers: verifies a plan as the real agent does and runs its attempt."""

    pod: str
    pod_uid: str
    job_uid: str
    public_key: str
    attempt: int
    plans: list[int] = field(default_factory=list)  # the attempts it took, in order
    lock: threading.Lock = field(default_factory=threading.Lock)

    def offer(self, body: bytes) -> tuple[int, dict[str, Any]]:
        try:
            new = plan.verify(body, self.public_key, self.job_uid, self.pod_uid)
        except plan.NotForUs as exc:
            return 403, {"error": str(exc)}
        except plan.PlanError as exc:
            return 400, {"error": str(exc)}
        with self.lock:
            if new.attempt < self.attempt:
                return 409, {"error": f"attempt {new.attempt} is older than the running {self.attempt}"}
            if new.attempt > self.attempt:
                self.attempt = new.attempt
                self.plans.append(new.attempt)
            return 200, {"attempt": self.attempt, "state": plan.STARTED}

    def health(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "state": real_agent.RUNNING, "prewarmed": False}


def pod_agent(pod: Mapping[str, Any]) -> tuple[str, int, PodAgent] | None:
    """(IP, port, agent) for a KWOK pod the operator rendered with an agent (restartStrategy InPlace)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ip = status.get("podIP")
    if not ip or ipaddress.ip_address(ip) not in ipaddress.ip_network(POD_CIDR):
        return None
    containers = (pod.get("spec") or {}).get("containers") or []
    env = {e["name"]: e.get("value", "") for e in (containers[0].get("env") or [])} if containers else {}
    port = env.get(plan.AGENT_PORT_ENV, "")
    if not port.isdigit() or port == "0" or not env.get(plan.PUBLIC_KEY_ENV):
        return None
    attempt = (meta.get("labels") or {}).get(c.LABEL_ATTEMPT, "0")
    agent = PodAgent(pod=meta["name"], pod_uid=meta["uid"], job_uid=env.get(environment.JOB_UID, ""),
                     public_key=env[plan.PUBLIC_KEY_ENV], attempt=int(attempt) if attempt.isdigit() else 0)
    return ip, int(port), agent


class _QuietHandler(real_agent._Handler):
    """The agent's handler without its line per plan (thousands of them here; the fleet counts them)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class AgentFleet:
    """Listens for every KWOK pod of the given cluster namespace; feed it pod events (`on_pod`)."""

    def __init__(self, cluster_netns: str) -> None:
        self.netns = cluster_netns
        network.ip("-n", cluster_netns, "route", "replace", "local", POD_CIDR, "dev", "lo")
        self._lock = threading.Lock()
        self._servers: dict[str, tuple[str, real_agent._Server]] = {}  # pod uid -> (IP, its server)
        self.agents: dict[str, PodAgent] = {}  # pod uid -> agent (kept after the pod goes, for the figures)
        self._pending: list[tuple[str, Any]] = []  # ("add", (ip, port, agent)) | ("remove", uid)
        self.bind_errors: list[str] = []
        self._wake_r, self._wake_w = os.pipe()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kwok-agents", daemon=True)
        self._thread.start()

    # -- pod events (the bench's pod informer calls this) ----------------------------------------------------
    def on_pod(self, etype: str, _old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        if new is None:
            return
        uid = (new.get("metadata") or {}).get("uid", "")
        if etype == "DELETED" or (new.get("metadata") or {}).get("deletionTimestamp"):
            self._queue("remove", uid)
            return
        with self._lock:
            known = uid in self._servers or any(op == "add" and arg[2].pod_uid == uid for op, arg in self._pending)
        if not known and (found := pod_agent(new)) is not None:
            self._queue("add", found)

    def plans_taken(self) -> int:
        return sum(len(a.plans) for a in list(self.agents.values()))

    def stop(self) -> None:
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(10)
        with contextlib.suppress(Exception):
            network.ip("-n", self.netns, "route", "del", "local", POD_CIDR, "dev", "lo", check=False)

    # -- the namespace's thread ------------------------------------------------------------------------------
    def _queue(self, op: str, arg: Any) -> None:
        with self._lock:
            self._pending.append((op, arg))
        os.write(self._wake_w, b"x")

    def _run(self) -> None:
        fd = network.open_netns(self.netns)
        try:
            network.enter(fd)  # this thread only: the sockets it binds live in the cluster's namespace
        finally:
            os.close(fd)
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=1.0):
                    if key.fileobj == self._wake_r:
                        os.read(self._wake_r, 4096)
                    else:
                        key.data._handle_request_noblock()  # accept; the server's thread answers it
                self._apply(sel)
        finally:
            with self._lock:
                servers = list(self._servers.values())
                self._servers.clear()
            for _, server in servers:
                server.server_close()
            sel.close()

    def _apply(self, sel: selectors.BaseSelector) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for op, arg in pending:
            if op == "remove":
                self._close(sel, arg)
                continue
            ip, port, agent = arg
            with self._lock:
                stale = [uid for uid, (bound, _) in self._servers.items() if bound == ip]
            for uid in stale:  # KWOK gave a deleted pod's IP to a new pod before its delete event came
                self._close(sel, uid)
            try:
                server = real_agent._Server((ip, port), agent, socket.AF_INET)  # type: ignore[arg-type]
            except OSError as exc:
                self.bind_errors.append(f"{agent.pod} {ip}:{port}: {exc}")
                continue
            server.RequestHandlerClass = _QuietHandler
            server.socket.setblocking(False)
            sel.register(server.socket, selectors.EVENT_READ, server)
            with self._lock:
                self._servers[agent.pod_uid] = (ip, server)
                self.agents[agent.pod_uid] = agent

    def _close(self, sel: selectors.BaseSelector, uid: str) -> None:
        with self._lock:
            entry = self._servers.pop(uid, None)
        if entry is not None:
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(entry[1].socket)
            entry[1].server_close()
