"""The Pod Security Standards ("baseline" + "restricted", v1.34) checks that can be decided from a pod spec alone.

Mirrors k8s.io/pod-security-admission/policy; used for the operator's Deployment and the example job's
worker template. Returns human-readable violations, empty when the pod would be admitted under
`pod-security.kubernetes.io/enforce: restricted`.
"""

from __future__ import annotations

from typing import Any

# Volume types the restricted profile allows (everything else, hostPath included, is refused).
RESTRICTED_VOLUME_TYPES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
})  # fmt: skip
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})  # fmt: skip
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})  # fmt: skip


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """Every reason the restricted profile would refuse a pod with this spec."""
    out: list[str] = []
    psc = spec.get("securityContext") or {}
    # baseline
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"{field} must not be true")
    for sysctl in psc.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl['name']} is not allowed")
    for vol in spec.get("volumes") or []:
        kinds = set(vol) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            out.append(f"volume {vol['name']} has a disallowed type {sorted(kinds - RESTRICTED_VOLUME_TYPES)}")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    pod_non_root = psc.get("runAsNonRoot")
    if psc.get("runAsUser") == 0:
        out.append("pod runAsUser must not be 0")
    for c in _containers(spec):
        name = c["name"]
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"container {name}: privileged")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"container {name}: procMount must be Default")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"container {name}: hostPort {port['hostPort']}")
        caps = sc.get("capabilities") or {}
        added = set(caps.get("add") or [])
        if not added <= BASELINE_CAPABILITIES:
            out.append(f"container {name}: adds capabilities {sorted(added - BASELINE_CAPABILITIES)}")
        # restricted
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"container {name}: allowPrivilegeEscalation must be false")
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"container {name}: capabilities must drop ALL")
        if not added <= {"NET_BIND_SERVICE"}:
            out.append(f"container {name}: may add only NET_BIND_SERVICE")
        non_root = sc.get("runAsNonRoot", pod_non_root)
        if non_root is not True:
            out.append(f"container {name}: runAsNonRoot must be true (pod or container)")
        if sc.get("runAsUser") == 0:
            out.append(f"container {name}: runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"container {name}: seccompProfile must be RuntimeDefault or Localhost, got {seccomp}")
    return out
