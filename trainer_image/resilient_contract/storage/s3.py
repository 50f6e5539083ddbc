"""A checkpoint root in object storage (`s3://bucket/prefix`): the `s3` backend.

The rules are the local backend's; only the primitives differ, and object stores need a few of their own:
- There are no directories: a step "directory" is a common prefix `step-<10 digits>/`, seen by one
  delimited LIST of the root (pages of 1,000 keys, at most `max_root_pages` pages).
- Sizes come from listings, never from a HEAD per shard: the first question about a step prefix lists
  it once (non-delimited, bounded by `MAX_STEP_KEYS` keys) and every shard check is answered from
  that listing. Requests per discovery: root pages + one LIST per step examined + one ranged GET per
  `.metadata` (and per lineage mark / writer token), whatever the shard count.
- There are no symlinks, FIFOs or devices: every object is a "file". A `.metadata` bigger than the cap is
  refused from its listed size; the read itself asks for at most cap+1 bytes (a Range GET).
- An object's identity is its ETag (with its size and time): an overwritten `.metadata` is parsed again.
- "Make a step directory exclusively": no O_EXCL, so a prefix is ours when we wrote its `.rtj-writer` first,
  with a conditional PUT (`If-None-Match: *`, which S3, MinIO and SeaweedFS evaluate under the object's write
  lock), after a LIST found the prefix empty. Without a token (a local run) the LIST alone claims it.
- Deletion cannot rename a prefix: `.metadata` goes first (no longer complete at once), then the shards in
  batches, then the writer token. An interrupted deletion leaves an incomplete step the rule refuses.
- Credentials and endpoint: given explicitly (the operator's per-bucket read-only keys) or, when absent,
  botocore's standard chain (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`), never the
  job's spec. s3fs is imported on first use only.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from resilient_contract import lineage
from resilient_contract.storage.base import Entry, Kind
from resilient_contract.storage.errors import RootMissing, StorageError, StoreUnavailable, UnsafeEntry
from resilient_contract.storage.names import METADATA_FILE, unsafe_parts

SCHEME = "s3://"
PAGE = 1000  # keys per LIST page (the S3 maximum)
MAX_ROOT_PAGES = 200  # 200,000 entries at the root: more is refused, not listed forever
MAX_STEP_KEYS = 100_100  # completeness.MAX_SHARD_FILES shards plus the few files a step also holds
DELETE_BATCH = 1000  # keys per DeleteObjects request (the S3 maximum)
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 20
S3FS_RETRIES = 1  # botocore retries transient errors itself (standard mode); s3fs would retry on top
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_DIR = Entry("dir")


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
    if unsafe_parts(prefix.split("/") if prefix else []):
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


def _entry(obj: dict[str, Any]) -> Entry:
    size = int(obj["Size"])
    return Entry("file", size, (str(obj.get("ETag", "")), size, _mtime_ns(obj)))


class S3Store:
    """A `Store` over one `s3://bucket/prefix` root. Listings are remembered for the instance's lifetime (that
    is what bounds a discovery's requests): make a new one per pass (`fresh`). Writes list afresh."""

    def __init__(self, uri: str, creds: S3Credentials | None = None, fs: Any = None,
                 max_root_pages: int = MAX_ROOT_PAGES) -> None:
        self.loc = parse_uri(uri)
        self.uri = self.loc.uri
        self._fs = fs if fs is not None else filesystem(creds)
        self._max_root_pages = max_root_pages
        self._root: tuple[list[str], dict[str, Entry]] | None = None
        self._steps: dict[str, dict[str, Entry]] = {}
        self.requests = 0  # LIST and GET calls made (for the benchmark and the tests)

    def fresh(self) -> S3Store:
        return S3Store(self.uri, fs=self._fs, max_root_pages=self._max_root_pages)

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

    def _root_listing(self) -> tuple[list[str], dict[str, Entry]]:
        if self._root is None:
            base = self.loc.prefix + "/" if self.loc.prefix else ""
            dirs: list[str] = []
            files: dict[str, Entry] = {}
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
                        files[name] = _entry(obj)
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

    def step_listing(self, step: str) -> dict[str, Entry]:
        """Every object under one step prefix (relative name -> entry), listed once per store."""
        if step not in self._steps:
            base = self.loc.key(step) + "/"
            files: dict[str, Entry] = {}
            for page in self._list(base, False, -(-MAX_STEP_KEYS // PAGE)):
                for obj in page.get("Contents") or ():
                    rel = obj["Key"][len(base) :]
                    if rel:
                        files[rel] = _entry(obj)
            self._steps[step] = files
        return self._steps[step]

    # ---- reads ------------------------------------------------------------------------------------
    def iter_entries(self) -> Iterator[tuple[str, Kind]]:
        dirs, files = self._root_listing()
        for name in dirs:
            yield name, "dir"
        for name in files:
            if name not in dirs:
                yield name, "file"

    def list_dirs(self) -> list[str]:
        return list(self._root_listing()[0])

    def entry(self, relpath: str) -> Entry | None:
        parts = relpath.split("/")
        if unsafe_parts(parts):
            raise UnsafeEntry("outside the checkpoint")
        dirs, files = self._root_listing()
        if len(parts) == 1:
            if relpath in files:
                return files[relpath]
            return _DIR if relpath in dirs else None
        if parts[0] not in dirs:
            return None
        return self.step_listing(parts[0]).get("/".join(parts[1:]))

    def size(self, relpath: str) -> int | None:
        found = self.entry(relpath)
        return found.size if found is not None and found.kind == "file" else None

    def read_bytes(self, relpath: str, limit: int) -> bytes | None:
        """At most `limit` bytes of an object (None if absent); a listed size over `limit` raises."""
        found = self.entry(relpath)
        if found is None or found.kind != "file":
            return None
        if found.size > limit:
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

    # ---- writes -----------------------------------------------------------------------------------
    def ensure(self) -> None:
        pass

    def _call(self, op: str, **kwargs: Any) -> Any:
        try:
            return self._fs.call_s3(op, Bucket=self.loc.bucket, **kwargs)
        except Exception as exc:
            raise S3Error(f"{op} in {self.uri} failed: {describe_error(exc)}") from exc

    def create_exclusive(self, relpath: str, data: bytes) -> bool:
        try:
            self._fs.call_s3("put_object", Bucket=self.loc.bucket, Key=self.loc.key(relpath), Body=data,
                             IfNoneMatch="*")
        except Exception as exc:
            if precondition_failed(exc):
                return False
            raise S3Error(f"writing {self.join(relpath)} failed: {describe_error(exc)}") from exc
        return True

    def put(self, relpath: str, data: bytes) -> None:
        self._call("put_object", Key=self.loc.key(relpath), Body=data)

    def _keys(self, name: str) -> list[str]:
        """Every key under a step prefix, listed afresh (bounded like discovery's listing)."""
        return [self.loc.key(name) + "/" + rel for rel in self.fresh().step_listing(name)]

    def claim_step(self, name: str, token: bytes | None) -> bool:
        if self._keys(name):
            return False  # something is there already: a prefix is never shared
        if token is None:
            return True
        return self.create_exclusive(posixpath.join(name, lineage.WRITER_FILE), token)

    def remove_step(self, name: str) -> None:
        """`.metadata` first (no longer complete), then the rest in batches, the writer token last."""
        keys = self._keys(name)
        first = [k for k in keys if posixpath.basename(k) == METADATA_FILE]
        last = [k for k in keys if posixpath.basename(k) == lineage.WRITER_FILE]
        rest = [k for k in keys if k not in first and k not in last]
        for group in (first, rest, last):
            for i in range(0, len(group), DELETE_BATCH):
                batch = group[i : i + DELETE_BATCH]
                answer = self._call("delete_objects", Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
                if answer.get("Errors"):
                    err = answer["Errors"][0]
                    raise StorageError(f"deleting {self.join(name)} failed: {err.get('Code')} "
                                       f"{str(err.get('Message'))[:200]}")

    def cleanup(self) -> None:
        pass


def precondition_failed(exc: BaseException) -> bool:
    """Whether a conditional PUT lost: 412 (the key exists) or 409 (a concurrent conditional write won)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return True
        if "PreconditionFailed" in str(cur) or "ConditionalRequestConflict" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _mtime_ns(obj: dict[str, Any]) -> int:
    when = obj.get("LastModified")
    try:
        return int(float(when.timestamp()) * 1e9) if when is not None else 0
    except (AttributeError, OSError, OverflowError, ValueError):
        return 0
