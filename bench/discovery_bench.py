"""Checkpoint discovery: latency on a big root, in-process versus through the sandbox; RSS under attack.

1. Builds one real DCP checkpoint, copies it into N step directories (hard links keep it cheap) under
   `<mount>/bench/job`, and times discovery (median of repeats) in two cases: the newest is complete,
   and the newest K are partial saves that must be skipped first. Each case is timed in-process
   (`discover`, no sandbox: the old path) and through the operator's `DiscoveryPool` (a worker
   process with its limits), in the same run, from a process that has not imported torch (as the
   operator has not).
2. `.metadata` read throughput (MB/s) of the reader at a git revision (`--before`, the reader as it
   was) and the working tree's, in the same run, on real DCP saves of N small tensors and on an
   FSDP-like `Metadata` (a few hundred tensors x 64 chunks, pickled as DCP's FileSystemWriter does).
3. Plants every attack of tests/hostile in its own root, discovers them all from a torch-free process
   that holds the pool (as the operator does), and prints what each produced, how long it took, and
   that process's peak RSS (VmHWM).

    python bench/discovery_bench.py [--dirs 10000] [--partial 20] [--repeats 7] [--before REV]
    python bench/discovery_bench.py --only throughput [--tensors 20000,100000] [--fsdp 300x64]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_contract import dcp_metadata
from resilient_contract.storage.listing import Listing
from resilient_contract.storage.names import METADATA_FILE, step_dir_name
from resilient_contract.storage.scan import ScanLimits, discover
from resilient_operator.discovery import DiscoveryPool
from resilient_operator.settings import DiscoverySettings


def save_template(path: Path) -> None:
    """A real DCP checkpoint, written by a child process so this one (the timer) never imports torch."""
    script = ("import sys, warnings, torch, torch.distributed.checkpoint as dcp\n"
              "warnings.simplefilter('ignore')\n"
              "dcp.save({'w': torch.randn(256, 256), 'b': torch.randn(256)}, checkpoint_id=sys.argv[1])\n")  # fmt: skip
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=300)


def build(root: Path, template: Path, dirs: int, partial: int) -> None:
    files = sorted(os.listdir(template))
    for step in range(1, dirs + 1):
        dest = root / step_dir_name(step)
        dest.mkdir(parents=True)
        for name in files:
            if step > dirs - partial and name == METADATA_FILE:
                continue
            os.link(template / name, dest / name)


def median_time(fn, repeats: int) -> tuple[float, Listing]:  # type: ignore[no-untyped-def]
    samples, found = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        found = fn()
        samples.append(time.perf_counter() - start)
    assert found is not None
    return statistics.median(samples), found


def latency(args: argparse.Namespace, base: Path, template: Path) -> None:
    print(f"{'case':<38} {'dirs':>6} {'in-process s':>13} {'sandbox s':>10} {'found':>16}")
    for partial in (0, args.partial):
        mount = base / f"mount-{partial}"
        root = mount / "bench" / "job"
        build(root, template, args.dirs, partial)
        config = DiscoverySettings(checkpoint_mount=str(mount))
        pool = DiscoveryPool(config)
        pool.warm()
        limits = ScanLimits(max_steps=config.max_steps)
        inproc, a = median_time(lambda: discover(str(root), str(mount / "bench"), limits), args.repeats)  # noqa: B023
        sandboxed, b = median_time(lambda: pool.discover(str(root), "bench"), args.repeats)  # noqa: B023
        pool.close()
        expected = args.dirs - partial
        assert a == b and b.latest is not None and b.latest.step == expected, (a, b)
        case = "newest complete" if not partial else f"newest {partial} partial, then complete"
        print(f"{case:<38} {args.dirs:>6} {inproc:>13.4f} {sandboxed:>10.4f} {step_dir_name(expected):>16}")
        shutil.rmtree(mount)


_METADATA_WRITER = """
import os, pickle, sys, tempfile, warnings, torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties,
                                                   TensorStorageMetadata)
warnings.simplefilter("ignore")
kind, count, out = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "save":  # a real DCP save of N small tensors
    d = tempfile.mkdtemp()
    dcp.save({f"layers.{i}.w": torch.zeros(4, 4) for i in range(int(count))}, checkpoint_id=d)
    os.replace(os.path.join(d, ".metadata"), out)
else:  # FSDP-like: T tensors, each sharded in C row chunks over C ranks, pickled as FileSystemWriter.finish does
    tensors, chunks = map(int, count.split("x"))
    rows, cols = 64 * chunks, 4096
    state, storage = {}, {}
    for t in range(tensors):
        fqn = f"model.layers.{t // 9}.block.{t % 9}.weight"
        parts = [ChunkStorageMetadata(offsets=torch.Size([r * 64, 0]), sizes=torch.Size([64, cols]))
                 for r in range(chunks)]
        state[fqn] = TensorStorageMetadata(TensorProperties(dtype=torch.bfloat16), torch.Size([rows, cols]), parts)
        for r, part in enumerate(parts):
            where = _StorageInfo(f"__{r}_0.distcp", t * 64 * cols * 2, 64 * cols * 2)
            storage[MetadataIndex(fqn, part.offsets, r)] = where
    with open(out, "wb") as f:
        pickle.dump(Metadata(state_dict_metadata=state, planner_data={k: tuple(k.split(".")) for k in state},
                             storage_data=storage), f)
"""


def reader_at(rev: str) -> object:
    """The `.metadata` reader as it was at a git revision, imported under another name."""
    top = Path(__file__).resolve().parents[1]
    source = subprocess.run(["git", "-C", str(top), "show", f"{rev}:trainer_image/resilient_contract/dcp_metadata.py"],
                            check=True, capture_output=True, timeout=60).stdout  # fmt: skip
    spec = importlib.util.spec_from_loader("dcp_metadata_before", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:dcp_metadata.py", "exec"), module.__dict__)  # our own repository's code
    return module


def throughput(args: argparse.Namespace, base: Path) -> None:
    """MB/s of `storage_entries` on real and FSDP-like `.metadata`, before and after, same run."""
    cases = [("save", n, f"DCP save, {int(n):,} tensors") for n in args.tensors.split(",") if n]
    cases += [("fsdp", spec, f"FSDP-like, {spec.replace('x', ' tensors x ')} chunks") for spec in args.fsdp.split(",")
              if spec]  # fmt: skip
    before = reader_at(args.before) if args.before else None
    limits = dcp_metadata.Limits(max_bytes=64 << 20)
    print(f"\n.metadata read throughput (storage_entries; MB per CPU second of this process, best of "
          f"{args.throughput_repeats}: wall time on a shared machine measures the neighbours)")
    print(f"{'case':<36} {'MB':>6} {'entries':>8} {'before MB/s':>12} {'after MB/s':>11} {'after s':>8}")
    for kind, count, label in cases:
        path = base / f"metadata-{kind}-{count}"
        subprocess.run([sys.executable, "-c", _METADATA_WRITER, kind, count, str(path)], check=True, timeout=1800)
        data = path.read_bytes()
        mb = len(data) / 1e6
        after, entries = best_time(lambda: dcp_metadata.storage_entries(data, limits), args.throughput_repeats)  # noqa: B023
        old = "skipped"
        if before is not None and mb <= args.before_max_mb:
            took, old_entries = best_time(lambda: before.storage_entries(data, limits), 1)  # type: ignore[attr-defined]  # noqa: B023
            assert [tuple(vars(e).values()) for e in old_entries] == [tuple(vars(e).values()) for e in entries]
            old = f"{mb / took:.2f}"
        print(f"{label:<36} {mb:>6.2f} {len(entries):>8} {old:>12} {mb / after:>11.2f} {after:>8.3f}")


def best_time(fn, repeats: int) -> tuple[float, list]:  # type: ignore[no-untyped-def, type-arg]
    best, result = float("inf"), []
    for _ in range(repeats):
        start = time.process_time()
        result = fn()
        best = min(best, time.process_time() - start)
    return best, result


_OPERATOR_SIDE = """
import json, sys, time
from resilient_operator.discovery import DiscoveryPool
from resilient_operator.settings import DiscoverySettings
mount, roots = sys.argv[1], json.loads(sys.argv[2])
pool = DiscoveryPool(DiscoverySettings(checkpoint_mount=mount))
pool.warm()
rows = []
for name, root in roots:
    start = time.monotonic()
    listing = pool.discover(root, "tenant-a")
    took = time.monotonic() - start
    what = listing.reason or (listing.skipped[0].reason if listing.skipped else "")
    found = listing.latest.step if listing.latest else None
    rows.append([name, round(took, 2), found, what])
pool.close()
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")) // 1024
print(json.dumps({"rows": rows, "peak_rss_mib": hwm}))
"""


def attacks_table(base: Path, template: Path) -> None:
    from tests.hostile import attacks
    from tests.hostile.test_hostile_discovery import STEP_ATTACKS

    mount = base / "attacks"
    roots = []
    for i, (name, planter, _) in enumerate(STEP_ATTACKS):
        root = mount / "tenant-a" / f"job{i}"
        root.mkdir(parents=True)
        attacks.plant_genuine(template, root)
        planter(template, root)
        roots.append((name, str(root)))
    slow = mount / "tenant-a" / "slow"
    slow.mkdir()
    attacks.plant_genuine(template, slow)
    attacks.bomb_metadata("million-containers")(template, slow)
    roots += [("bomb-million-containers", str(slow)), ("root-in-other-namespace", str(mount / "tenant-b" / "x")),
              ("root-/etc", "/etc"), ("root-with-NUL", str(mount / "tenant-a" / "a\x00b"))]  # fmt: skip
    out = subprocess.run([sys.executable, "-c", _OPERATOR_SIDE, str(mount), json.dumps(roots)], check=True,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n{'attack (genuine checkpoint = step 1)':<34} {'s':>5} {'found':>5}  what discovery reported")
    for name, took, found, what in result["rows"]:
        print(f"{name:<34} {took:>5} {found!s:>5}  {what[:90]}")
    print(f"\noperator-side peak RSS (VmHWM) over {len(roots)} hostile roots: {result['peak_rss_mib']} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dirs", type=int, default=10_000)
    parser.add_argument("--partial", type=int, default=20, help="must stay below RTJ_DISCOVERY_MAX_STEPS (32)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", choices=("latency", "throughput", "attacks"), help="run one part only")
    parser.add_argument("--tensors", default="2000,20000,100000", help="real DCP saves of this many tensors")
    parser.add_argument("--fsdp", default="300x64,800x64", help="FSDP-like metadata: TENSORSxCHUNKS, comma-separated")
    parser.add_argument("--before", default="fd9d8d9", help="git revision whose reader is 'before' ('' to skip)")
    parser.add_argument("--before-max-mb", type=float, default=6.0, help="time the old reader only up to this size")
    parser.add_argument("--throughput-repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        template = base / "template"
        if args.only in (None, "latency", "attacks"):
            save_template(template)
        if args.only in (None, "latency"):
            latency(args, base, template)
        if args.only in (None, "throughput"):
            throughput(args, base)
        if args.only in (None, "attacks"):
            attacks_table(base, template)


if __name__ == "__main__":
    main()
