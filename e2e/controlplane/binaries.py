"""Find (and if needed build) the control-plane binaries that hack/k8s/build.sh produces."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "k8s" / "build.sh"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "helm")


def bin_dir() -> Path:
    """The directory the build script fills (or `RTJ_K8S_BIN_DIR` when set)."""
    if os.environ.get("RTJ_K8S_BIN_DIR"):
        return Path(os.environ["RTJ_K8S_BIN_DIR"])
    out = subprocess.run([str(BUILD_SCRIPT), "--print-dir"], check=True, capture_output=True,
                         text=True, timeout=60)
    return Path(out.stdout.strip().splitlines()[-1])


def binaries_present(directory: Path | None = None) -> bool:
    """True when every component exists in the bin dir and the build finished (stamp file)."""
    d = directory or bin_dir()
    return (d / ".stamp").exists() and all((d / c).exists() for c in COMPONENTS)


def ensure_binaries(timeout: float = 3600) -> Path:
    """Run the build script (a no-op when its cache is warm) and return the bin dir."""
    if os.environ.get("RTJ_K8S_BIN_DIR"):
        return Path(os.environ["RTJ_K8S_BIN_DIR"])
    out = subprocess.run([str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True,
                         timeout=timeout)
    return Path(out.stdout.strip().splitlines()[-1])
