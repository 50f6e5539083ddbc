"""Find (and if needed build) what real nodes run: hack/realnodes/build.sh (kubelet, kube-proxy, CoreDNS,
pause) and hack/realnodes/images.sh (the pause and busybox images, as docker archives)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from e2e.controlplane.binaries import REPO_ROOT

HACK = REPO_ROOT / "hack" / "realnodes"


def _run(script: str, *args: str, timeout: float) -> Path:
    out = subprocess.run(["bash", str(HACK / script), *args], check=True, stdout=subprocess.PIPE, text=True,
                         timeout=timeout)
    return Path(out.stdout.strip().splitlines()[-1])


def ensure_node_binaries(timeout: float = 3600) -> Path:
    """The bin dir holding kubelet, kube-proxy (symlinks to knode), coredns and pause (a no-op when cached)."""
    return _run("build.sh", timeout=timeout)


def ensure_images(timeout: float = 3600) -> Path:
    """The dir holding `<image>.tar` (docker archive) and `<image>.ref` (its name) for pause and busybox."""
    return _run("images.sh", timeout=timeout)


def image_refs(image_dir: Path) -> dict[str, str]:
    """{"pause": "localhost/rtj/pause:<hash>", "busybox": ...} from an image dir."""
    return {p.stem: p.read_text().strip() for p in sorted(image_dir.glob("*.ref"))}
