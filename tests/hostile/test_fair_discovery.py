"""Fair, cheap discovery across tenants (issue 25, item 1), against the real sandboxed pool.

The attack: a namespace's jobs point at roots whose `.metadata` costs a good part of the deadline to reject
(a long run of cheap pickle opcodes ending in an invalid one), and their reconciles ask again and again. No
other namespace's discovery may then be answered `DiscoveryBusy`; a root is charged for the time it used; an
unchanged costly-to-reject file is parsed once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from resilient_contract import dcp_metadata
from resilient_contract.storage.errors import REASON_DISCOVERY_BUSY
from resilient_contract.storage.scan import discover
from resilient_operator import discovery
from resilient_operator.discovery import DiscoveryPool, FairSlots
from resilient_operator.settings import DiscoverySettings

pytestmark = pytest.mark.timeout(300)
DEADLINE = 2.0
SLACK = 3.0


def costly_rejection(seconds: float) -> bytes:
    """Cheap opcodes (NONE, POP) for about `seconds` of the bounded reader, then an opcode that does not exist."""
    pairs = 200_000
    body = b"\x80\x04" + b"N0" * pairs + b"\xfe"
    took = []
    for _ in range(3):  # the fastest of three: a busy moment during calibration must not shrink the payload
        start = time.monotonic()
        with pytest.raises(dcp_metadata.MalformedMetadata):
            dcp_metadata.storage_entries(body, dcp_metadata.Limits())
        took.append(time.monotonic() - start)
    per_pair = max(min(took) / pairs, 1e-7)
    return b"\x80\x04" + b"N0" * int(seconds / per_pair) + b"\xfe"


@pytest.fixture(scope="module")
def mount() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rtj-fair-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def hostile_root(mount: Path, payload: bytes, i: int) -> Path:
    root = mount / "attacker" / f"job{i}"
    step = root / "step-0000000010"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(payload)
    return root


def good_root(mount: Path) -> Path:
    root = mount / "good" / "job"
    root.mkdir(parents=True, exist_ok=True)
    return root


# ---- the scheduler on its own -------------------------------------------------------------------------------
def test_slots_go_round_robin_across_namespaces_and_never_all_to_one() -> None:
    slots = FairSlots(2, 1)
    assert slots.acquire("attacker", 0.1)
    assert not slots.acquire("attacker", 0.1)  # at its cap: the other slot stays for everyone else
    assert slots.acquire("good", 0.1)
    order: list[str] = []
    done = threading.Event()

    def take(ns: str) -> None:
        if slots.acquire(ns, 5.0):
            order.append(ns)

    waiters = [threading.Thread(target=take, args=(ns,)) for ns in ("attacker", "attacker", "other")]
    for t in waiters:
        t.start()
        time.sleep(0.05)  # arrival order: attacker, attacker, other
    slots.release("good")  # one slot frees: "other" is the only eligible namespace (attacker is at its cap)
    wait_for(lambda: len(order) == 1)
    assert order == ["other"]
    slots.release("attacker")  # now an attacker waiter may go (one at a time: its cap)
    wait_for(lambda: len(order) == 2)
    time.sleep(0.1)
    assert order == ["other", "attacker"]
    slots.release("other")  # a slot is free, but the attacker is at its cap: its last waiter still waits
    time.sleep(0.2)
    assert order == ["other", "attacker"]
    slots.release("attacker")
    for t in waiters:
        t.join(timeout=5)
    assert order == ["other", "attacker", "attacker"]
    done.set()


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_one_worker_pools_still_serve_a_lone_namespace() -> None:
    slots = FairSlots(1, 1)
    assert slots.acquire("only", 0.1)
    slots.release("only")
    assert slots.acquire("only", 0.1)


# ---- the real pool ------------------------------------------------------------------------------------------
def test_a_noisy_namespace_never_makes_another_wait_busy(mount: Path) -> None:
    """Twelve reconcile threads of one namespace keep asking about roots that each cost ~0.7 s to reject (the
    file rewritten between calls, so no cache helps); another namespace's discoveries are all served."""
    payload = costly_rejection(0.7)
    roots = [hostile_root(mount, payload, i) for i in range(24)]
    pool = DiscoveryPool(DiscoverySettings(checkpoint_mount=str(mount), timeout_seconds=DEADLINE, workers=2))
    stop = threading.Event()

    def attacker(k: int) -> None:
        i = k
        while not stop.is_set():
            root = roots[i % len(roots)]
            meta = root / "step-0000000010" / ".metadata"
            meta.write_bytes(payload)  # a new mtime: a fresh parse every time
            os.utime(meta, ns=(time.time_ns(), time.time_ns() + i))
            pool.discover(str(root), "attacker")
            i += 12

    try:
        pool.warm()
        threads = [threading.Thread(target=attacker, args=(k,), daemon=True) for k in range(12)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # the attackers hold both workers and a queue of waiters
        good = good_root(mount)
        answers = []
        for _ in range(6):
            start = time.monotonic()
            listing = pool.discover(str(good), "good")
            answers.append((listing.reason, time.monotonic() - start))
            time.sleep(0.2)
        assert all(reason != REASON_DISCOVERY_BUSY for reason, _ in answers), answers
        assert max(t for _, t in answers) < DEADLINE + SLACK, answers
    finally:
        stop.set()
        pool.close()


def test_a_root_is_charged_for_the_time_it_used(mount: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A root that cost ~0.5 s answers from that call for a while without using a worker, even though the call
    neither overran nor killed its worker."""
    # The charge threshold is lowered so that the worker's speed against the calibration's (other lanes run
    # beside this one) cannot decide the test: 0.5 s is 10x the threshold and a quarter of the deadline.
    monkeypatch.setattr(discovery, "CHARGE_MIN_SECONDS", 0.05)
    root = hostile_root(mount, costly_rejection(0.5), 900)
    pool = DiscoveryPool(DiscoverySettings(checkpoint_mount=str(mount), timeout_seconds=DEADLINE, workers=1))
    try:
        pool.warm()
        first = pool.discover(str(root), "attacker")
        assert first.latest is None and first.skipped and first.reason is None, first
        calls = []
        monkeypatch.setattr(pool, "_call", lambda *a, **k: calls.append(a) or (first, None))
        start = time.monotonic()
        again = pool.discover(str(root), "attacker")
        assert again == first and not calls and time.monotonic() - start < 0.1
        assert discovery.CHARGE_FACTOR >= 2
    finally:
        pool.close()


def test_an_unchanged_costly_rejection_is_parsed_once(mount: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative verdicts are remembered by the same stat signature as positive ones."""
    root = hostile_root(mount, b"\x80\x04" + b"N0" * 1000 + b"\xfe", 901)
    parses = []
    real = dcp_metadata.storage_entries

    def counting(data: bytes, limits: dcp_metadata.Limits) -> object:
        parses.append(len(data))
        return real(data, limits)

    monkeypatch.setattr(dcp_metadata, "storage_entries", counting)
    first = discover(str(root))
    second = discover(str(root))
    assert first.skipped[0].reason == second.skipped[0].reason and "opcode" in first.skipped[0].reason
    assert len(parses) == 1
    meta = root / "step-0000000010" / ".metadata"
    meta.write_bytes(meta.read_bytes())  # changed (a new mtime/ctime): parsed again
    os.utime(meta, ns=(time.time_ns(), time.time_ns() + 10**9))
    discover(str(root))
    assert len(parses) == 2
