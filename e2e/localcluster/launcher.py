"""Runs inside a pod's namespaces (net, mount, uts): sets up the container's view, then execs its command.

Started by the node agent as
`ip netns exec <ns> unshare --mount --uts --propagation private python launcher.py spec.json`.
The mounts are private to this mount namespace, so the ServiceAccount token, /etc/hosts and the
volumes appear at their Kubernetes paths for this process tree only. With a securityContext it then
makes the root filesystem read-only and drops to runAsUser/runAsGroup/supplementalGroups+fsGroup.
Standard library only.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384
_libc = ctypes.CDLL(None, use_errno=True)


def _bind(source: str, target: str, read_only: bool) -> None:
    # The mount(2) syscall, not mount(8): mount(8) canonicalizes /proc/self/fd/N back to a path
    # that an earlier mount may hide.
    if _libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bind {source} -> {target}: {os.strerror(err)}")
    if read_only and _libc.mount(None, target.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"remount ro {target}: {os.strerror(err)}")


def _ensure_target(src: str, dst: str) -> None:
    # Mount points must exist; an empty directory/file is left on the host filesystem (documented).
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    elif not os.path.exists(dst):
        os.makedirs(os.path.dirname(dst) or "/", exist_ok=True)
        open(dst, "a").close()


def _expose(paths: list[str]) -> None:
    """Make `paths` reachable for a non-root user whose way there crosses a 0700 directory.

    The interpreter lives under /root (mode 0700): mount a tmpfs over the closed ancestor in this
    mount namespace only and bind the needed directory back, so the rest of /root stays hidden.
    """
    for path in paths:
        parts = os.path.normpath(path).split("/")[1:]
        ancestors = ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]
        closed = next((a for a in ancestors if not os.stat(a).st_mode & 0o001), None)
        if closed is None:
            continue
        fd = os.open(path, os.O_PATH)
        if _libc.mount(b"tmpfs", closed.encode(), b"tmpfs", 0, b"mode=0755") != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"tmpfs {closed}: {os.strerror(err)}")
        os.makedirs(path, exist_ok=True)
        _bind(f"/proc/self/fd/{fd}", path, read_only=True)
        os.close(fd)


def main() -> None:
    """Bind-mount volumes and files, set the hostname, then exec the container's command."""
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    # The default working directory is entered before any mount can hide it.
    os.makedirs(spec["defaultDir"], exist_ok=True)
    os.chdir(spec["defaultDir"])
    # Parents before children (as runtimes order mounts), and every source pinned by an O_PATH fd
    # first: an earlier mount (an emptyDir on /tmp, say) may hide a later source.
    mounts = sorted(spec["mounts"], key=lambda m: len(os.path.normpath(m["target"]).split("/")))
    sources = [os.open(m["source"], os.O_PATH) for m in mounts]
    keep = {path: os.open(path, os.O_PATH) for path in spec.get("keep") or [] if os.path.isdir(path)}
    for m, fd in zip(mounts, sources, strict=True):
        _ensure_target(f"/proc/self/fd/{fd}", m["target"])
        _bind(f"/proc/self/fd/{fd}", m["target"], bool(m.get("readOnly")))
    for path, fd in keep.items():  # bring back what a volume mounted over an ancestor hid
        if not os.path.isdir(path) or not os.path.samestat(os.stat(path), os.fstat(fd)):
            os.makedirs(path, exist_ok=True)
            _bind(f"/proc/self/fd/{fd}", path, read_only=True)
    for fd in [*sources, *keep.values()]:
        os.close(fd)
    socket.sethostname(spec["hostname"])
    os.setpriority(os.PRIO_PROCESS, 0, 0)  # the agent runs at nice -5; containers at the default
    if spec.get("workingDir"):
        os.makedirs(spec["workingDir"], exist_ok=True)
    user = spec.get("user")
    if user:
        _expose(spec.get("expose") or [])
    # A per-mount flag on this namespace's copy of / (MS_BIND|MS_REMOUNT), never the host's superblock.
    if spec.get("readOnlyRootFilesystem") and _libc.mount(None, b"/", None,
                                                         MS_BIND | MS_REMOUNT | MS_RDONLY, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"remount / ro: {os.strerror(err)}")
    if user:
        os.setgroups(user["groups"])
        os.setgid(user["gid"])
        os.setuid(user["uid"])
    if spec.get("workingDir"):
        os.chdir(spec["workingDir"])
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as exc:
        # What a container runtime reports as StartError; the agent reads exit code 128.
        print(f"exec {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(128)


if __name__ == "__main__":
    main()
