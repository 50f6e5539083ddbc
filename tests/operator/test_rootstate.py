"""rootstate: whether the checkpoint root can be trusted this pass, what the user should do, and whether a
launch may use the listing."""

from __future__ import annotations

import pytest

from resilient_contract import storage
from resilient_contract.storage import Listing
from resilient_operator import constants as c
from resilient_operator.core import rootstate
from tests.operator.builders import listing

ROOT = "/ckpt/demo"


@pytest.mark.parametrize(
    ("name", "seen", "in_use_by", "seen_before", "ready", "reason", "retry", "says"),
    [
        ("not read this pass", Listing(ROOT, None, reason=c.DISCOVERY_SKIPPED), None, False, None, "skip", None, ""),
        ("readable", listing(10), None, False, True, c.REASON_STORAGE_OK, None, "is readable"),
        ("root used by another live job", listing(10), "ns/other", False, False, c.REASON_ROOT_IN_USE,
         rootstate.STORAGE_RETRY_SECONDS, "shareRoot"),
        ("discovery busy: condition untouched", Listing(ROOT, None, reason=storage.errors.REASON_DISCOVERY_BUSY), None,
         False, None, "", rootstate.DISCOVERY_BUSY_RETRY_SECONDS, ""),
        ("unreadable: generic advice", listing(error="permission denied"), None, False, False,
         c.REASON_STORAGE_UNREADABLE, rootstate.STORAGE_RETRY_SECONDS, "readable by the operator"),
        ("missing, never seen: fine (first run)", listing(error="no such directory", missing=True), None, False,
         True, c.REASON_STORAGE_OK, None, "is readable"),
        ("missing after checkpoints were seen", listing(error="no such directory", missing=True), None, True,
         False, c.REASON_STORAGE_UNREADABLE, rootstate.STORAGE_RETRY_SECONDS, "is the volume mounted?"),
    ],
)
def test_judge(name: str, seen: Listing, in_use_by: str | None, seen_before: bool, ready: bool | None,
               reason: str, retry: float | None, says: str) -> None:
    state = rootstate.judge(seen, ROOT, in_use_by, seen_before)
    if reason == "skip":
        assert state is None, name
        return
    assert state is not None
    assert (state.ready, state.retry) == (ready, retry), name
    assert state.reason == reason and says in state.message, name


@pytest.mark.parametrize("reason", sorted(rootstate.ADVICE))
def test_each_refusal_has_its_own_advice(reason: str) -> None:
    state = rootstate.judge(Listing(ROOT, None, error="refused", reason=reason), ROOT, None, False)
    assert state is not None and state.reason == reason and rootstate.ADVICE[reason] in state.message


@pytest.mark.parametrize(
    ("name", "seen", "in_use_by", "seen_before", "launchable"),
    [
        ("readable", listing(10), None, False, (True, None)),
        ("root in use", listing(10), "ns/other", False, (False, None)),
        ("not read: read first, soon", Listing(ROOT, None, reason=c.DISCOVERY_SKIPPED), None, False,
         (False, rootstate.DISCOVERY_BUSY_RETRY_SECONDS)),
        ("unreadable", listing(error="permission denied"), None, False, (False, None)),
        ("missing on a first run: from scratch", listing(error="gone", missing=True), None, False, (True, None)),
        ("missing after saves: never from scratch", listing(error="gone", missing=True), None, True, (False, None)),
    ],
)
def test_launchable(name: str, seen: Listing, in_use_by: str | None, seen_before: bool,
                    launchable: tuple[bool, float | None]) -> None:
    assert rootstate.launchable(seen, in_use_by, seen_before) == launchable, name
