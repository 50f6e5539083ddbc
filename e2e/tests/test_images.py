"""The images built from our Dockerfiles (buildah, no Docker) run as the chart and the example job expect.

- both images build, or come from the cache keyed by their inputs;
- the operator image has no torch and starts as uid 65532 on a read-only root filesystem;
- the trainer's CPU test variant (no triton, only the CUDA libraries torch links) has its entrypoint, and two
  ranks all_reduce over gloo;
- a registry serves them: a node's containerd pulls the operator image through hosts.toml, by the name pods use.

A cold run builds the base and both images (minutes, see e2e/README.md); a warm run takes them from the cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e import images
from e2e.images import ImageRef

pytestmark = [
    pytest.mark.cluster, pytest.mark.own_cluster, pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="buildah, runc and containerd need root"),
]


@pytest.fixture(scope="module")
def built() -> Iterator[dict[str, ImageRef]]:
    yield images.ensure_images(["operator", "trainer-cpu"])


@pytest.mark.timeout(1800)
def test_images_build_or_come_from_the_cache(built: dict[str, ImageRef]) -> None:
    for name, image in built.items():
        assert image.archive.is_file() and image.digest.startswith("sha256:"), name
    assert built["operator"].ref.endswith("/resilient-training-operator:" + images._app_version())
    # The cache answers a second time without a build: same archive, same digest.
    again = images.ensure_images(["operator"])["operator"]
    assert again == built["operator"]


@pytest.mark.timeout(120)
def test_operator_image_has_no_torch_and_runs_as_65532_on_a_read_only_root(built: dict[str, ImageRef]) -> None:
    image = built["operator"]
    config = images.image_config(image.image_id)
    assert config["User"] == "65532:65532" and config["Entrypoint"] == ["python", "-m", "resilient_operator"]
    # What the entrypoint imports (kopf, the handlers, the contracts), as the image's user; /tmp is the chart's
    # emptyDir, the root stays read-only.
    probe = ("import os, importlib.util, resilient_operator.__main__; "
             "print(os.getuid(), os.getgid(), importlib.util.find_spec('torch') is None); "
             "open('/tmp/ok', 'w').write('tmp is writable'); open('/root-write', 'w')")
    result = images.run_container(image, ["python", "-c", probe])
    assert result.stdout.split() == ["65532", "65532", "True"], result.stdout + result.stderr
    assert "Read-only file system: '/root-write'" in result.stderr, result.stderr


@pytest.mark.timeout(180)
def test_trainer_cpu_image_all_reduces_over_gloo_on_two_ranks(built: dict[str, ImageRef]) -> None:
    image = built["trainer-cpu"]
    listing = images.run_container(image, ["sh", "-c", "command -v rtj-launch; id -u; "
                                         "python -c 'import importlib.util as u; print(u.find_spec(\"triton\"))'"])
    assert listing.stdout.split() == ["/usr/local/bin/rtj-launch", "1000", "None"], listing.stdout + listing.stderr
    script = (
        "import os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.tensor([float(dist.get_rank() + 1)])\n"
        "dist.all_reduce(t)\n"
        "os.write(1, f'rank {dist.get_rank()} sum {t.item()}\\n'.encode())  # one write: ranks share stdout\n"
        "dist.destroy_process_group()\n")
    result = images.run_container(image, ["sh", "-c", "cat > /tmp/all_reduce.py && torchrun --nproc-per-node=2 "
                                        "--master-addr=127.0.0.1 --master-port=29500 /tmp/all_reduce.py"],
                                  env={"GLOO_SOCKET_IFNAME": "lo"}, stdin=script, timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("rank")) == [
        "rank 0 sum 3.0", "rank 1 sum 3.0"], result.stdout


@pytest.mark.timeout(300)
def test_a_node_pulls_from_the_registry_by_the_name_pods_use(built: dict[str, ImageRef], tmp_path: Path) -> None:
    image = built["operator"]
    with images.Registry.start("127.0.0.1", images.free_port()) as registry, images.scratch_containerd() as node:
        registry.push(image)
        certs = tmp_path / "certs.d"
        images.write_hosts_toml(certs, registry.address)
        node.pull(image.ref, certs)
        assert node.images().get(image.ref) == image.digest
