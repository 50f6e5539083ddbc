"""The one rule that says whether a step directory is a complete checkpoint, over any `StoreReader`.

DCP writes `.metadata` last, but a reused directory, `sync_files=False` or an eventually consistent store can
still leave a `.metadata` beside missing shards, so completeness is checked, not trusted: `.metadata` must parse
(with the restricted reader, size-capped) and every file it references must hold at least offset+length bytes.
With the job's lineage, a directory a fenced attempt wrote is refused too (see lineage.py), and so is one a
trainer marked corrupt (`CORRUPT_FILE`: its bytes did not match its checksum manifest; only its presence is
checked). Every failure is a verdict with a reason; messages name the step directory and validated shard names,
never file contents.
"""

from __future__ import annotations

import posixpath
import re
from collections import OrderedDict
from collections.abc import Hashable

from resilient_contract import dcp_metadata, lineage
from resilient_contract.storage.base import StoreReader
from resilient_contract.storage.errors import StorageError, StoreUnavailable, UnsafeEntry, errno_name
from resilient_contract.storage.listing import Verdict
from resilient_contract.storage.names import CORRUPT_FILE, METADATA_FILE, parse_step_dir, step_dir_attempt

MAX_SHARD_FILES = 100_000
_SAFE_NAME_RE = re.compile(r"[A-Za-z0-9_.\-/]{1,128}")  # a shard name we may echo in a message


def _shard_label(rel: str) -> str:
    return f"shard {rel}" if _SAFE_NAME_RE.fullmatch(rel) else "a shard with an unprintable name"


def check_step(store: StoreReader, name: str, limits: dcp_metadata.Limits = dcp_metadata.DEFAULT_LIMITS,
               rule: lineage.Lineage | None = None) -> Verdict:
    """The completeness rule, in one place. Storage trouble becomes a verdict, never an exception (except a
    `StoreUnavailable`: the store itself failed, so nothing may be concluded about the step).

    With `rule` (the job's lineage), a directory a fenced attempt wrote is refused too (see lineage.py)."""
    step = parse_step_dir(name)
    if step is None:
        raise ValueError(f"{name!r} is not a step directory")
    path = store.join(name)
    try:
        writer = _writer(store, name)
        reserved = step_dir_attempt(name)
        if reserved is not None and (writer is None or writer[1] != reserved):
            return Verdict(step, path, False, f"the directory is reserved for attempt {reserved} but holds no "
                           "writer token of that attempt")
        reason = _incomplete_because(store, name, limits)
        if reason is None and store.entry(posixpath.join(name, CORRUPT_FILE)) is not None:
            # a trainer read it and found bytes that do not match its checksums: never a resume source again
            return Verdict(step, path, False, f"a trainer found its content does not match its checksums "
                           f"({CORRUPT_FILE})", corrupt=True)
        # Complete, yet written by an attempt fenced before this step was: its .metadata came after the fence
        # (the decision took the newest complete checkpoint, older than this one), so a cut-off gang wrote it.
        if rule is not None and (refused := rule.refusal(step, writer)):
            if reason is None:
                return Verdict(step, path, False, refused, fenced_writer=writer[1] if writer else None)
            if store.entry(posixpath.join(name, lineage.REFUSED_FILE)) is not None:
                # the fenced gang tried to save this step and gave up on finding the newer attempt's mark
                return Verdict(step, path, False, f"{refused}; it found the newer mark and stopped",
                               fenced_writer=writer[1] if writer else None)
    except UnsafeEntry as exc:
        reason = f"the step directory is {exc.kind}"
    except StoreUnavailable:
        raise
    except StorageError as exc:
        reason = str(exc)
    except OSError as exc:
        reason = f"the step directory is unreadable ({errno_name(exc)})"
    return Verdict(step, path, reason is None, reason or "")


def _writer(store: StoreReader, name: str) -> tuple[str, int] | None:
    try:
        return lineage.parse_writer(store.read_bytes(posixpath.join(name, lineage.WRITER_FILE),
                                                     lineage.MAX_TOKEN_BYTES))
    except UnsafeEntry:
        return None  # a token that is not a small regular file is no token


def _incomplete_because(store: StoreReader, name: str, limits: dcp_metadata.Limits) -> str | None:
    meta_rel = posixpath.join(name, METADATA_FILE)
    meta = store.entry(meta_rel)
    if meta is None:
        return "no .metadata (save incomplete or in progress)"
    if meta.kind == "symlink":
        return ".metadata is a symlink (not followed)"
    if meta.kind != "file":
        return ".metadata is not a regular file (a FIFO, socket, device or directory)"
    if meta.size > limits.max_bytes:
        return f".metadata is larger than the {limits.max_bytes}-byte cap"
    key = (meta.identity, limits)
    cached = _PARSED.get(key)
    if cached is not None:
        _PARSED.move_to_end(key)
        return cached if isinstance(cached, str) else _shards_missing(store, name, cached)
    try:
        data = store.read_bytes(meta_rel, limits.max_bytes)
    except UnsafeEntry as exc:
        return f".metadata is {exc.kind}" if exc.kind != "too large" else f".metadata is larger than the " \
                                                                          f"{limits.max_bytes}-byte cap"
    if data is None:
        return "no .metadata (save incomplete or in progress)"
    verdict = _parse_needed(data, limits)
    after = store.entry(meta_rel)
    if after is not None and (after.identity, limits) == key:  # unchanged while parsed: remember what it
        _PARSED[key] = verdict  # references, or why not
        while len(_PARSED) > MAX_PARSED_CACHED:
            _PARSED.popitem(last=False)
    return verdict if isinstance(verdict, str) else _shards_missing(store, name, verdict)


def _parse_needed(data: bytes, limits: dcp_metadata.Limits) -> dict[str, int] | str:
    """What a `.metadata` needs (shard -> bytes), or why it is refused."""
    try:
        entries = dcp_metadata.storage_entries(data, limits)
    except dcp_metadata.UnsafeMetadata as exc:
        return f"unsafe .metadata rejected without running it: {exc}"
    except dcp_metadata.MalformedMetadata as exc:
        return str(exc)
    needed: dict[str, int] = {}
    for entry in entries:
        rel = posixpath.normpath(entry.relative_path)
        if rel.startswith(("/", "..")) or rel == "." or "\x00" in rel:
            return ".metadata references a file outside the checkpoint"
        needed[rel] = max(needed.get(rel, 0), entry.offset + entry.length)
        if len(needed) > MAX_SHARD_FILES:
            return f".metadata references more than {MAX_SHARD_FILES} shard files"
    return needed


# Parsed `.metadata` by its entry's identity (a file's device, inode, size and times; an object's ETag): a poll
# of an unchanged checkpoint re-checks its shards only. Parsing is the costly part (a pure-Python reader, ~2 MB/s
# per core). A refusal (malformed, unsafe) is remembered the same way: a costly-to-reject file is parsed once.
MAX_PARSED_CACHED = 64
_PARSED: OrderedDict[tuple[Hashable, dcp_metadata.Limits], dict[str, int] | str] = OrderedDict()


def _shards_missing(store: StoreReader, name: str, needed: dict[str, int]) -> str | None:
    for rel, end in sorted(needed.items()):
        label = _shard_label(rel)
        try:
            found = store.entry(posixpath.join(name, rel))
        except UnsafeEntry as exc:
            return f"{label} is inside a directory that is {exc.kind}"
        if found is None:
            return f"{label} is missing"
        if found.kind == "symlink":
            return f"{label} is a symlink (not followed)"
        if found.kind != "file":
            return f"{label} is not a regular file"
        if found.size < end:
            return f"{label} is truncated ({found.size} bytes, needs {end})"
    return None
