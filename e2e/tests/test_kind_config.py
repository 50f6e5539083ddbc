"""The kind backend's config and commands (no Docker needed: commands are recorded, not run)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from e2e.kindcluster import SHARED_PATHS, KindCluster, kind_config, worker_container_names


class Recorder:
    """A runner that records argv and answers success."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_config_has_one_control_plane_and_workers_sharing_every_mount(tmp_path: Path) -> None:
    cfg = kind_config(3, tmp_path, "8s", "1s")
    roles = [n["role"] for n in cfg["nodes"]]
    assert roles == ["control-plane", "worker", "worker", "worker"]
    for node in cfg["nodes"]:
        assert {m["containerPath"] for m in node["extraMounts"]} == set(SHARED_PATHS)
        for m in node["extraMounts"]:
            assert m["hostPath"] == str(tmp_path / m["containerPath"].lstrip("/"))
    assert cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4"


def test_controller_manager_flags_go_through_a_kubeadm_patch(tmp_path: Path) -> None:
    patch, kubelet = kind_config(3, tmp_path, "12s", "2s")["kubeadmConfigPatches"]
    assert "kind: KubeletConfiguration" in kubelet and "nodeLeaseDurationSeconds: 4" in kubelet
    assert "kind: ClusterConfiguration" in patch
    assert 'node-monitor-grace-period: "12s"' in patch
    assert 'node-monitor-period: "2s"' in patch


def test_worker_names_follow_kind() -> None:
    assert worker_container_names("c", 3) == ["c-worker", "c-worker2", "c-worker3"]


def test_start_creates_then_builds_and_loads_each_image(tmp_path: Path) -> None:
    rec = Recorder()
    cl = KindCluster.start("t", base_dir=tmp_path, runner=rec, workers=3)
    create, *rest = rec.calls
    assert create[:3] == ["kind", "create", "cluster"] and "--config" in create
    builds = [c for c in rest if c[:2] == ["docker", "build"]]
    loads = [c for c in rest if c[:3] == ["kind", "load", "docker-image"]]
    assert len(builds) == len(loads) == 2
    assert all(c[-2:] == ["--name", cl.name] for c in loads)
    assert (cl.dir / "kind.json").exists()


def test_add_kill_restore_map_names_to_kind_workers(tmp_path: Path) -> None:
    rec = Recorder()
    cl = KindCluster.start("t", base_dir=tmp_path, runner=rec, workers=2, build_images=False)
    rec.calls.clear()
    assert cl.add_node("node-1", gpus=2, labels={"role": "w"}) == f"{cl.name}-worker"
    label, gpu = rec.calls
    assert label[2:5] == ["label", "node", f"{cl.name}-worker"] and "rtj.local/name=node-1" in label
    assert "--subresource=status" in gpu and "nvidia.com~1gpu" in gpu[-1]
    assert cl.kill_command("node-1") == ["docker", "pause", f"{cl.name}-worker"]
    assert cl.restore_command("node-1") == ["docker", "unpause", f"{cl.name}-worker"]
    cl.add_node("node-2")
    with pytest.raises(RuntimeError, match="no spare kind worker"):
        cl.add_node("node-3")


def test_host_path_only_for_shared_paths(tmp_path: Path) -> None:
    cl = KindCluster.start("t", base_dir=tmp_path, runner=Recorder(), build_images=False)
    assert cl.host_path("/rtj-checkpoints/job") == cl.dir / "hostpath" / "rtj-checkpoints" / "job"
    with pytest.raises(ValueError):
        cl.host_path("/elsewhere")


def _members(proto: type) -> set[str]:
    return {n for n in vars(proto) if not n.startswith("_")} | set(proto.__annotations__)


def test_both_backends_offer_the_whole_interface() -> None:
    from e2e.cluster import ClusterLike
    from e2e.localcluster import Cluster

    for backend in (Cluster, KindCluster):
        fields = set(getattr(backend, "__dataclass_fields__", {}))
        missing = {m for m in _members(ClusterLike) if not hasattr(backend, m) and m not in fields}
        assert not missing, f"{backend.__name__} lacks {sorted(missing)}"


def test_kind_shares_the_kubectl_built_methods(tmp_path: Path) -> None:
    rec = Recorder()
    cl = KindCluster.start("t", base_dir=tmp_path, runner=rec, workers=1, build_images=False)
    cl.add_node("node-1")
    rec.calls.clear()
    host = cl.create_shared_pvc("ckpt", "ns1")
    assert host == cl.dir / "hostpath" / "rtj-shared" / "ns1" / "ckpt" and host.is_dir()
    assert rec.calls[-1][2:] == ["apply", "-f", "-"]
    cl.node_ready("node-1")
    assert rec.calls[-1][2:5] == ["get", "node", f"{cl.name}-worker"]  # the requested name is mapped


def test_the_local_backend_never_imports_the_kind_one() -> None:
    import subprocess
    import sys

    code = ("import sys, pkgutil, importlib, e2e.localcluster as lc\n"
            "for m in pkgutil.iter_modules(lc.__path__):\n"
            "    importlib.import_module(f'e2e.localcluster.{m.name}')\n"
            "assert 'e2e.kindcluster' not in sys.modules, 'e2e.localcluster imported e2e.kindcluster'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=Path(__file__).resolve().parents[2])



@pytest.mark.timeout(60)
def test_a_second_engine_user_waits_for_the_first_to_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`stop` removes every container of the engine, so a second user (make test's prepare step, the demo)
    must not start it while the first runs: it waits, says for whom, and goes on once the first stops."""
    import os
    import sys
    import time

    from e2e.kindcluster.engine import _engine_lock

    monkeypatch.setenv("RTJ_CACHE", str(tmp_path))
    first = _engine_lock("rtj-test")
    err = tmp_path / "second.err"
    code = "from e2e.kindcluster.engine import _engine_lock; _engine_lock('rtj-test'); print('got it')"
    with err.open("w") as sink:
        second = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "RTJ_CACHE": str(tmp_path)},
                                  stdout=subprocess.PIPE, stderr=sink, text=True)
    try:
        deadline = time.monotonic() + 30
        while second.poll() is None and "waiting" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert second.poll() is None, err.read_text()  # still waiting while the first holds the engine
        assert f"in use (pid {os.getpid()}" in err.read_text()
        first.close()
        out, _ = second.communicate(timeout=30)
        assert second.returncode == 0 and out.strip() == "got it", err.read_text()
        assert "engine free after" in err.read_text()
    finally:
        first.close()
        if second.poll() is None:
            second.kill()
