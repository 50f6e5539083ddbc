"""Checkpoint discovery over 10,000 step prefixes on a real S3 server (SeaweedFS) vs a local filesystem, same run.

Builds one real DCP checkpoint (in a child process: this one never imports torch, as the operator does not),
then the same tree twice: as step directories under a local mount and as step prefixes in a bucket. Of
`--dirs` steps, the newest `--partial` are partial saves (shards, no `.metadata`), the one below them is
the complete checkpoint discovery must find, and every older step holds one shard (never examined: only the
newest K are). Each case is timed (median of `--repeats`) in-process (`scan`, counting S3 requests)
and through the operator's `DiscoveryPool` (a sandboxed worker; for s3:// the keys come from a mounted
Secret's files, as in a cluster). In-process runs start cold (no parsed-`.metadata` cache); the pool runs
as the operator polls (its worker remembers an unchanged `.metadata`, so later polls skip that GET).

    python bench/s3_discovery_bench.py [--dirs 10000] [--partial 0,20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e.s3server import Identity, S3Server
from resilient_contract.storage.completeness import _PARSED
from resilient_contract.storage.listing import Listing
from resilient_contract.storage.names import METADATA_FILE, step_dir_name
from resilient_contract.storage.s3 import S3Credentials, S3Store, parse_uri
from resilient_contract.storage.scan import ScanLimits, discover, scan
from resilient_operator.discovery import DiscoveryPool
from resilient_operator.settings import DiscoverySettings, ObjectStoreArea

BUCKET = "bench"


def save_template(path: Path) -> dict[str, bytes]:
    script = ("import sys, warnings, torch, torch.distributed.checkpoint as dcp\n"
              "warnings.simplefilter('ignore')\n"
              "dcp.save({'w': torch.randn(256, 256), 'b': torch.randn(256)}, checkpoint_id=sys.argv[1])\n")  # fmt: skip
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=300)
    return {name: (path / name).read_bytes() for name in sorted(os.listdir(path))}


def tree(template: dict[str, bytes], dirs: int, partial: int) -> dict[str, bytes]:
    """Relative path -> bytes of the whole root."""
    shard = next(n for n in template if n.endswith(".distcp"))
    complete = dirs - partial
    out: dict[str, bytes] = {}
    for step in range(1, dirs + 1):
        name = step_dir_name(step)
        if step < complete:
            out[f"{name}/{shard}"] = template[shard]
        else:
            out.update({f"{name}/{f}": data for f, data in template.items()
                        if step == complete or f != METADATA_FILE})  # fmt: skip
    return out


def write_local(root: Path, objects: dict[str, bytes]) -> None:
    for rel, data in objects.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def upload(fs: object, prefix: str, objects: dict[str, bytes], batch: int = 2000) -> None:
    items = list(objects.items())
    for i in range(0, len(items), batch):
        fs.pipe({f"{prefix}/{rel}": data for rel, data in items[i:i + batch]})  # type: ignore[attr-defined]


def median(fn: Callable[[], tuple[Listing, int]], repeats: int) -> tuple[float, Listing, int]:
    samples, found, requests = [], None, 0
    for _ in range(repeats):
        start = time.perf_counter()
        found, requests = fn()
        samples.append(time.perf_counter() - start)
    assert found is not None
    return statistics.median(samples), found, requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dirs", type=int, default=10_000)
    parser.add_argument("--partial", default="0,20")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="rtj-s3-bench-"))
    reader = Identity.for_bucket("operator-ro", BUCKET, read_only=True)
    server = S3Server.start(base / "seaweedfs", identities=[reader])
    try:
        server.create_bucket(BUCKET)
        admin = server.filesystem()
        template = save_template(base / "template")
        secrets = base / "secrets" / "operator-ro"
        secrets.mkdir(parents=True)
        (secrets / "AWS_ACCESS_KEY_ID").write_text(reader.access_key)
        (secrets / "AWS_SECRET_ACCESS_KEY").write_text(reader.secret_key)
        mount = base / "mount"
        area = ObjectStoreArea(f"s3://{BUCKET}/bench", ("bench",), "operator-ro", server.endpoint)
        config = DiscoverySettings(checkpoint_mount=str(mount), object_secrets_dir=str(secrets.parent),
                                   object_areas=(area,))  # fmt: skip
        creds = S3Credentials(reader.access_key, reader.secret_key, server.endpoint,
                              timeout_s=config.timeout_seconds / 4)  # fmt: skip
        limits = ScanLimits(max_steps=config.max_steps)
        pool = DiscoveryPool(config)
        pool.warm()
        print(f"SeaweedFS {server.endpoint}; {args.dirs} step prefixes/directories; median of {args.repeats}; "
              f"newest K={config.max_steps} examined")
        print(f"{'case':<34} {'store':<6} {'in-process s':>12} {'requests':>9} {'sandbox s':>10} {'found':>16}")
        for partial in (int(p) for p in args.partial.split(",")):
            objects = tree(template, args.dirs, partial)
            local = mount / "bench" / f"job-{partial}"
            write_local(local, objects)
            uri = f"s3://{BUCKET}/bench/job-{partial}"
            started = time.monotonic()
            upload(admin, parse_uri(uri).bucket + "/" + parse_uri(uri).prefix, objects)
            uploaded = time.monotonic() - started
            expected = args.dirs - partial
            case = "newest complete" if not partial else f"newest {partial} partial, then complete"

            def local_scan(root: Path = local) -> tuple[Listing, int]:
                _PARSED.clear()
                return discover(str(root), str(mount / "bench"), limits), 0

            def s3_scan(root: str = uri) -> tuple[Listing, int]:
                _PARSED.clear()
                store = S3Store(root, creds)
                try:
                    return scan(store, limits), store.requests
                finally:
                    store.close()

            for store, inproc, root in (("local", local_scan, str(local)), ("s3", s3_scan, uri)):
                took, found, requests = median(inproc, args.repeats)
                boxed, answer, _ = median(lambda r=root: (pool.discover(r, "bench"), 0), args.repeats)  # type: ignore[misc]
                assert found.latest is not None and found.latest.step == expected, found
                assert answer.latest is not None and answer.latest.step == expected, answer
                shown = str(requests) if store == "s3" else "-"
                print(f"{case:<34} {store:<6} {took:>12.4f} {shown:>9} {boxed:>10.4f} "
                      f"{step_dir_name(found.latest.step):>16}")
            print(f"  (uploading {len(objects)} objects took {uploaded:.1f} s)")
        pool.close()
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
