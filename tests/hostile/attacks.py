"""Hostile checkpoint trees and pickle bombs, as a tenant with write access to its own root would make them.

Each attack writes into a root that also holds a genuine, older checkpoint (`genuine`), so a test can
check both that the attack is contained and that the real checkpoint is still found. Used by
tests/hostile and bench/discovery_bench.py.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
import socket
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from resilient_contract.storage.names import METADATA_FILE, step_dir_name

GENUINE_STEP = 1
HOSTILE_STEP = 2
DCP = "torch.distributed.checkpoint.metadata"


def op_global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def proto(body: bytes) -> bytes:
    return b"\x80\x04" + body + b"."


# ---- pickle bombs (each a few bytes to a few MB) -----------------------------------------------------
def memo_index_bomb() -> bytes:
    """LONG_BINPUT at index 2**32-16: the C unpickler grows its memo array to that size."""
    return proto(b"]" + b"r" + struct.pack("<I", 0xFFFFFFF0))


def shared_reference_bomb(levels: int = 28) -> bytes:
    """a=[], b=[a,a], c=[b,b], ...: tiny on disk, 2**levels nodes when repr'd or walked as a tree."""
    body = b"]q\x000"
    for i in range(1, levels):
        body += b"h" + bytes([i - 1]) + b"h" + bytes([i - 1]) + b"\x86q" + bytes([i]) + b"0"
    return _as_storage_value(body + b"h" + bytes([levels - 1]))


def deep_nesting_bomb(depth: int = 20_000) -> bytes:
    """Metadata(Metadata(Metadata(...))): allowed globals nested far beyond any real metadata."""
    cls = op_global(DCP, "Metadata")
    return proto(cls * depth + b"N\x85R" + b"\x85R" * (depth - 1))


def fresh_class_bomb(count: int = 50_000) -> bytes:
    """A distinct allow-listed global name per lookup: the old unpickler minted a class for each."""
    return proto(b"".join(op_global(DCP, f"C{i}") + b"0" for i in range(count)) + b"N")


def list_bomb(count: int = 1_500_000) -> bytes:
    """Millions of tiny containers: a few MB on disk, an allocation storm when built."""
    return proto(b"]" + b"]a" * count)


def hash_bomb(width: int = 50_000, uses: int = 20_000) -> bytes:
    """One wide tuple used as a dict key again and again: every insert re-hashes all of it."""
    tup = b"(" + b"K\x01" * width + b"tq\x00"
    return proto(b"}" + tup + b"0" + b"(" + (b"h\x00N" * uses) + b"u")


def cycle_bomb() -> bytes:
    """A list that contains itself: recursive consumers never finish."""
    return proto(b"]q\x00h\x00a")


def huge_int_bomb() -> bytes:
    """LONG4 of 4 MB: an integer whose every arithmetic or str() costs megabytes."""
    n = 4 << 20
    return proto(b"\x8b" + struct.pack("<I", n) + b"\x7f" * n)


def poison_bomb() -> bytes:
    """GLOBAL pathlib.PurePosixPath then BUILD with slot state: setattr on the real class if it is returned."""
    state = b"(N}(X\x07\x00\x00\x00__str__X\x04\x00\x00\x00evilX\x04\x00\x00\x00rootX\x04\x00\x00\x00evilut"
    return proto(op_global("pathlib", "PurePosixPath") + state + b"b")


def poison_record_bomb() -> bytes:
    """BUILD on an allow-listed record with a __class__/__dict__ state: must stay data."""
    state = b"}(X\t\x00\x00\x00__class__" + op_global("pathlib", "PurePosixPath") + b"X\x08\x00\x00\x00__dict__}u"
    return proto(op_global(DCP, "Metadata") + b")\x81" + state + b"b")


class _RunsCommand:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/rtj-hostile-pwned",))


def code_exec_bomb() -> bytes:
    return pickle.dumps(_RunsCommand())


def _as_storage_value(value_ops: bytes) -> bytes:
    """Metadata(storage_data={key: <value>}): the bomb sits where a real storage record would."""
    meta = op_global(DCP, "Metadata") + b")\x81"
    return proto(meta + b"}(X\x0c\x00\x00\x00storage_data}(X\x01\x00\x00\x00k" + value_ops + b"uub")


BOMBS: dict[str, Callable[[], bytes]] = {
    "memo-index": memo_index_bomb,
    "shared-reference": shared_reference_bomb,
    "deep-nesting": deep_nesting_bomb,
    "fresh-class-per-global": fresh_class_bomb,
    "million-containers": list_bomb,
    "hash-cpu": hash_bomb,
    "self-cycle": cycle_bomb,
    "huge-int": huge_int_bomb,
    "poison-class-build": poison_bomb,
    "poison-record-build": poison_record_bomb,
    "os-system": code_exec_bomb,
}


# ---- trees ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tree:
    """One tenant's root: where it is, and the genuine checkpoint discovery must still find (if any)."""

    root: Path
    genuine: int | None = GENUINE_STEP


def plant_genuine(template: Path, root: Path, step: int = GENUINE_STEP) -> Path:
    dest = root / step_dir_name(step)
    shutil.copytree(template, dest)
    return dest


def hostile_step(template: Path, root: Path) -> Path:
    """A newer step directory, a copy of the genuine one, for an attack to spoil."""
    return plant_genuine(template, root, HOSTILE_STEP)


def fifo_metadata(template: Path, root: Path) -> None:
    meta = hostile_step(template, root) / METADATA_FILE
    meta.unlink()
    os.mkfifo(meta)


def socket_metadata(template: Path, root: Path) -> None:
    meta = hostile_step(template, root) / METADATA_FILE
    meta.unlink()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(meta))
    sock.close()


def device_metadata(template: Path, root: Path) -> None:
    """A character device named .metadata (a /dev/zero twin); needs CAP_MKNOD, else a FIFO stands in."""
    meta = hostile_step(template, root) / METADATA_FILE
    meta.unlink()
    try:
        os.mknod(meta, 0o644 | stat.S_IFCHR, os.makedev(1, 5))
    except PermissionError:
        os.mkfifo(meta)


def directory_metadata(template: Path, root: Path) -> None:
    meta = hostile_step(template, root) / METADATA_FILE
    meta.unlink()
    meta.mkdir()


def symlink_metadata(template: Path, root: Path) -> None:
    meta = hostile_step(template, root) / METADATA_FILE
    meta.unlink()
    meta.symlink_to("/etc/passwd")


def symlink_step_dir(template: Path, root: Path, target: Path) -> None:
    """A step directory that is a symlink to another tenant's checkpoint."""
    (root / step_dir_name(HOSTILE_STEP)).symlink_to(target)


def symlink_loop_step(template: Path, root: Path) -> None:
    link = root / step_dir_name(HOSTILE_STEP)
    link.symlink_to(link.name)


def symlink_shard(template: Path, root: Path, target: Path) -> None:
    """A shard replaced by a symlink to a big file outside the checkpoint (its size must not leak)."""
    step = hostile_step(template, root)
    shard = sorted(step.glob("*.distcp"))[0]
    shard.unlink()
    shard.symlink_to(target)


def sparse_huge_metadata(template: Path, root: Path, size: int = 600 << 20) -> None:
    meta = hostile_step(template, root) / METADATA_FILE
    with open(meta, "r+b") as f:
        f.truncate(size)


def sparse_huge_shard(template: Path, root: Path, size: int = 1 << 40) -> None:
    """A 1 TiB sparse shard: complete by size; it must be stat'ed, never read."""
    step = hostile_step(template, root)
    shard = sorted(step.glob("*.distcp"))[0]
    with open(shard, "r+b") as f:
        f.truncate(size)


def unreadable_step_dir(template: Path, root: Path) -> None:
    hostile_step(template, root).chmod(0)


def bomb_metadata(name: str) -> Callable[[Path, Path], None]:
    def plant(template: Path, root: Path) -> None:
        (hostile_step(template, root) / METADATA_FILE).write_bytes(BOMBS[name]())

    plant.__name__ = f"bomb_{name}"
    return plant


def many_step_dirs(template: Path, root: Path, count: int = 10_000) -> None:
    """Thousands of empty step directories above the genuine checkpoint (beyond the newest-K window)."""
    for step in range(HOSTILE_STEP, HOSTILE_STEP + count):
        (root / step_dir_name(step)).mkdir()


def bit_flips(metadata: bytes, count: int, seed: int, flips: int = 3) -> list[bytes]:
    """`count` copies of a real .metadata with `flips` random bits flipped each (seeded, reproducible)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        data = bytearray(metadata)
        for _ in range(flips):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        out.append(bytes(data))
    return out
