"""Per-cluster network: everything inside one network namespace the harness creates, nothing on the host's.

Each cluster gets a namespace `rtj-<cluster id>` with its own loopback and a bridge holding
`10.100.0.1/16`. The control plane and the node agents run inside it (etcd on its loopback, the
apiserver on the bridge address, so pods reach it as they would a real control plane); node i's
InternalIP `10.100.<i>.1` is an extra address on that bridge, and each pod gets its own namespace
`rtj-<cluster id>_<i>-<uid>` with a veth whose peer sits on the bridge and an address from
`10.100.<i>.0/24`. Since every cluster has its own namespace they all use the same addresses without
colliding with each other or with anything on the host (a VPN's routes included); the host gains no
interface, address or route. The tests reach the apiserver through forward.py (a listener on host
loopback whose connections are made inside the namespace).

A cluster whose processes all died (a SIGKILLed test and its watchdog) leaves only namespace names
under /run/netns; `cleanup_stale()` (run by every start and by `down`) removes those.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

LOCK = Path("/tmp/rtj-localcluster-net.lock")
RUN_NETNS = Path("/run/netns")
PREFIX = "rtj-"
SUBNET = 100  # 10.100.0.0/16 in every cluster: each has a namespace of its own
BRIDGE = "rtj0"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run iproute2 with a timeout; every network change goes through here."""
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


@contextmanager
def locked() -> Iterator[None]:
    """Serialize creating a cluster namespace (until its first process runs) against stale cleanup."""
    with LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ------------------------------------------------------------------ names
def cluster_netns_name(cluster_id: str) -> str:
    """`rtj-<cluster id>`, the id reduced to characters that never contain the pod separator `_`."""
    return PREFIX + re.sub(r"[^a-zA-Z0-9-]", "-", cluster_id)


def pod_netns_prefix(cluster_netns: str, index: int) -> str:
    """Every pod namespace of node `index` starts with this (and with the cluster's name + `_`)."""
    return f"{cluster_netns}_{index}-"


def gateway(subnet: int = SUBNET) -> str:
    """The bridge's address: the pods' default route and the apiserver's address."""
    return f"10.{subnet}.0.1"


def list_netns() -> list[str]:
    """Names under /run/netns."""
    return [line.split()[0] for line in ip("netns", "list", check=False).stdout.splitlines() if line.split()]


# ------------------------------------------------------------------ the cluster's namespace
def create_cluster_netns(name: str, subnet: int = SUBNET) -> None:
    """The namespace with lo up and the bridge on `10.<subnet>.0.1/16` (call under `locked()`)."""
    ip("netns", "add", name)
    try:
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "link", "add", BRIDGE, "type", "bridge")
        ip("-n", name, "addr", "add", f"{gateway(subnet)}/16", "dev", BRIDGE)
        ip("-n", name, "link", "set", BRIDGE, "up")
    except BaseException:
        ip("netns", "del", name, check=False)
        raise


def delete_cluster_netns(name: str) -> None:
    """Remove the cluster's pod namespaces, then its own (its bridge and veths go with it)."""
    for ns in list_netns():
        if ns.startswith(name + "_"):
            ip("netns", "del", ns, check=False)
    ip("netns", "del", name, check=False)


def netns_pids(name: str) -> list[int]:
    """Processes whose network namespace is `name`."""
    try:
        ino = os.stat(RUN_NETNS / name).st_ino
    except OSError:
        return []
    want = f"net:[{ino}]"
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/net") == want:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def cleanup_stale() -> list[str]:
    """Delete cluster namespaces no process lives in, and pod namespaces whose cluster's is gone.

    Call under `locked()`: a cluster being created holds the lock until its first process runs.
    """
    names = list_netns()
    removed = []
    for ns in names:
        if not ns.startswith(PREFIX):
            continue
        cluster, sep, _ = ns.partition("_")
        if sep and cluster not in names:
            ip("netns", "del", ns, check=False)
            removed.append(ns)
        elif not sep and not netns_pids(ns):
            delete_cluster_netns(ns)
            removed.append(ns)
    return removed


def add_node_address(netns: str, index: int, subnet: int = SUBNET) -> str:
    """Give node `index` its InternalIP on the cluster bridge; returns the address."""
    addr = f"10.{subnet}.{index}.1"
    ip("-n", netns, "addr", "add", f"{addr}/32", "dev", BRIDGE, check=False)
    return addr


# ------------------------------------------------------------------ entering it
def enter(fd: int) -> None:
    """Move the calling thread (or a child before exec) into the namespace open at `fd`."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def open_netns(name: str) -> int:
    """A descriptor for `enter`."""
    return os.open(RUN_NETNS / name, os.O_RDONLY | os.O_CLOEXEC)


def call_in_netns(name: str, fn: Callable[[], T], timeout: float = 60) -> T:
    """Run `fn` on a short-lived thread inside the namespace (sockets it opens live there)."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        fd = open_netns(name)
        try:
            enter(fd)  # this thread only; it ends with its namespace
            result.append(fn())
        except BaseException as exc:
            error.append(exc)
        finally:
            os.close(fd)

    t = threading.Thread(target=run, daemon=True, name=f"in {name}")
    t.start()
    t.join(timeout)
    if error:
        raise error[0]
    if not result:
        raise TimeoutError(f"call in {name} took over {timeout}s")
    return result[0]


# ------------------------------------------------------------------ pods
def setup_pod_netns(cluster_netns: str, netns: str, veth: str, bridge: str, pod_ip: str, gw: str) -> None:
    """Create a pod's namespace with eth0 (a veth whose peer sits on the cluster bridge) and lo."""
    ip("netns", "del", netns, check=False)
    ip("-n", cluster_netns, "link", "del", veth, check=False)
    ip("netns", "add", netns)
    ip("-n", cluster_netns, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    ip("-n", cluster_netns, "link", "set", veth, "master", bridge, "up")
    ip("-n", netns, "addr", "add", f"{pod_ip}/16", "dev", "eth0")
    ip("-n", netns, "link", "set", "eth0", "up")
    ip("-n", netns, "link", "set", "lo", "up")
    ip("-n", netns, "route", "add", "default", "via", gw)


def teardown_pod_netns(cluster_netns: str, netns: str, veth: str) -> None:
    """Delete a pod's namespace; its veth pair goes with it."""
    ip("netns", "del", netns, check=False)
    ip("-n", cluster_netns, "link", "del", veth, check=False)


def delete_netns_with_prefix(prefix: str) -> None:
    """Remove every namespace whose name starts with `prefix` (a node's pods after a reboot)."""
    for ns in list_netns():
        if ns.startswith(prefix):
            ip("netns", "del", ns, check=False)
