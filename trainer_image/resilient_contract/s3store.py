"""A checkpoint root in object storage (`s3://bucket/prefix`), read through the `CheckpointStore` seam.

Discovery's rule is unchanged; only the reads differ, and object stores need a few of their own:
- There are no directories: a step "directory" is a common prefix `step-<10 digits>/`, seen by one
  delimited LIST of the root (pages of 1,000 keys, at most `max_root_pages` pages).
- Sizes come from listings, never from a HEAD per shard: the first question about a step prefix lists
  it once (non-delimited, bounded by `MAX_SHARD_FILES` keys) and every shard check is answered from
  that listing. Requests per discovery: root pages + one LIST per step examined + one ranged GET per
  `.metadata` (and per lineage mark / writer token), whatever the shard count.
- There are no symlinks, FIFOs or devices: every object is a "regular file". A `.metadata` bigger than
  the cap is refused from its listed size; the read itself asks for at most cap+1 bytes (a Range GET).
- An object's identity is its ETag: it stands in for the inode in the parsed-`.metadata` cache, so
  an overwritten `.metadata` is parsed again.
- Credentials and endpoint: given explicitly (the operator's per-bucket read-only keys) or, when
  absent, botocore's standard chain (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`).

Torch-free and kopf-free: the operator's discovery sandbox imports it.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import stat
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from resilient_contract.layout import RootMissing, StorageError, StoreUnavailable, UnsafeEntry

SCHEME = "s3://"
PAGE = 1000  # keys per LIST page (the S3 maximum)
MAX_ROOT_PAGES = 200  # 200,000 entries at the root: more is refused, not listed forever
MAX_STEP_KEYS = 100_100  # layout.MAX_SHARD_FILES shards plus the few files a step also holds
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 20
S3FS_RETRIES = 1  # botocore retries transient errors itself (standard mode); s3fs would retry on top
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


class S3Error(StoreUnavailable):
    """The store answered with an error (no such bucket, access denied, endpoint down, throttled)."""


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" or "a/b" (no leading or trailing slash)

    @property
    def uri(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"

    def key(self, relpath: str = "") -> str:
        return posixpath.join(self.prefix, relpath) if self.prefix else relpath


def parse_uri(uri: str) -> S3Location:
    """`s3://bucket[/prefix]` -> S3Location; ValueError with a reason a user can act on otherwise."""
    if not uri.startswith(SCHEME):
        raise ValueError("an object-store root starts with s3://")
    rest = uri[len(SCHEME) :]
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET_RE.match(bucket) or ".." in bucket:  # S3's rules, as the CRD's validation states them
        raise ValueError(f"{bucket[:70]!r} is not a valid S3 bucket name")
    prefix = prefix.rstrip("/")
    parts = prefix.split("/") if prefix else []
    if any(p in ("", ".", "..") or "\x00" in p for p in parts):
        raise ValueError("the prefix of an s3:// root must be normalized (no empty, . or .. segments)")
    return S3Location(bucket, prefix)


@dataclass(frozen=True)
class S3Credentials:
    """Keys and endpoint for one store; None fields fall back to botocore's standard environment chain.

    `timeout_s` bounds each request's connect and read (the operator sets it below discovery's deadline, so
    an endpoint that is down gives the store's own error in time rather than a killed worker)."""

    access_key: str | None = None
    secret_key: str | None = None
    endpoint_url: str | None = None
    region: str | None = None
    timeout_s: float | None = None

    def secrets(self) -> tuple[str, ...]:
        """The strings no message may carry (for redaction)."""
        return tuple(s for s in (self.access_key, self.secret_key) if s)

    @classmethod
    def from_environ(cls, env: dict[str, str] | None = None) -> S3Credentials:
        env = dict(os.environ) if env is None else env
        return cls(env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY"), env.get("AWS_ENDPOINT_URL"),
                   env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION"))


# Filesystems by credentials: a client costs ~0.4 s of CPU to build (botocore loads its models), a poll reuses it.
MAX_CLIENTS = 16
_CLIENTS: OrderedDict[S3Credentials, Any] = OrderedDict()


def filesystem(creds: S3Credentials | None = None) -> Any:
    """An s3fs filesystem with bounded timeouts and retries and no listing cache (every read is fresh); one per
    set of credentials, reused."""
    creds = creds or S3Credentials.from_environ()
    fs = _CLIENTS.get(creds)
    if fs is None:
        fs = _CLIENTS[creds] = _new_filesystem(creds)
        while len(_CLIENTS) > MAX_CLIENTS:
            _CLIENTS.popitem(last=False)
    _CLIENTS.move_to_end(creds)
    return fs


_SESSION: Any = None  # one botocore session: its loaded models make every further client cheap (~0.03 s, not 0.5)


def warm_up() -> None:
    """Import the client and load its models now (a discovery worker at start-up, outside any deadline)."""
    _new_filesystem(S3Credentials("warm-up", "warm-up", "http://127.0.0.1:9")).connect()  # no request is made


def _new_filesystem(creds: S3Credentials) -> Any:
    global _SESSION
    import s3fs  # deferred: only s3:// roots need it
    from aiobotocore.session import AioSession  # type: ignore[import-untyped]

    if _SESSION is None:
        _SESSION = AioSession()
    client_kwargs: dict[str, Any] = {"region_name": creds.region or "us-east-1"}
    connect, read = float(CONNECT_TIMEOUT_S), float(READ_TIMEOUT_S)
    if creds.timeout_s is not None:
        connect, read = min(connect, creds.timeout_s), min(read, creds.timeout_s)
    fs = s3fs.S3FileSystem(
        key=creds.access_key, secret=creds.secret_key, endpoint_url=creds.endpoint_url,
        client_kwargs=client_kwargs, skip_instance_cache=True, use_listings_cache=False, session=_SESSION,
        config_kwargs={"connect_timeout": connect, "read_timeout": read,
                       "retries": {"max_attempts": 2, "mode": "standard"}},
    )  # fmt: skip
    fs.retries = S3FS_RETRIES  # s3fs' own loop (5 by default) on top of botocore's: an outage answers sooner
    return fs


def describe_error(exc: BaseException) -> str:
    """The store's own words (code and message), short: for `CheckpointStorageReady=False`."""
    if isinstance(exc, FileNotFoundError):
        return f"not found ({exc})"[:300]
    if isinstance(exc, PermissionError):
        return f"access denied ({exc})"[:300]
    return f"{type(exc).__name__}: {exc}"[:300]


def _stat(size: int, etag: str, mtime: float) -> os.stat_result:
    ino = int.from_bytes(hashlib.sha256(etag.encode()).digest()[:8], "big")
    ns = int(mtime * 1e9)
    return os.stat_result((stat.S_IFREG | 0o444, ino, 0, 1, 0, 0, size, int(mtime), int(mtime), int(mtime),
                           mtime, mtime, mtime, ns, ns, ns))  # fmt: skip


_DIR_STAT = os.stat_result((stat.S_IFDIR | 0o555, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0, 0, 0))


class S3Store:
    """A `layout.CheckpointStore` over one `s3://bucket/prefix` root. One instance per discovery: listings
    are remembered for its lifetime (that is what bounds the requests), so make a new one per pass."""

    def __init__(self, uri: str, creds: S3Credentials | None = None, fs: Any = None,
                 max_root_pages: int = MAX_ROOT_PAGES) -> None:
        self.loc = parse_uri(uri)
        self.uri = self.loc.uri
        self._fs = fs if fs is not None else filesystem(creds)
        self._max_root_pages = max_root_pages
        self._root: tuple[list[str], dict[str, os.stat_result]] | None = None
        self._steps: dict[str, dict[str, os.stat_result]] = {}
        self.requests = 0  # LIST and GET calls made (for the benchmark and the tests)

    # ---- raw requests ---------------------------------------------------------------------------
    def _list(self, prefix: str, delimiter: bool, max_pages: int) -> Iterator[dict[str, Any]]:
        token: str | None = None
        for _ in range(max_pages):
            kwargs: dict[str, Any] = {"Bucket": self.loc.bucket, "Prefix": prefix, "MaxKeys": PAGE}
            if delimiter:
                kwargs["Delimiter"] = "/"
            if token:
                kwargs["ContinuationToken"] = token
            self.requests += 1
            try:
                page = self._fs.call_s3("list_objects_v2", **kwargs)
            except Exception as exc:
                where = f"{SCHEME}{self.loc.bucket}/{prefix.rstrip('/')}"
                raise S3Error(f"listing {where} failed: {describe_error(exc)}") from None
            yield page
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")
            if not token:
                return
        # Plain StorageError: for a step prefix that makes one skipped checkpoint, not a store outage.
        raise StorageError(f"{SCHEME}{self.loc.bucket}/{prefix} holds more than {max_pages * PAGE} keys; refusing "
                           "to list further")  # fmt: skip

    def _root_listing(self) -> tuple[list[str], dict[str, os.stat_result]]:
        if self._root is None:
            base = self.loc.prefix + "/" if self.loc.prefix else ""
            dirs: list[str] = []
            files: dict[str, os.stat_result] = {}
            found = False
            for page in self._list(base, True, self._max_root_pages):
                for common in page.get("CommonPrefixes") or ():
                    name = common["Prefix"][len(base) :].rstrip("/")
                    if name and "/" not in name:
                        dirs.append(name)
                        found = True
                for obj in page.get("Contents") or ():
                    name = obj["Key"][len(base) :]
                    if name and "/" not in name:
                        files[name] = _stat(int(obj["Size"]), str(obj.get("ETag", "")), _mtime(obj))
                        found = True
            if not found:  # no directories on S3: an empty prefix is a root that does not exist yet
                if not self._bucket_exists():
                    raise StorageError(f"bucket {self.loc.bucket} does not exist or is not visible to the "
                                       "operator's credentials")
                raise RootMissing(f"checkpoint root {self.uri} holds no objects yet")
            self._root = (dirs, files)
        return self._root

    def _bucket_exists(self) -> bool:
        self.requests += 1
        try:
            self._fs.call_s3("head_bucket", Bucket=self.loc.bucket)
            return True
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise S3Error(f"bucket {self.loc.bucket}: {describe_error(exc)}") from None

    def step_listing(self, step: str) -> dict[str, os.stat_result]:
        """Every object under one step prefix (relative name -> stat), listed once per store."""
        if step not in self._steps:
            base = self.loc.key(step) + "/"
            files: dict[str, os.stat_result] = {}
            for page in self._list(base, False, -(-MAX_STEP_KEYS // PAGE)):
                for obj in page.get("Contents") or ():
                    rel = obj["Key"][len(base) :]
                    if rel:
                        files[rel] = _stat(int(obj["Size"]), str(obj.get("ETag", "")), _mtime(obj))
            self._steps[step] = files
        return self._steps[step]

    # ---- the CheckpointStore seam ---------------------------------------------------------------
    def iter_entries(self) -> Iterator[tuple[str, str]]:
        dirs, files = self._root_listing()
        for name in dirs:
            yield name, "dir"
        for name in files:
            if name not in dirs:
                yield name, "other"

    def list_dirs(self) -> list[str]:
        return list(self._root_listing()[0])

    def stat_entry(self, relpath: str) -> os.stat_result | None:
        parts = relpath.split("/")
        if any(p in ("", ".", "..") or "\x00" in p for p in parts):
            raise UnsafeEntry("outside the checkpoint")
        dirs, files = self._root_listing()
        if len(parts) == 1:
            if relpath in files:
                return files[relpath]
            return _DIR_STAT if relpath in dirs else None
        if parts[0] not in dirs:
            return None
        return self.step_listing(parts[0]).get("/".join(parts[1:]))

    def size(self, relpath: str) -> int | None:
        st = self.stat_entry(relpath)
        return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None

    def read_bytes(self, relpath: str, limit: int) -> bytes | None:
        """At most `limit` bytes of an object (None if absent); a listed size over `limit` raises."""
        st = self.stat_entry(relpath)
        if st is None or not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > limit:
            raise UnsafeEntry("too large")
        self.requests += 1
        try:
            data: bytes = self._fs.cat_file(f"{self.loc.bucket}/{self.loc.key(relpath)}", start=0, end=limit + 1)
        except FileNotFoundError:
            return None  # deleted since the listing
        except Exception as exc:
            raise S3Error(f"reading {self.join(relpath)} failed: {describe_error(exc)}") from None
        if len(data) > limit:
            raise UnsafeEntry("too large")  # replaced by a bigger object since the listing
        return data

    def join(self, relpath: str) -> str:
        return f"{self.uri}/{relpath}"

    def close(self) -> None:
        self._root, self._steps = None, {}


def _mtime(obj: dict[str, Any]) -> float:
    when = obj.get("LastModified")
    try:
        return float(when.timestamp()) if when is not None else 0.0
    except (AttributeError, OSError, OverflowError, ValueError):
        return 0.0
