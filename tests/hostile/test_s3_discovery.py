"""Discovery on a real S3 server (SeaweedFS): the completeness rule over `s3://`, hostile trees, bounded requests,
tenancy, and every storage failure as a Listing error within the deadline.

Trees are written with admin keys (as a tenant's trainer would); the operator reads with read-only keys
scoped to one bucket, through the sandboxed `DiscoveryPool` where the operator's path is what is tested,
and through `scan` over an `S3Store` where a request count is asserted.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.s3server import Identity, S3Server, weed_binary
from resilient_contract import dcp_metadata, lineage
from resilient_contract.storage.completeness import _PARSED
from resilient_contract.storage.errors import (
    REASON_DISCOVERY_FAILED,
    REASON_INVALID_ROOT,
    REASON_ROOT_MISSING,
    REASON_ROOT_OUTSIDE_AREA,
    REASON_STORAGE_UNREADABLE,
    StorageError,
)
from resilient_contract.storage.listing import Listing, Verdict
from resilient_contract.storage.names import METADATA_FILE, step_dir_name
from resilient_contract.storage.s3 import S3Credentials, S3Store, parse_uri
from resilient_contract.storage.scan import DEFAULT_SCAN, ScanLimits, discover
from resilient_contract.storage.scan import scan as storage_scan
from resilient_operator import constants as c
from resilient_operator.core.reconcile import STORAGE_RETRY_SECONDS, reconcile
from resilient_operator.discovery import DiscoveryPool, _redacted
from resilient_operator.settings import DiscoverySettings, ObjectStoreArea
from tests.hostile import attacks
from tests.operator.builders import NOW, healthy, job, running_status

TIMEOUT = 5.0
SLACK = 3.0  # worker start-up and scheduling on a small shared machine
pytestmark = pytest.mark.timeout(600)
BUCKET_A, BUCKET_B = "bucket-a", "bucket-b"
STEP1, STEP2 = step_dir_name(1), step_dir_name(2)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    try:
        weed_binary()
    except Exception as exc:  # no Go toolchain or proxy: say so, do not fail unrelated runs
        pytest.skip(f"SeaweedFS cannot be built here: {exc}")
    ro_a = Identity.for_bucket("ro-a", BUCKET_A, read_only=True)
    ro_b = Identity.for_bucket("ro-b", BUCKET_B, read_only=True)
    s3 = S3Server.start(tmp_path_factory.mktemp("seaweedfs"), identities=[ro_a, ro_b])
    try:
        s3.create_bucket(BUCKET_A)
        s3.create_bucket(BUCKET_B)
        yield s3
    finally:
        s3.stop()


def ident(server: S3Server, name: str) -> Identity:
    return next(i for i in server.identities if i.name == name)


def creds(server: S3Server, name: str = "ro-a") -> S3Credentials:
    i = ident(server, name)
    return S3Credentials(i.access_key, i.secret_key, server.endpoint, "us-east-1", timeout_s=2.0)


@pytest.fixture(scope="module")
def admin(server: S3Server) -> Any:
    return server.filesystem()


@pytest.fixture(scope="module")
def template(server: S3Server, admin: Any) -> dict[str, bytes]:
    """A real DCP checkpoint written with `FsspecWriter` to the bucket; its objects, by name."""
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    uri = f"s3://{BUCKET_A}/template/{STEP1}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = {"w": torch.randn(64, 64), "b": torch.randn(64), "extra": {"step": 1}}
        writer = dcp.FsspecWriter(uri, key=server.admin.access_key, secret=server.admin.secret_key,
                                  endpoint_url=server.endpoint, client_kwargs={"region_name": "us-east-1"},
                                  skip_instance_cache=True)  # fmt: skip
        dcp.save(state, storage_writer=writer)
    base = f"{BUCKET_A}/template/{STEP1}/"
    found = {key[len(base):]: admin.cat_file(key) for key in admin.find(base)}
    assert METADATA_FILE in found and any(name.endswith(".distcp") for name in found), sorted(found)
    return found


def plant(admin: Any, uri: str, objects: dict[str, bytes]) -> None:
    loc = parse_uri(uri)
    admin.pipe({f"{loc.bucket}/{loc.key(name)}": data for name, data in objects.items()})


def checkpoint(template: dict[str, bytes], step_dir: str, **changes: bytes | None) -> dict[str, bytes]:
    """The template's objects under `step_dir`, with some replaced (bytes) or left out (None)."""
    out = {}
    for name, data in template.items():
        replaced = changes.get(name, data)
        if replaced is not None:
            out[f"{step_dir}/{name}"] = replaced
    return out


def shard(template: dict[str, bytes]) -> str:
    return sorted(n for n in template if n.endswith(".distcp"))[0]


def scan(server: S3Server, uri: str, limits: ScanLimits = DEFAULT_SCAN) -> tuple[Listing, int]:
    """The operator's scan of `uri` with tenant A's read-only keys: the listing and the requests it made."""
    _PARSED.clear()  # a poll of an unchanged .metadata skips its GET: count the cold case
    store = S3Store(uri, creds(server))
    try:
        return storage_scan(store, limits), store.requests
    finally:
        store.close()


# ---- the completeness rule over s3:// -------------------------------------------------------------------------
def test_a_real_dcp_checkpoint_is_complete(server: S3Server, admin: Any, template: dict[str, bytes]) -> None:
    uri = f"s3://{BUCKET_A}/template"
    listing, requests = scan(server, uri)
    assert listing.error is None and listing.latest is not None and listing.latest.complete, listing
    assert listing.latest.step == 1 and listing.latest.path == f"{uri}/{STEP1}"
    # one LIST of the root, one of the step prefix, one ranged GET of .metadata: not one HEAD per shard
    assert requests == 3


def _huge() -> bytes:
    return b"\x80" + b"\x00" * (2 * 1024 * 1024)


HOSTILE = {
    "missing shard": (lambda t: checkpoint(t, STEP2, **{shard(t): None}), "is missing"),
    "short shard": (lambda t: checkpoint(t, STEP2, **{shard(t): t[shard(t)][:100]}), "is truncated"),
    "metadata only": (lambda t: {f"{STEP2}/.metadata": t[".metadata"]}, "is missing"),
    "upload died mid-way": (lambda t: checkpoint(t, STEP2, **{".metadata": None}), "no .metadata"),
    "garbage metadata": (lambda t: checkpoint(t, STEP2, **{".metadata": b"\x80\x05garbage" * 50}), ".metadata"),
    "metadata as a prefix": (lambda t: {**checkpoint(t, STEP2, **{".metadata": None}), f"{STEP2}/.metadata/x": b"x"},
                             "no .metadata"),
    "shard outside the step": (lambda t: {**checkpoint(t, STEP2, **{shard(t): None}), shard(t): t[shard(t)]},
                               "is missing"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_newer_step_is_skipped_with_a_reason(server: S3Server, admin: Any, template: dict[str, bytes],
                                                       case: str) -> None:  # fmt: skip
    make, reason = HOSTILE[case]
    uri = f"s3://{BUCKET_A}/hostile/{case.replace(' ', '-')}"
    plant(admin, uri, {**checkpoint(template, STEP1), **make(template)})
    listing, requests = scan(server, uri)
    assert listing.error is None and listing.latest is not None and listing.latest.step == 1, listing
    assert listing.skipped_total == 1 and reason in listing.skipped[0].reason, listing.skipped
    assert requests <= 5  # root LIST, two step LISTs, at most two .metadata GETs


def test_a_huge_metadata_is_refused_by_its_listed_size_without_a_download(server: S3Server, admin: Any) -> None:
    uri = f"s3://{BUCKET_A}/hostile/huge-metadata"
    plant(admin, uri, {f"{STEP2}/.metadata": _huge()})
    limits = ScanLimits(metadata=dcp_metadata.Limits(max_bytes=1024 * 1024))
    listing, requests = scan(server, uri, limits)
    assert listing.latest is None and "larger than the 1048576-byte cap" in listing.skipped[0].reason
    assert requests == 2  # the root LIST and the step's LIST: no GET at all


def test_thousands_of_step_prefixes_cost_a_bounded_number_of_requests(
        server: S3Server, admin: Any, template: dict[str, bytes]) -> None:  # fmt: skip
    uri = f"s3://{BUCKET_A}/many"
    steps = 2500
    # the genuine checkpoint is the 6th newest; every other step prefix is an upload that died (a shard only)
    genuine = steps - 5
    objects = {f"{step_dir_name(s)}/__0_0.distcp": b"x" for s in range(1, steps + 1) if s != genuine}
    plant(admin, uri, {**objects, **checkpoint(template, step_dir_name(genuine))})
    started = time.monotonic()
    listing, requests = scan(server, uri)
    assert listing.latest is not None and listing.latest.step == genuine, listing
    assert listing.skipped_total == 5
    # 3 root pages (1,000 prefixes each) + 6 step LISTs + 1 .metadata GET, whatever the shard count
    assert requests == 3 + 6 + 1, requests
    assert time.monotonic() - started < TIMEOUT
    beyond, requests = scan(server, uri, ScanLimits(max_steps=3))
    assert beyond.latest is None and beyond.unexamined == steps - 3 and requests == 3 + 3


def test_a_root_with_too_many_keys_is_refused_not_listed_forever(server: S3Server, admin: Any,
                                                                  template: dict[str, bytes]) -> None:  # fmt: skip
    uri = f"s3://{BUCKET_A}/many"  # 2,500 step prefixes (planted above, or now)
    if not admin.exists(f"{BUCKET_A}/many/{step_dir_name(2500)}"):
        plant(admin, uri, {f"{step_dir_name(s)}/x": b"x" for s in range(1, 2501)})
    store = S3Store(uri, creds(server), max_root_pages=2)
    with pytest.raises(StorageError, match="holds more than 2000 keys"):
        storage_scan(store)
    assert store.requests == 2


def test_a_fenced_attempts_save_is_refused_on_s3(server: S3Server, admin: Any, template: dict[str, bytes]) -> None:
    """The lineage rule over objects: attempt 2 resumed from step 1, so attempt 1's later step 2 is refused."""
    uri, job = f"s3://{BUCKET_A}/fenced", "uid-1"
    plant(admin, uri, {
        **checkpoint(template, STEP1), f"{STEP1}/{lineage.WRITER_FILE}": lineage.format_writer(job, 1),
        **checkpoint(template, STEP2), f"{STEP2}/{lineage.WRITER_FILE}": lineage.format_writer(job, 1),
        lineage.marker_name(job, 1): lineage.format_marker(job, 1, None),
        lineage.marker_name(job, 2): lineage.format_marker(job, 2, 1),
    })  # fmt: skip
    listing = discover(uri, f"s3://{BUCKET_A}", job=job, s3=creds(server))
    assert listing.latest is not None and listing.latest.step == 1, listing
    assert listing.skipped[0].step == 2 and listing.skipped[0].fenced_writer == 1, listing.skipped


def test_an_empty_prefix_is_a_root_not_written_yet(server: S3Server) -> None:
    listing = discover(f"s3://{BUCKET_A}/nothing-here", s3=creds(server))
    assert listing.missing and listing.reason == REASON_ROOT_MISSING, listing


# ---- through the operator's sandbox: tenancy and storage failures ---------------------------------------------
@pytest.fixture(scope="module")
def pool(server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DiscoveryPool]:
    secrets = tmp_path_factory.mktemp("secrets")
    for name, (key, secret) in {"ro-a": (ident(server, "ro-a").access_key, ident(server, "ro-a").secret_key),
                                "ro-b": (ident(server, "ro-b").access_key, ident(server, "ro-b").secret_key),
                                "admin": (server.admin.access_key, server.admin.secret_key),
                                "wrong": ("AKNOBODY0000", "not-the-secret")}.items():  # fmt: skip
        (secrets / name).mkdir()
        (secrets / name / "AWS_ACCESS_KEY_ID").write_text(key)
        (secrets / name / "AWS_SECRET_ACCESS_KEY").write_text(secret)
    down = f"http://127.0.0.1:{_closed_port()}"
    areas = (
        ObjectStoreArea(f"s3://{BUCKET_A}/tenant-a", ("tenant-a",), "ro-a", server.endpoint),
        ObjectStoreArea(f"s3://{BUCKET_A}/template", ("tenant-a",), "ro-a", server.endpoint),
        ObjectStoreArea(f"s3://{BUCKET_B}", ("tenant-b",), "ro-b", server.endpoint),
        ObjectStoreArea("s3://no-such-bucket", ("tenant-c",), "admin", server.endpoint),
        ObjectStoreArea("s3://not-my-bucket", ("tenant-c",), "ro-a", server.endpoint),
        ObjectStoreArea(f"s3://{BUCKET_A}/wrong-keys", ("tenant-c",), "wrong", server.endpoint),
        ObjectStoreArea(f"s3://{BUCKET_A}/down", ("tenant-c",), "ro-a", down),
        ObjectStoreArea(f"s3://{BUCKET_A}/unmounted", ("tenant-c",), "not-mounted", server.endpoint),
    )
    config = DiscoverySettings(checkpoint_mount=str(secrets), timeout_seconds=TIMEOUT, object_areas=areas,
                               object_secrets_dir=str(secrets))  # fmt: skip
    p = DiscoveryPool(config)
    p.warm()
    yield p
    p.close()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: connections are refused


def timed(pool: DiscoveryPool, root: str, namespace: str) -> Listing:
    started = time.monotonic()
    listing = pool.discover(root, namespace)
    assert time.monotonic() - started < TIMEOUT + SLACK, f"{root}: took {time.monotonic() - started:.1f}s"
    return listing


def test_the_sandbox_finds_a_real_checkpoint(pool: DiscoveryPool, template: dict[str, bytes]) -> None:
    listing = timed(pool, f"s3://{BUCKET_A}/template", "tenant-a")
    assert listing.error is None and listing.latest is not None and listing.latest.step == 1, listing


@pytest.mark.parametrize("root", [f"s3://{BUCKET_B}/x", f"s3://{BUCKET_A}/tenant-b", f"s3://{BUCKET_A}/tenant-ab",
                                  f"s3://{BUCKET_A}", "s3://no-such-bucket/x"])  # fmt: skip
def test_a_root_outside_the_namespaces_areas_is_refused_without_a_request(pool: DiscoveryPool, root: str) -> None:
    listing = timed(pool, root, "tenant-a")
    assert listing.reason == REASON_ROOT_OUTSIDE_AREA and not listing.missing, listing
    assert listing.error == f"checkpoint root {root} is not inside an object-store area this job's namespace may use"


def test_a_namespace_without_areas_cannot_use_s3(pool: DiscoveryPool) -> None:
    listing = timed(pool, f"s3://{BUCKET_A}/tenant-a/x", "tenant-z")
    assert listing.reason == REASON_ROOT_OUTSIDE_AREA, listing


@pytest.mark.parametrize("root", ["s3://Bad_Bucket/x", f"s3://{BUCKET_A}/tenant-a/../tenant-b",
                                  f"s3://{BUCKET_A}/tenant-a//x", "s3://a..b/x"])  # fmt: skip
def test_a_malformed_s3_root_is_invalid(pool: DiscoveryPool, root: str) -> None:
    listing = timed(pool, root, "tenant-a")
    assert listing.reason == REASON_INVALID_ROOT and listing.error, listing


FAILURES = {
    "no such bucket": ("s3://no-such-bucket/x", ("does not exist", "NoSuchBucket", "not found")),
    "bucket the keys may not read": ("s3://not-my-bucket/x", ("access denied", "AccessDenied")),
    "wrong keys": (f"s3://{BUCKET_A}/wrong-keys", ("access denied", "InvalidAccessKeyId", "AccessDenied")),
    "endpoint down": (f"s3://{BUCKET_A}/down", ("connect", "Connect")),
    "secret not mounted": (f"s3://{BUCKET_A}/unmounted", ("Secret not-mounted is not mounted",)),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_a_storage_failure_is_a_listing_error_in_time(pool: DiscoveryPool, case: str) -> None:
    root, words = FAILURES[case]
    listing = timed(pool, root, "tenant-c")
    assert listing.reason == REASON_STORAGE_UNREADABLE and not listing.missing, listing
    assert listing.error and any(w in listing.error for w in words), listing.error
    assert "not-the-secret" not in listing.error


def test_an_outage_holds_the_job_with_the_stores_message_and_a_retry(pool: DiscoveryPool) -> None:
    """The pool's answer for an endpoint that is down, through the decision core: CheckpointStorageReady=False
    with the store's words, no relaunch from scratch, and a wake-up to try again."""
    root = f"s3://{BUCKET_A}/down"
    listing = timed(pool, root, "tenant-c")
    status = running_status(phase=c.RESTARTING, latestCheckpoint={"path": f"{root}/{STEP1}", "step": 1})
    plan = reconcile(job(status, checkpoint={"root": root}), [], healthy(4), listing, NOW)
    storage = next(x for x in plan.status["conditions"] if x["type"] == c.COND_STORAGE)
    assert storage["status"] == "False" and storage["reason"] == REASON_STORAGE_UNREADABLE
    assert listing.error and listing.error in storage["message"] and "object store" in storage["message"]
    assert not plan.create and plan.requeue_after == STORAGE_RETRY_SECONDS


def test_the_other_tenant_is_still_served(pool: DiscoveryPool, admin: Any, template: dict[str, bytes]) -> None:
    plant(admin, f"s3://{BUCKET_B}/job", checkpoint(template, STEP1))
    listing = timed(pool, f"s3://{BUCKET_B}/job", "tenant-b")
    assert listing.latest is not None and listing.latest.step == 1, listing


def test_a_pickle_bomb_in_a_bucket_costs_one_worker_not_the_operator(
        server: S3Server, admin: Any, template: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory) -> None:
    """A tight address-space limit still holds the S3 client (small thread stacks, two malloc arenas); the
    bomb ends in a reason, and the next job is served by a fresh worker."""
    secrets = tmp_path_factory.mktemp("bomb-secrets")
    (secrets / "ro-a").mkdir()
    (secrets / "ro-a" / "AWS_ACCESS_KEY_ID").write_text(ident(server, "ro-a").access_key)
    (secrets / "ro-a" / "AWS_SECRET_ACCESS_KEY").write_text(ident(server, "ro-a").secret_key)
    area = ObjectStoreArea(f"s3://{BUCKET_A}/bomb", ("tenant-a",), "ro-a", server.endpoint)
    p = DiscoveryPool(DiscoverySettings(timeout_seconds=30.0, workers=1, memory_bytes=192 << 20,
                                        object_areas=(area,), object_secrets_dir=str(secrets)))  # fmt: skip
    try:
        p.warm()
        plant(admin, f"s3://{BUCKET_A}/bomb/job", {**checkpoint(template, STEP1),
                                                  f"{STEP2}/.metadata": attacks.list_bomb(3_000_000)})  # fmt: skip
        plant(admin, f"s3://{BUCKET_A}/bomb/fine", checkpoint(template, STEP1))
        started = time.monotonic()
        bombed = p.discover(f"s3://{BUCKET_A}/bomb/job", "tenant-a")
        assert time.monotonic() - started < 30 + SLACK
        assert bombed.reason == REASON_DISCOVERY_FAILED and "memory" in (bombed.error or ""), bombed
        fine = timed(p, f"s3://{BUCKET_A}/bomb/fine", "tenant-a")
        assert fine.latest is not None and fine.latest.step == 1, fine
    finally:
        p.close()


def test_keys_echoed_by_a_store_are_redacted() -> None:
    listing = Listing("s3://b/x", None, (Verdict(2, "s3://b/x/AKID", False, "AKID sk/+secret"),),
                             "denied for AKID with sk/+secret")  # fmt: skip
    clean = _redacted(listing, ("AKID", "sk/+secret"))
    assert clean.error == "denied for <redacted> with <redacted>"
    assert clean.skipped[0].reason == "<redacted> <redacted>" and "AKID" not in clean.skipped[0].path
