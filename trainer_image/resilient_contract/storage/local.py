"""A checkpoint root on a mounted filesystem (an RWX volume shared by the workers): the `local` backend.

Everything below the root is written by user pods, so it is read as hostile input: no symlink below the root
is followed, files must be regular (`lstat`, then `O_NOFOLLOW|O_NONBLOCK` and `fstat`, so a FIFO never blocks).
With a `dir_fd` (`open_in_area`) every read is relative to that open directory, so swapping a path component
for a symlink after the check changes nothing. Writes: `mkdir` claims a step directory, `O_EXCL` creates a
fence mark, and a deletion renames the directory out of the `step-*` namespace first.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from resilient_contract import lineage
from resilient_contract.storage.base import Entry, Kind
from resilient_contract.storage.errors import (
    REASON_INVALID_ROOT,
    REASON_ROOT_OUTSIDE_AREA,
    REASON_ROOT_SYMLINK,
    RootMissing,
    StorageError,
    UnsafeEntry,
    errno_name,
)
from resilient_contract.storage.names import TRASH_PREFIX, unsafe_parts

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class LocalStore:
    """A `Store` over a directory. Reads never follow a link below the root; writes go by path."""

    def __init__(self, root: str, dir_fd: int | None = None) -> None:
        if "\x00" in root:
            raise StorageError("checkpoint root contains a NUL byte", REASON_INVALID_ROOT)
        self.root = root
        self.uri = root
        self._fd = dir_fd

    def fresh(self) -> LocalStore:
        return LocalStore(self.root)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ---- reads ------------------------------------------------------------------------------------
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
            raise StorageError(f"checkpoint root {self.root} cannot be opened ({errno_name(exc)})") from None
        try:
            yield fd
        finally:
            os.close(fd)

    def iter_entries(self) -> Iterator[tuple[str, Kind]]:
        with self._root_fd() as fd:
            try:
                with os.scandir(fd) as it:
                    for entry in it:
                        if entry.is_symlink():
                            yield entry.name, "symlink"
                        elif entry.is_dir(follow_symlinks=False):
                            yield entry.name, "dir"
                        elif entry.is_file(follow_symlinks=False):
                            yield entry.name, "file"
                        else:
                            yield entry.name, "other"
            except PermissionError:
                raise StorageError(f"checkpoint root {self.root} is not readable (permission denied)") from None
            except OSError as exc:
                raise StorageError(f"checkpoint root {self.root} cannot be listed ({errno_name(exc)})") from None

    def list_dirs(self) -> list[str]:
        return [name for name, kind in self.iter_entries() if kind == "dir"]

    @contextmanager
    def _parent(self, relpath: str) -> Iterator[tuple[int, str] | None]:
        """An open fd of `relpath`'s directory (walked without following symlinks) and the leaf name."""
        parts = relpath.split("/")
        if unsafe_parts(parts):
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

    def entry(self, relpath: str) -> Entry | None:
        with self._parent(relpath) as found:
            if found is None:
                return None
            fd, leaf = found
            try:
                st = os.stat(leaf, dir_fd=fd, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                return None
            except OSError as exc:
                raise UnsafeEntry(_classify(exc, leaf, fd)) from None
            return Entry(_kind(st.st_mode), st.st_size, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                                          st.st_ctime_ns))  # fmt: skip

    def read_bytes(self, relpath: str, limit: int) -> bytes | None:
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
        try:
            found = self.entry(relpath)
        except UnsafeEntry:
            return None
        return found.size if found is not None and found.kind == "file" else None

    def join(self, relpath: str) -> str:
        return os.path.join(self.root, relpath)

    # ---- writes -----------------------------------------------------------------------------------
    def ensure(self) -> None:
        os.makedirs(self.root, exist_ok=True)

    def create_exclusive(self, relpath: str, data: bytes) -> bool:
        try:
            fd = os.open(self.join(relpath), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return True

    def put(self, relpath: str, data: bytes) -> None:
        with open(self.join(relpath), "wb") as f:
            f.write(data)

    def claim_step(self, name: str, token: bytes | None) -> bool:
        try:
            os.mkdir(self.join(name))
        except FileExistsError:
            return False
        if token is not None:
            with open(os.path.join(self.join(name), lineage.WRITER_FILE), "xb") as f:
                f.write(token)
        return True

    def remove_step(self, name: str) -> None:
        """Rename out of the step namespace (atomic), then delete the contents."""
        import shutil  # deferred (with uuid): the operator's discovery worker never writes, and starts on a deadline
        import uuid

        trash = self.join(f"{TRASH_PREFIX}{name}-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self.join(name), trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def cleanup(self) -> None:
        import shutil

        for entry in os.listdir(self.root):
            if entry.startswith(TRASH_PREFIX):  # leftovers of a deletion interrupted by a crash
                shutil.rmtree(self.join(entry), ignore_errors=True)


def _kind(mode: int) -> Kind:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "symlink" if stat.S_ISLNK(mode) else "other"


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
    return f"unreadable ({errno_name(exc)})"


def check_path(path: str) -> str:
    """A root path as given (absolute, no NUL byte), or StorageError."""
    if "\x00" in path:
        raise StorageError("checkpoint root contains a NUL byte", REASON_INVALID_ROOT)
    if not path.startswith("/"):
        raise StorageError("checkpoint root must be an absolute path", REASON_INVALID_ROOT)
    return path


def _components(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise StorageError("checkpoint root must be a normalized path (no . or .. components)", REASON_INVALID_ROOT)
    return parts


def open_in_area(path: str, area: str) -> LocalStore:
    """The root as an open directory, checked to lie inside `area` with no symlink below the area."""
    path = check_path(path)
    parts, area_parts = _components(path), _components(area)
    if parts[: len(area_parts)] != area_parts:
        raise StorageError(f"checkpoint root must lie inside {'/' + '/'.join(area_parts)}/, the checkpoint "
                           "storage area of this job's namespace", REASON_ROOT_OUTSIDE_AREA)  # fmt: skip
    try:  # the area is the platform admin's path: it may be a mount point or a symlink
        fd = os.open("/" + "/".join(area_parts), os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RootMissing(f"checkpoint root {path} does not exist") from None
    except OSError as exc:
        raise StorageError(f"the namespace's checkpoint area is not readable ({errno_name(exc)})") from None
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
