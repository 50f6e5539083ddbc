"""The checkpoint layout, and the one rule that says whether a checkpoint is complete.

Layout: `<root>/step-<10-digit step>/` holding DCP shard files and `.metadata`. DCP writes `.metadata`
last, but a reused directory, `sync_files=False` or an eventually consistent store can still leave a
`.metadata` beside missing shards, so completeness is checked, not trusted: `.metadata` must parse
(with the restricted reader) and every file it references must hold at least offset+length bytes.

Everything under a root is written by user pods, so it is read as hostile input: no symlink below the
root is followed, files must be regular (`lstat`, then `O_NOFOLLOW|O_NONBLOCK` and `fstat`, so a FIFO
never blocks), `.metadata` is size-capped, only the newest K step directories are examined, and every
failure becomes a verdict or a `Listing.error` with a reason. Messages name the step directory and
validated shard names, never file contents or anything outside the checkpoint. `discover(uri, area)`
also refuses a root outside its namespace's storage area before touching the filesystem.

Storage goes through `CheckpointStore`: a mounted path (`LocalStore`) or an object store (`s3://bucket/prefix`,
`s3store.S3Store`), under the same rule. Torch-free: the operator imports this module (and runs
`discover` in a sandboxed worker).
"""

from __future__ import annotations

import errno
import heapq
import os
import posixpath
import re
import stat
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from resilient_contract import dcp_metadata, lineage

METADATA_FILE = ".metadata"
STEP_DIR_PREFIX = "step-"
STEP_DIGITS = 10
# `step-<10 digits>`, or `step-<10 digits>.a<attempt>` when another attempt already held the plain name
# (see lineage.py: no directory is ever shared by two attempts).
_STEP_DIR_RE = re.compile(rf"^{STEP_DIR_PREFIX}([0-9]{{{STEP_DIGITS}}})(?:\.a([0-9]{{1,9}}))?$", re.ASCII)
_SAFE_NAME_RE = re.compile(r"[A-Za-z0-9_.\-/]{1,128}")  # a shard name we may echo in a message
MAX_SHARD_FILES = 100_000

# Listing.reason: why discovery could not say which checkpoint is the latest (for a condition's reason).
REASON_ROOT_MISSING = "CheckpointRootMissing"
REASON_STORAGE_UNREADABLE = "StorageUnreadable"
REASON_INVALID_ROOT = "InvalidCheckpointRoot"
REASON_ROOT_OUTSIDE_AREA = "RootOutsideNamespaceArea"
REASON_ROOT_SYMLINK = "CheckpointRootSymlink"
REASON_DISCOVERY_TIMED_OUT = "DiscoveryTimedOut"
REASON_DISCOVERY_FAILED = "DiscoveryFailed"
# The operator's discovery workers were all busy, or one was still starting: nothing is known about the root
# (it is not blamed, not held back), and discovery is simply tried again soon.
REASON_DISCOVERY_BUSY = "DiscoveryBusy"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def step_dir_name(step: int, attempt: int | None = None) -> str:
    """`step-0000001200` (fixed width so names sort in step order); `step-0000001200.a3` for attempt 3's save
    of a step whose plain name another attempt already holds."""
    if step < 0 or step >= 10**STEP_DIGITS:
        raise ValueError(f"step {step} does not fit the {STEP_DIGITS}-digit layout")
    base = f"{STEP_DIR_PREFIX}{step:0{STEP_DIGITS}d}"
    return base if attempt is None else f"{base}.a{attempt}"


def step_dir_attempt(name: str) -> int | None:
    """The attempt a `step-<digits>.a<attempt>` name is reserved for; None for a plain name."""
    match = _STEP_DIR_RE.match(name)
    return int(match.group(2)) if match and match.group(2) else None


def parse_step_dir(name: str) -> int | None:
    """The step a directory name stands for, or None if the name is not a checkpoint directory."""
    match = _STEP_DIR_RE.match(name)
    return int(match.group(1)) if match else None


class StorageError(OSError):
    """The checkpoint root cannot be read (permission denied, unsupported scheme, not a directory)."""

    reason = REASON_STORAGE_UNREADABLE

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason:
            self.reason = reason


class RootMissing(StorageError):
    """The checkpoint root does not exist: normal before the first save, alarming after one."""

    reason = REASON_ROOT_MISSING


class StoreUnavailable(StorageError):
    """The store itself failed (an object store's endpoint, bucket or keys), not one entry: the whole discovery
    is an error to retry, never a skipped checkpoint (that would resume from an older one)."""


class UnsafeEntry(StorageError):
    """An entry below the root that is not followed or read: a symlink, FIFO, socket, device, oversize file."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "error")


class CheckpointStore(Protocol):
    """The storage seam: the few reads discovery needs. Paths are relative to the checkpoint root."""

    uri: str

    def list_dirs(self) -> list[str]: ...

    def iter_entries(self) -> Iterator[tuple[str, str]]: ...

    def stat_entry(self, relpath: str) -> os.stat_result | None: ...

    def read_bytes(self, relpath: str, limit: int) -> bytes | None: ...

    def size(self, relpath: str) -> int | None: ...

    def join(self, relpath: str) -> str: ...

    def close(self) -> None: ...


class LocalStore:
    """A checkpoint root on a mounted filesystem (an RWX volume shared by the workers).

    Nothing below the root is followed if it is a symlink. With `dir_fd` (from `open_root`) every
    read is relative to that open directory, so swapping a path component for a symlink after the
    check changes nothing.
    """

    def __init__(self, root: str, dir_fd: int | None = None) -> None:
        if "\x00" in root:
            raise StorageError("checkpoint root contains a NUL byte", REASON_INVALID_ROOT)
        self.root = root
        self.uri = root
        self._fd = dir_fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @contextmanager
    def _root_fd(self) -> Iterator[int]:
        if self._fd is not None:
            yield self._fd
            return
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RootMissing(f"checkpoint root {self.root} does not exist") from None
        except PermissionError:
            raise StorageError(f"checkpoint root {self.root} is not readable (permission denied)") from None
        except NotADirectoryError:
            raise StorageError(f"checkpoint root {self.root} is not a directory") from None
        except OSError as exc:
            raise StorageError(f"checkpoint root {self.root} cannot be opened ({_errno_name(exc)})") from None
        try:
            yield fd
        finally:
            os.close(fd)

    def iter_entries(self) -> Iterator[tuple[str, str]]:
        """(name, kind) of every entry in the root, kind one of "dir", "symlink", "other"; never follows."""
        with self._root_fd() as fd:
            try:
                with os.scandir(fd) as it:
                    for entry in it:
                        if entry.is_symlink():
                            yield entry.name, "symlink"
                        elif entry.is_dir(follow_symlinks=False):
                            yield entry.name, "dir"
                        else:
                            yield entry.name, "other"
            except PermissionError:
                raise StorageError(f"checkpoint root {self.root} is not readable (permission denied)") from None
            except OSError as exc:
                raise StorageError(f"checkpoint root {self.root} cannot be listed ({_errno_name(exc)})") from None

    def list_dirs(self) -> list[str]:
        return [name for name, kind in self.iter_entries() if kind == "dir"]

    @contextmanager
    def _parent(self, relpath: str) -> Iterator[tuple[int, str] | None]:
        """An open fd of `relpath`'s directory (walked without following symlinks) and the leaf name."""
        parts = relpath.split("/")
        if any(p in ("", ".", "..") or "\x00" in p for p in parts):
            raise UnsafeEntry("outside the checkpoint")
        with self._root_fd() as root_fd:
            fd, opened = root_fd, []
            try:
                for part in parts[:-1]:
                    try:
                        fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    except FileNotFoundError:
                        yield None
                        return
                    except (NotADirectoryError, OSError) as exc:
                        raise UnsafeEntry(_classify(exc, part, fd)) from None
                    opened.append(fd)
                yield fd, parts[-1]
            finally:
                for each in opened:
                    os.close(each)

    def stat_entry(self, relpath: str) -> os.stat_result | None:
        """`lstat` of an entry below the root (None if absent); a symlinked directory on the way raises."""
        with self._parent(relpath) as found:
            if found is None:
                return None
            fd, leaf = found
            try:
                return os.stat(leaf, dir_fd=fd, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                return None
            except OSError as exc:
                raise UnsafeEntry(_classify(exc, leaf, fd)) from None

    def read_bytes(self, relpath: str, limit: int) -> bytes | None:
        """A regular file's bytes (None if absent); symlinks, FIFOs, devices and files over `limit` raise."""
        with self._parent(relpath) as found:
            if found is None:
                return None
            parent, leaf = found
            try:
                fd = os.open(leaf, _FILE_FLAGS, dir_fd=parent)
            except (FileNotFoundError, IsADirectoryError):
                return None
            except OSError as exc:
                raise UnsafeEntry(_classify(exc, leaf, parent)) from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise UnsafeEntry("not a regular file")
                if st.st_size > limit:
                    raise UnsafeEntry("too large")
                chunks, left = [], limit + 1
                while left > 0:
                    chunk = os.read(fd, min(left, 1 << 20))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    left -= len(chunk)
                if left <= 0:
                    raise UnsafeEntry("too large")  # it grew while we read
                return b"".join(chunks)
            finally:
                os.close(fd)

    def size(self, relpath: str) -> int | None:
        """A regular file's size; None if absent, a symlink or not a regular file."""
        try:
            st = self.stat_entry(relpath)
        except UnsafeEntry:
            return None
        return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None

    def join(self, relpath: str) -> str:
        return os.path.join(self.root, relpath)


def _classify(exc: OSError, name: str, dir_fd: int) -> str:
    """Why an entry could not be opened, in a few fixed words (ENOTDIR/ELOOP on O_NOFOLLOW: a symlink?)."""
    if isinstance(exc, PermissionError):
        return "not readable (permission denied)"
    if exc.errno in (errno.ENOTDIR, errno.ELOOP, errno.ENXIO, errno.EOPNOTSUPP):
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            return "unreadable"
        if stat.S_ISLNK(mode):
            return "a symlink (not followed)"
        if not stat.S_ISDIR(mode) and not stat.S_ISREG(mode):
            return "not a regular file"
        return "not a directory"
    return f"unreadable ({_errno_name(exc)})"


def _local_path(uri: str) -> str:
    if "\x00" in uri:
        raise StorageError("checkpoint root contains a NUL byte", REASON_INVALID_ROOT)
    if uri.startswith("file://"):
        return uri[len("file://") :]
    if "://" in uri:
        scheme = uri.split("://", 1)[0][:20]
        raise StorageError(f"checkpoint storage scheme {scheme}:// is not supported (use a mounted path or "
                           "s3://bucket/prefix)", REASON_INVALID_ROOT)  # fmt: skip
    if not uri.startswith("/"):
        raise StorageError("checkpoint root must be an absolute path", REASON_INVALID_ROOT)
    return uri


def open_store(uri: str, s3: Any = None) -> CheckpointStore:
    """Resolve a checkpoint root URI: a path, `file://` or `s3://bucket/prefix` (with `s3`, an
    `s3store.S3Credentials`, or the standard AWS environment); other schemes fail with a clear error."""
    if uri.startswith("s3://"):
        return _open_s3(uri, s3)
    return LocalStore(_local_path(uri))


def object_area(uri: str, areas: Iterable[str]) -> str:
    """The object-store area (`s3://bucket[/prefix]`) of `areas` that holds the root `uri`, decided lexically
    (no request: no oracle); StorageError (invalid root, or outside every area) otherwise. The message names
    neither the areas nor anything that exists, so a tenant learns nothing about another's buckets."""
    from resilient_contract import s3store  # deferred: the s3 module is needed for s3:// roots only

    try:
        loc = s3store.parse_uri(uri)
    except ValueError as exc:
        raise StorageError(str(exc), REASON_INVALID_ROOT) from None
    for area in areas:
        try:
            allowed = s3store.parse_uri(area)
        except ValueError:
            continue
        if allowed.bucket == loc.bucket and within_area(loc.prefix, allowed.prefix):
            return area
    raise StorageError(f"checkpoint root {loc.uri} is not inside an object-store area this job's namespace may "
                       "use", REASON_ROOT_OUTSIDE_AREA)  # fmt: skip


def _open_s3(uri: str, creds: Any, area: str | None = None) -> CheckpointStore:
    from resilient_contract import s3store  # deferred: s3fs is needed for s3:// roots only

    if area is not None:
        object_area(uri, [area])
    try:
        loc = s3store.parse_uri(uri)
    except ValueError as exc:
        raise StorageError(str(exc), REASON_INVALID_ROOT) from None
    return s3store.S3Store(loc.uri, creds)


def _components(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise StorageError("checkpoint root must be a normalized path (no . or .. components)", REASON_INVALID_ROOT)
    return parts


def within_area(path: str, area: str) -> bool:
    """Lexically: is `path` the area or below it? (Decided before any filesystem access: no oracle.)"""
    area_parts = [p for p in area.split("/") if p]
    return [p for p in path.split("/") if p][: len(area_parts)] == area_parts


def open_root(uri: str, area: str) -> LocalStore:
    """The root as an open directory, checked to lie inside `area` with no symlink below the area."""
    path = _local_path(uri)
    parts, area_parts = _components(path), _components(area)
    if parts[: len(area_parts)] != area_parts:
        raise StorageError(f"checkpoint root must lie inside {'/' + '/'.join(area_parts)}/, the checkpoint "
                           "storage area of this job's namespace", REASON_ROOT_OUTSIDE_AREA)  # fmt: skip
    try:  # the area is the platform admin's path: it may be a mount point or a symlink
        fd = os.open("/" + "/".join(area_parts), os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RootMissing(f"checkpoint root {path} does not exist") from None
    except OSError as exc:
        raise StorageError(f"the namespace's checkpoint area is not readable ({_errno_name(exc)})") from None
    try:
        for part in parts[len(area_parts) :]:
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise RootMissing(f"checkpoint root {path} does not exist") from None
            except OSError as exc:
                kind = _classify(exc, part, fd)
                if kind.startswith("a symlink"):
                    raise StorageError(f"checkpoint root {path} has a symlink in its path (not followed)",
                                       REASON_ROOT_SYMLINK) from None  # fmt: skip
                raise StorageError(f"checkpoint root {path} is {kind}") from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return LocalStore(path, dir_fd=fd)


@dataclass(frozen=True)
class Verdict:
    """Whether one step directory is a complete checkpoint, and if not, why (for events and logs)."""

    step: int
    path: str
    complete: bool
    reason: str = ""
    fenced_writer: int | None = None  # refused by the lineage: the attempt whose cut-off gang wrote it


def _shard_label(rel: str) -> str:
    return f"shard {rel}" if _SAFE_NAME_RE.fullmatch(rel) else "a shard with an unprintable name"


def check_step(store: CheckpointStore, name: str, limits: dcp_metadata.Limits = dcp_metadata.DEFAULT_LIMITS,
               rule: lineage.Lineage | None = None) -> Verdict:
    """The completeness rule, in one place. Storage trouble becomes a verdict, never an exception.

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
        # Complete, yet written by an attempt fenced before this step was: its .metadata came after the fence
        # (the decision took the newest complete checkpoint, older than this one), so a cut-off gang wrote it.
        if rule is not None and (refused := rule.refusal(step, writer)):
            if reason is None:
                return Verdict(step, path, False, refused, fenced_writer=writer[1] if writer else None)
            if store.stat_entry(posixpath.join(name, lineage.REFUSED_FILE)) is not None:
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
        reason = f"the step directory is unreadable ({_errno_name(exc)})"
    return Verdict(step, path, reason is None, reason or "")


def _writer(store: CheckpointStore, name: str) -> tuple[str, int] | None:
    try:
        return lineage.parse_writer(store.read_bytes(posixpath.join(name, lineage.WRITER_FILE),
                                                     lineage.MAX_TOKEN_BYTES))
    except UnsafeEntry:
        return None  # a token that is not a small regular file is no token


def read_lineage(store: CheckpointStore, job: str) -> list[tuple[int, int | None]]:
    """(attempt, resumed step) from the job's fence marks in the root: the newest `lineage.MAX_MARKS`."""
    names = heapq.nlargest(lineage.MAX_MARKS, (
        (parsed[1], name) for name, kind in store.iter_entries()
        if kind == "other" and (parsed := lineage.parse_marker_name(name)) and parsed[0] == job))
    out = []
    for attempt, name in names:
        try:
            mark = lineage.parse_marker(store.read_bytes(name, lineage.MAX_TOKEN_BYTES))
        except UnsafeEntry:
            continue
        if mark and mark[0] == job and mark[1] == attempt:
            out.append((attempt, mark[2]))
    return out


def _incomplete_because(store: CheckpointStore, name: str, limits: dcp_metadata.Limits) -> str | None:
    meta_rel = posixpath.join(name, METADATA_FILE)
    st = store.stat_entry(meta_rel)
    if st is None:
        return "no .metadata (save incomplete or in progress)"
    if stat.S_ISLNK(st.st_mode):
        return ".metadata is a symlink (not followed)"
    if not stat.S_ISREG(st.st_mode):
        return ".metadata is not a regular file (a FIFO, socket, device or directory)"
    if st.st_size > limits.max_bytes:
        return f".metadata is larger than the {limits.max_bytes}-byte cap"
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, limits)
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
    after = store.stat_entry(meta_rel)
    if after is not None and (after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns, after.st_ctime_ns,
                              limits) == key:  # unchanged while parsed: remember what it references, or why not
        _PARSED[key] = verdict
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


# Parsed `.metadata` by its stat signature (device, inode, size, mtime, ctime): a poll of an unchanged
# checkpoint re-checks its shards only. Parsing is the costly part (a pure-Python reader, ~2 MB/s per core).
# A refusal (malformed, unsafe) is remembered the same way: an unchanged costly-to-reject file is parsed once.
MAX_PARSED_CACHED = 64
_PARSED: OrderedDict[tuple[Any, ...], dict[str, int] | str] = OrderedDict()


def _shards_missing(store: CheckpointStore, name: str, needed: dict[str, int]) -> str | None:
    for rel, end in sorted(needed.items()):
        label = _shard_label(rel)
        try:
            st = store.stat_entry(posixpath.join(name, rel))
        except UnsafeEntry as exc:
            return f"{label} is inside a directory that is {exc.kind}"
        if st is None:
            return f"{label} is missing"
        if stat.S_ISLNK(st.st_mode):
            return f"{label} is a symlink (not followed)"
        if not stat.S_ISREG(st.st_mode):
            return f"{label} is not a regular file"
        if st.st_size < end:
            return f"{label} is truncated ({st.st_size} bytes, needs {end})"
    return None


def step_dirs(store: CheckpointStore) -> list[tuple[int, str]]:
    """(step, name) of every step directory, oldest first (symlinks are not step directories)."""
    found = []
    for name in store.list_dirs():
        step = parse_step_dir(name)
        if step is not None:
            found.append((step, name))
    found.sort()
    return found


def newest_step_entries(store: CheckpointStore, limit: int | None) -> tuple[list[tuple[int, str, str]], int]:
    """The newest `limit` (step, name, kind) step entries, newest first, and how many there are in all.

    Symlinks named like a step directory are kept (kind "symlink") so they can be reported as skipped.
    Streams the listing: memory stays O(limit) however many entries the root holds.
    """
    total = 0

    def steps() -> Iterator[tuple[int, str, str]]:
        nonlocal total
        for name, kind in store.iter_entries():
            if kind != "other" and (step := parse_step_dir(name)) is not None:
                total += 1
                yield step, name, kind

    # Newest first; within one step the plain name before `.a<attempt>` ones: a cut-off gang usually holds
    # the plain name, and looking at it first lets discovery report it before the newer attempt's copy wins.
    def order(entry: tuple[int, str, str]) -> tuple[int, int, str]:
        return entry[0], step_dir_attempt(entry[1]) is None, entry[1]

    if limit is None:
        return sorted(steps(), key=order, reverse=True), total
    return heapq.nlargest(limit, steps(), key=order), total


def scan_newest_first(store: CheckpointStore, limits: ScanLimits | None = None) -> Iterator[Verdict]:
    """Verdicts from the newest step directory back; stop consuming once you have what you need."""
    limits = limits or UNBOUNDED_SCAN
    entries, _ = newest_step_entries(store, limits.max_steps)
    for step, name, kind in entries:
        if kind == "symlink":
            yield Verdict(step, store.join(name), False, "the step directory is a symlink (not followed)")
        else:
            yield check_step(store, name, limits.metadata)


def latest_complete(store: CheckpointStore) -> Verdict | None:
    """The newest complete checkpoint, skipping newer incomplete ones; None if there is none."""
    for verdict in scan_newest_first(store):
        if verdict.complete:
            return verdict
    return None


@dataclass(frozen=True)
class ScanLimits:
    """How much of a root one discovery looks at, and how much of what it skipped it reports."""

    max_steps: int | None = 32  # only the newest K step directories are examined
    max_skipped: int = 5  # skipped verdicts kept in the Listing (all are counted)
    metadata: dcp_metadata.Limits = field(default_factory=dcp_metadata.Limits)


DEFAULT_SCAN = ScanLimits()
UNBOUNDED_SCAN = ScanLimits(max_steps=None, max_skipped=1 << 30)


@dataclass(frozen=True)
class Listing:
    """What discovery reports to the operator's core: the newest complete checkpoint and what was skipped.

    `error` with `missing=False`: the job must not (re)start; `reason` names why in CamelCase.
    `skipped` keeps the first few skipped verdicts; `skipped_total` counts them all; `unexamined` is
    the number of older step directories beyond the scan limit that were not looked at.
    """

    root: str
    latest: Verdict | None
    skipped: tuple[Verdict, ...] = ()
    error: str | None = None
    missing: bool = False
    reason: str | None = None
    skipped_total: int = 0
    unexamined: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: how a Listing crosses the sandbox's process boundary."""
        return {
            "root": self.root, "latest": _verdict_dict(self.latest),
            "skipped": [_verdict_dict(v) for v in self.skipped],
            "error": self.error, "missing": self.missing, "reason": self.reason,
            "skipped_total": self.skipped_total, "unexamined": self.unexamined,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any) -> Listing:
        """The inverse of `to_dict`, checking every type (raises ValueError on anything else)."""
        if not isinstance(data, dict):
            raise ValueError("a listing must be an object")
        latest = data.get("latest")
        skipped = data.get("skipped")
        if not isinstance(skipped, list):
            raise ValueError("listing.skipped must be a list")
        return cls(
            root=_typed(data.get("root"), str),
            latest=None if latest is None else _verdict(latest),
            skipped=tuple(_verdict(v) for v in skipped),
            error=_typed(data.get("error"), str, optional=True),
            missing=_typed(data.get("missing"), bool),
            reason=_typed(data.get("reason"), str, optional=True),
            skipped_total=_typed(data.get("skipped_total"), int),
            unexamined=_typed(data.get("unexamined"), int),
        )


def _typed(value: Any, kind: type, optional: bool = False) -> Any:
    if (value is None and optional) or (type(value) is kind):
        return value
    raise ValueError(f"expected {kind.__name__}")


def _verdict_dict(v: Verdict | None) -> dict[str, Any] | None:
    return None if v is None else {"step": v.step, "path": v.path, "complete": v.complete, "reason": v.reason,
                                   "fenced_writer": v.fenced_writer}


def _verdict(data: Any) -> Verdict:
    if not isinstance(data, dict):
        raise ValueError("a verdict must be an object")
    return Verdict(_typed(data.get("step"), int), _typed(data.get("path"), str), _typed(data.get("complete"), bool),
                   _typed(data.get("reason"), str), _typed(data.get("fenced_writer"), int, optional=True))


def discover(uri: str, area: str | None = None, limits: ScanLimits = DEFAULT_SCAN, job: str | None = None,
             starts: Iterable[tuple[int, int | None]] = (), s3: Any = None) -> Listing:
    """Find the latest complete checkpoint under a root. Never raises: every failure is `Listing.error`.

    With `area` (the operator always passes its namespace's area), a root outside it is refused
    before any filesystem access, and the root's path below the area must hold no symlink.
    With `job` (its uid), directories a fenced attempt of that job wrote are refused: the lineage is the
    job's fence marks in the root merged with `starts` (the operator's record: attempt, resumed step).
    An `s3://` root is checked against an `s3://bucket/prefix` area lexically and read with `s3`
    (`s3store.S3Credentials`: the operator's read-only keys for that bucket).
    """
    store: CheckpointStore | None = None
    try:
        if uri.startswith("s3://"):
            store = _open_s3(uri, s3, area)
        else:
            store = open_store(uri) if area is None else open_root(uri, area)
        rule = None
        if job is not None:
            jid = lineage.job_id(job)
            starts = list(starts)  # marks and tokens past the operator's newest attempt are not believed
            newest = max((a for a, _ in starts), default=None)
            rule = lineage.Lineage.merge(jid, read_lineage(store, jid), starts, newest=newest)
        return scan(store, limits, rule, uri)
    except RootMissing as exc:
        return Listing(uri, None, (), str(exc), missing=True, reason=exc.reason)
    except StorageError as exc:
        return Listing(uri, None, (), str(exc), reason=exc.reason)
    except MemoryError:
        return Listing(uri, None, (), "checkpoint discovery ran out of memory", reason=REASON_DISCOVERY_FAILED)
    except Exception as exc:  # RecursionError, OSError from a strange filesystem, ...: a reason, not a crash
        return Listing(uri, None, (), f"checkpoint discovery failed ({type(exc).__name__})",
                       reason=REASON_DISCOVERY_FAILED)  # fmt: skip
    finally:
        if store is not None:
            store.close()


def scan(store: CheckpointStore, limits: ScanLimits = DEFAULT_SCAN, rule: lineage.Lineage | None = None,
         uri: str | None = None) -> Listing:
    """`discover`'s scan of an opened store (a benchmark or test can count its requests). A store failure
    (StorageError) propagates: `discover` turns it into `Listing.error`."""
    uri = store.uri if uri is None else uri
    entries, total = newest_step_entries(store, limits.max_steps)
    skipped: list[Verdict] = []
    count = 0
    for step, name, kind in entries:
        if kind == "symlink":
            verdict = Verdict(step, store.join(name), False, "the step directory is a symlink (not followed)")
        else:
            verdict = check_step(store, name, limits.metadata, rule)
        if verdict.complete:
            return Listing(uri, verdict, tuple(skipped), skipped_total=count)
        count += 1
        if len(skipped) < limits.max_skipped:
            skipped.append(verdict)
    return Listing(uri, None, tuple(skipped), skipped_total=count, unexamined=total - len(entries))
