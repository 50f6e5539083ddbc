"""A checkpoint a trainer refused as corrupt (its bytes did not match their checksums): the operator records it
in status.badCheckpoints, says so once with what to do, and never injects it again as RTJ_RESUME_FROM.

The operator learns of it from the trainer only (it never reads a shard): a termination message's
`refused_checkpoint=` (tenant-written, bounded) or discovery's `corrupt` verdict (the trainer's mark, a stat).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from resilient_contract import completion, environment
from resilient_contract.storage import Listing, Verdict, discover
from resilient_contract.storage.names import CORRUPT_FILE, step_dir_name
from resilient_operator import constants as c
from resilient_operator.core import badcheckpoints, reconcile
from tests.operator.builders import CKPT_ROOT, NOW, gang, healthy, job, listing, pod, running_status
from tests.operator.test_tenant_input_fuzz import ADVERSARIAL_MESSAGES, assert_writable, random_text

BAD, OTHER = step_dir_name(60), step_dir_name(50, 3)
TS = "2026-11-29T12:00:00Z"


def message(kind: str = completion.SUCCEEDED, refused: str = BAD, **fields: Any) -> str:
    return completion.format_message(kind, refused_checkpoint=refused, attempt=1, **fields)


def corrupt(step: int) -> Verdict:
    return Verdict(step, f"{CKPT_ROOT}/{step_dir_name(step)}", False, "corrupt", corrupt=True)


@dataclass(frozen=True)
class Row:
    name: str
    messages: tuple[str, ...] = ()
    verdicts: tuple[Verdict, ...] = ()
    owned: bool = True
    expected: tuple[str, ...] = ()


ROWS = [
    Row("success message names it", (message(step=80),), expected=(BAD,)),
    Row("the message written at the fallback", (message(completion.CHECKPOINT_REFUSED, resumed_from="none"),),
        expected=(BAD,)),
    Row("several names, each once", (message(refused=f"{BAD},{OTHER},{BAD}"),), expected=(BAD, OTHER)),
    Row("discovery's corrupt verdict (the trainer's mark)", verdicts=(corrupt(70),), expected=(step_dir_name(70),)),
    Row("a verdict that is only incomplete", verdicts=(Verdict(70, "x/step-0000000070", False, "no .metadata"),)),
    Row("a pod the job does not own", (message(),), owned=False),
    Row("a path, not a name", (message(refused=f"../{BAD}"),)),
    Row("an absolute path", (f"RTJ_SUCCEEDED refused_checkpoint={CKPT_ROOT}/{BAD} attempt=1",)),
    Row("non-ASCII digits", ("RTJ_SUCCEEDED refused_checkpoint=step-\u0661\u0662\u0663\u0664\u0665\u0666\u0667"
                             "\u0668\u0669\u0660",)),
    Row("a name too long to be a step directory", (f"RTJ_SUCCEEDED refused_checkpoint=step-{'9' * 30}",)),
    Row("thousands of names are not believed", ("RTJ_SUCCEEDED refused_checkpoint=" + ",".join([BAD] * 300),)),
    Row("no kind, no outcome", (f"refused_checkpoint={BAD}",)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_what_the_trainer_reported(row: Row) -> None:
    pods = [pod(1, i, phase="Failed", exit_code=1, finished_ago=1.0, message=m,
                owner_uid="uid-1" if row.owned else "uid-other") for i, m in enumerate(row.messages)]
    assert tuple(badcheckpoints.reported(pods, "uid-1", row.verdicts)) == row.expected


def test_record_is_bounded_deduplicated_and_returns_only_what_is_new() -> None:
    status: dict[str, Any] = {}
    added = badcheckpoints.record(status, CKPT_ROOT, [BAD, OTHER], TS)  # type: ignore[arg-type]
    assert added == [{"path": f"{CKPT_ROOT}/{BAD}", "step": 60, "time": TS},
                     {"path": f"{CKPT_ROOT}/{OTHER}", "step": 50, "time": TS}]
    assert badcheckpoints.record(status, CKPT_ROOT, [BAD], TS) == []  # type: ignore[arg-type]
    assert badcheckpoints.names(status) == [BAD, OTHER]
    assert badcheckpoints.refused(status, f"{CKPT_ROOT}/{BAD}") and badcheckpoints.refused(status, f"x/{OTHER}/")
    assert not badcheckpoints.refused(status, f"{CKPT_ROOT}/{step_dir_name(40)}")
    assert not badcheckpoints.refused(status, None)
    many = [step_dir_name(i) for i in range(100, 140)]
    badcheckpoints.record(status, "s3://b/p", many, TS)  # type: ignore[arg-type]
    assert len(status["badCheckpoints"]) == c.BAD_CHECKPOINTS_LIMIT
    assert badcheckpoints.names(status) == many[-c.BAD_CHECKPOINTS_LIMIT:]
    assert status["badCheckpoints"][-1]["path"] == f"s3://b/p/{many[-1]}"


@pytest.mark.parametrize("value", [None, "x", 7, [1, "a", None], [{"path": 9}], [{"path": "/r/not-a-step"}],
                                   [{"path": "/r/" + "9" * 5000}], [{"path": f"/r/{BAD}"}] * 1000])
def test_a_hostile_status_names_nothing_or_a_bounded_few(value: Any) -> None:
    found = badcheckpoints.names({"badCheckpoints": value})
    assert len(found) <= 1 and all(n == BAD for n in found)


# ---- through reconcile ------------------------------------------------------------------------------------------
def launched_resume(plan: Any) -> list[str]:
    pods = [m for m in plan.manifests() if m["kind"] == "Pod"]
    return [{e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}[environment.RESUME_FROM]
            for p in pods]


def test_a_corrupt_checkpoint_reported_by_a_pod_is_recorded_announced_once_and_never_injected() -> None:
    failed = gang(1, 4, r0=dict(phase="Failed", exit_code=1, finished_ago=1.0,
                                message=message(completion.CHECKPOINT_REFUSED, resumed_from=step_dir_name(40))))
    stale = listing(60)  # the trainer could not mark it: discovery still offers it
    plan = reconcile(job(running_status()), failed, healthy(4), stale, NOW)
    assert_writable(plan)
    assert [e["path"] for e in plan.status["badCheckpoints"]] == [f"{CKPT_ROOT}/{BAD}"]
    told = [e for e in plan.events if e.reason == c.REASON_CHECKPOINT_CORRUPT]
    assert len(told) == 1 and BAD in told[0].message and "delete" in told[0].message
    assert not launched_resume(plan)

    between = {**plan.status, "phase": c.RESTARTING}
    between.pop("nextRetryTime", None)
    held = reconcile(job(between), [], healthy(4), stale, NOW)  # a listing taken before it was recorded
    assert launched_resume(held) == [] and held.requeue_after is not None and held.requeue_after <= 1.0
    assert not [e for e in held.events if e.reason == c.REASON_CHECKPOINT_CORRUPT]  # said once
    fresh = reconcile(job(between), [], healthy(4), listing(40), NOW)
    assert launched_resume(fresh) == [f"{CKPT_ROOT}/{step_dir_name(40)}"] * 4
    assert fresh.status["badCheckpoints"] == plan.status["badCheckpoints"]


def test_a_corrupt_verdict_is_recorded_and_the_previous_checkpoint_injected() -> None:
    status = {**running_status(), "phase": c.RESTARTING}
    seen = Listing(CKPT_ROOT, Verdict(40, f"{CKPT_ROOT}/{step_dir_name(40)}", True), (corrupt(60),))
    plan = reconcile(job(status), [], healthy(4), seen, NOW)
    assert_writable(plan)
    assert badcheckpoints.names(plan.status) == [BAD]
    assert [e for e in plan.events if e.reason == c.REASON_CHECKPOINT_CORRUPT]
    assert launched_resume(plan) == [f"{CKPT_ROOT}/{step_dir_name(40)}"] * 4


@pytest.mark.parametrize("seed", range(40))
def test_hostile_termination_messages_leave_a_writable_bounded_status(seed: int) -> None:
    rng = random.Random(seed)
    texts = [*ADVERSARIAL_MESSAGES, message(refused=",".join([BAD] * 40)),
             "RTJ_SUCCEEDED refused_checkpoint=" + "step-0000000001," * 900]
    overrides = {f"r{i}": dict(phase="Failed", exit_code=1, finished_ago=1.0,
                               message=rng.choice(texts) if rng.random() < 0.5 else
                               f"{random_text(rng)} refused_checkpoint={random_text(rng)[:60]}")
                 for i in range(4)}
    plan = reconcile(job(running_status()), gang(1, 4, **overrides), healthy(4), listing(40), NOW)
    assert_writable(plan)
    assert len(plan.status.get("badCheckpoints") or []) <= c.BAD_CHECKPOINTS_LIMIT


# ---- discovery leaves a recorded name out --------------------------------------------------------------------
def test_discovery_in_the_sandbox_never_offers_a_refused_checkpoint(tmp_path: Path) -> None:
    """Real DCP checkpoints under a namespace's area, read by the operator's sandboxed discovery worker: the name
    status.badCheckpoints records is skipped even with no mark in it, and a directory holding only the trainer's
    mark is refused by the completeness rule (a stat). Both verdicts are `corrupt`, which the operator records."""
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from resilient_operator.discovery import DiscoveryPool
    from resilient_operator.settings import DiscoverySettings

    root = tmp_path / "ml" / "job"
    for step in (40, 50, 60):
        state = {"w": torch.full((8,), float(step))}
        with pytest.warns(UserWarning):  # a single-process save warns that no process group exists
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(root / step_dir_name(step))))
    (root / step_dir_name(50) / CORRUPT_FILE).write_text("x")
    direct = discover(str(root), refused=[BAD])
    assert direct.latest is not None and direct.latest.step == 40
    assert [(v.step, v.corrupt) for v in direct.skipped] == [(60, True), (50, True)]

    pool = DiscoveryPool(DiscoverySettings(checkpoint_mount=str(tmp_path), timeout_seconds=30.0, workers=1))
    try:
        found, _ = pool.discover_with_reports(str(root), "ml", "uid-1", (), (), [BAD, "../evil", 7])  # type: ignore[list-item]
        assert found.latest is not None and found.latest.step == 40, found
        assert [(v.step, v.corrupt) for v in found.skipped] == [(60, True), (50, True)]
        plain = pool.discover(str(root), "ml")
        assert plain.latest is not None and plain.latest.step == 60  # not refused by name: offered
    finally:
        pool.close()
