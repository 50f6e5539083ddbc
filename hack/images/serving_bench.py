"""Measure the two ways of getting an image onto each real node's containerd (needs root).

    python hack/images/serving_bench.py [--image trainer-cpu] [--nodes 2]

(a) one registry (Distribution, plain http) + each node pulling through hosts.toml, as a kubelet would;
(b) `ctr images import` of the OCI archive into each node. Prints push/pull/import seconds and the disk each
node's containerd root takes. The image is built first if it is not cached.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from e2e import images


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="trainer-cpu")
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args()
    started = time.monotonic()
    image = images.ensure_images([args.image])[args.image]
    print(f"ensure_images({args.image!r}): {time.monotonic() - started:.1f} s; archive "
          f"{image.archive.stat().st_size / 1e6:.0f} MB")
    work = Path(tempfile.mkdtemp(prefix="rtj-serving-", dir="/var/tmp"))
    try:
        storage = work / "registry"
        with images.Registry.start("127.0.0.1", images.free_port(), storage=storage) as registry:
            for label in ("cold", "warm"):
                t = time.monotonic()
                registry.push(image)
                print(f"push ({label}): {time.monotonic() - t:.1f} s")
            print(f"registry storage: {images.disk_bytes(storage) / 1e6:.0f} MB (once, shared by all nodes)")
            certs = work / "certs.d"
            images.write_hosts_toml(certs, registry.address)
            for i in range(args.nodes):
                with images.scratch_containerd() as node:
                    t = time.monotonic()
                    node.pull(image.ref, certs)
                    print(f"node {i}: pull {time.monotonic() - t:.1f} s, disk {node.disk_bytes() / 1e6:.0f} MB, "
                          f"digest matches: {node.images().get(image.ref) == image.digest}")
        for i in range(args.nodes):
            with images.scratch_containerd() as node:
                t = time.monotonic()
                node.load(image)
                print(f"node {i}: import {time.monotonic() - t:.1f} s, disk {node.disk_bytes() / 1e6:.0f} MB, "
                      f"digest matches: {node.images().get(image.ref) == image.digest}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
