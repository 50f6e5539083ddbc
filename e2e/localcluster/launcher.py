"""Runs inside a pod's namespaces (net, mount, uts): sets up the container's view, then execs its command.

Started by the node agent as
`ip netns exec <ns> unshare --mount --uts --propagation private python launcher.py spec.json`.
The mounts are private to this mount namespace, so the ServiceAccount token, /etc/hosts and the
volumes appear at their Kubernetes paths for this process tree only. Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def _mount(*args: str, fds: tuple[int, ...] = ()) -> None:
    subprocess.run(["mount", *args], check=True, timeout=30, pass_fds=fds)


def _ensure_target(src: str, dst: str) -> None:
    # Mount points must exist; an empty directory/file is left on the host filesystem (documented).
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    elif not os.path.exists(dst):
        os.makedirs(os.path.dirname(dst) or "/", exist_ok=True)
        open(dst, "a").close()


def main() -> None:
    """Bind-mount volumes and files, set the hostname, then exec the container's command."""
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    # Pin every source first: an earlier mount (an emptyDir on /tmp, say) may hide a later source.
    sources = [os.open(m["source"], os.O_PATH) for m in spec["mounts"]]
    for m, fd in zip(spec["mounts"], sources, strict=True):
        _ensure_target(m["source"], m["target"])
        _mount("--bind", f"/proc/self/fd/{fd}", m["target"], fds=(fd,))
        if m.get("readOnly"):
            _mount("-o", "remount,bind,ro", m["target"])
    socket.sethostname(spec["hostname"])
    cwd = spec.get("workingDir") or spec["defaultDir"]
    os.makedirs(cwd, exist_ok=True)
    os.chdir(cwd)
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as exc:
        # What a container runtime reports as StartError; the agent reads exit code 128.
        print(f"exec {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(128)


if __name__ == "__main__":
    main()
