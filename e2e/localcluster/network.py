"""Per-cluster pod network: a Linux bridge on the host, one network namespace per pod.

Each cluster takes a /16 `10.<X>.0.0/16` (X in 100..199) that no interface on the host uses
yet; the bridge holds `10.<X>.0.1` (the apiserver listens there, so pods reach it as they
would reach a real control plane), node i owns `10.<X>.<i>.0/24`, its InternalIP is
`10.<X>.<i>.1` (an extra address on the bridge) and its pods get `.2`..`.254`. All traffic
stays on interfaces the harness created.
"""

from __future__ import annotations

import fcntl
import ipaddress
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = Path("/tmp/rtj-localcluster-net.lock")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run iproute2 with a timeout; every network change goes through here."""
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


@contextmanager
def _locked() -> Iterator[None]:
    with LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _listening_subnets() -> set[int]:
    """Every X with a socket still bound on 10.X.*: a node agent of a cluster whose bridge is gone (killed
    mid-run, its teardown cut short) keeps its kubelet port, and a new cluster on that X could not bind."""
    out = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True, timeout=30, check=False).stdout
    return {int(m.group(1)) for m in re.finditer(r"\b10\.(\d+)\.\d+\.\d+:\d+", out)}


def allocate_bridge() -> tuple[str, int]:
    """Create a bridge on a free 10.X/16 and return (bridge name, X)."""
    with _locked():
        used = {int(m.group(1)) for m in re.finditer(r"inet 10\.(\d+)\.", ip("-o", "-4", "addr").stdout)}
        used |= _listening_subnets()
        links = ip("-o", "link").stdout
        for x in range(100, 200):
            name = f"rtjbr{x}"
            if x in used or f" {name}:" in links:
                continue
            ip("link", "add", name, "type", "bridge")
            ip("addr", "add", f"10.{x}.0.1/16", "dev", name)
            ip("link", "set", name, "up")
            return name, x
    raise RuntimeError("no free 10.X.0.0/16 for a cluster bridge")


def delete_bridge(name: str) -> None:
    """Remove the bridge (and with it every address on it)."""
    ip("link", "del", name, check=False)


def add_node_address(bridge: str, x: int, index: int) -> str:
    """Give node `index` its InternalIP on the bridge; returns the address."""
    addr = f"10.{x}.{index}.1"
    ip("addr", "add", f"{addr}/32", "dev", bridge, check=False)
    return addr


def setup_pod_netns(netns: str, veth: str, bridge: str, pod_ip: str, gateway: str) -> None:
    """Create a pod's namespace with eth0 (a veth whose peer sits on the bridge) and lo."""
    ip("netns", "del", netns, check=False)
    ip("link", "del", veth, check=False)
    ip("netns", "add", netns)
    ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    ip("link", "set", veth, "master", bridge, "up")
    ip("-n", netns, "addr", "add", f"{pod_ip}/16", "dev", "eth0")
    ip("-n", netns, "link", "set", "eth0", "up")
    ip("-n", netns, "link", "set", "lo", "up")
    ip("-n", netns, "route", "add", "default", "via", gateway)


def teardown_pod_netns(netns: str, veth: str) -> None:
    """Delete a pod's namespace; its veth pair goes with it."""
    ip("netns", "del", netns, check=False)
    ip("link", "del", veth, check=False)


def delete_netns_with_prefix(prefix: str) -> None:
    """Remove every namespace a cluster created (teardown after agents are gone)."""
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(prefix):
            ip("netns", "del", name, check=False)


def node_ip_range(x: int, index: int) -> list[str]:
    """Pod addresses a node may hand out."""
    net = ipaddress.ip_network(f"10.{x}.{index}.0/24")
    return [str(h) for h in net.hosts()][1:]
