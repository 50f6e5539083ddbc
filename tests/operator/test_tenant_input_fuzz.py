"""Every tenant-written value is bounded where it is parsed (issue 25, item 2).

Progress reports, termination messages, fence marks, writer tokens, step names and pod labels/annotations are
written by the tenant's containers or by anyone who may edit the tenant's pods. Each parser must answer "no
value" (or a bounded one) for any bytes, never raise; and `reconcile` fed with such input must always return
a Plan whose status is JSON and fits the CRD's types (int64 integers, finite numbers, RFC 3339 times), so the
API server accepts the write. The fuzzing is seeded (reproducible) and needs no extra library.
"""

from __future__ import annotations

import json
import math
import os
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from resilient_contract import completion, lineage, progress, storage
from resilient_operator import constants as c
from resilient_operator import controller, discovery, views
from resilient_operator.core import failures, reconcile
from resilient_operator.core.plan import Plan
from resilient_operator.core.timeutil import fmt, parse
from tests.operator.builders import NOW, crd, healthy, job_object, running_status

INT64 = 2**63
SEEDS = range(120)
POD = "demo-a1-0"

# Adversarial shapes, beside purely random bytes.
HUGE_DIGITS = "9" * 30
THOUSANDS = "7" * 4000
NON_ASCII = "\u0661\u0662\u0663"  # Arabic-Indic 123: str.isdigit() is True, int() accepts it
ADVERSARIAL_MESSAGES = [
    f"RTJ_HUNG step=41 rank=2 stalled_s={HUGE_DIGITS} timeout_s=30 attempt=1",
    f"RTJ_HUNG step={THOUSANDS[:3000]} rank=2 stalled_s=30.1 timeout_s=30 attempt=1",
    f"RTJ_HUNG step={NON_ASCII} rank={NON_ASCII} stalled_s={NON_ASCII} timeout_s=30",
    "RTJ_HUNG step=\u00b2 stalled_s=1\u00b2.5",
    f"RTJ_HUNG step=1 stalled_s={HUGE_DIGITS}.{HUGE_DIGITS}",
    "RTJ_HUNG step=1 stalled_s=1e400 timeout_s=nan",
    f"RTJ_PREEMPTED step={HUGE_DIGITS} checkpoint=/x attempt=1",
    f"RTJ_PREEMPTED step={THOUSANDS[:3500]}",
    f"RTJ_SUCCEEDED step={NON_ASCII}",
    "RTJ_HUNG " + "step=1 " * 600,
    "RTJ_HUNG\x00step=1\x00stalled_s=5",
    "RTJ_HUNG step=-5 stalled_s=-1e9",
]


def adversarial_reports(pod: str) -> list[bytes]:
    def doc(**fields: Any) -> bytes:
        base: dict[str, Any] = {"pod": pod, "attempt": 1, "step": 12, "time": NOW.timestamp(),
                                "firstStepAt": NOW.timestamp() - 5, "stepSeconds": 1.0, "slowestRank": 0}
        base.update(fields)
        return json.dumps(base).encode()

    return [
        doc(time=253402300800.0),  # year 10000: datetime.fromtimestamp raises
        doc(time=1e300), doc(firstStepAt=1e300), doc(firstStepAt=253402300799.0 * 0.999),
        doc(step=2**63), doc(step=10**30), doc(step=2**53), doc(attempt=2**62),
        doc(stepSeconds=float("nan")), doc(stepSeconds=1e20), doc(slowestRank=-1),
        b"[" * 3000 + b"]" * 3000,  # RecursionError inside json
        b'{"pod": "' + pod.encode() + b'", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}",
        b'{"pod": "' + pod.encode() + b'", "attempt": 1, "step": ' + THOUSANDS.encode() + b', "time": 1}',
        b"\xff\xfe\x00garbage", b"", b"null", b"{}", b"1e999",
    ]


def random_bytes(rng: random.Random) -> bytes:
    pool = [b"{", b"}", b"[", b"]", b'"', b":", b",", b"9", b"0", b".", b"e", b"-", b"pod", b"step", b"time",
            b"NaN", b"Infinity", b"\xff", b"\x00", b"attempt", b"RTJ_HUNG", b"=", b" ", b"\n"]
    if rng.random() < 0.5:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 300)))
    return b"".join(rng.choice(pool) for _ in range(rng.randrange(0, 200)))


def random_text(rng: random.Random) -> str:
    if rng.random() < 0.4:
        return rng.choice(ADVERSARIAL_MESSAGES)
    raw = random_bytes(rng).decode("utf-8", "replace")
    return rng.choice(["RTJ_HUNG ", "RTJ_PREEMPTED ", "RTJ_SUCCEEDED ", ""]) + raw


# ---- the CRD's types -----------------------------------------------------------------------------------
def status_schema() -> dict[str, Any]:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]


def check_types(value: Any, schema: dict[str, Any], where: str = "status") -> None:
    """The API server's structural checks that would refuse (or kopf would drop) a status write."""
    kind = schema.get("type")
    if kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: {value!r} is not an integer"
        assert -INT64 <= value < INT64, f"{where}: {str(value)[:40]}... does not fit int64"
    elif kind == "number":
        assert isinstance(value, int | float) and not isinstance(value, bool), f"{where}: {value!r}"
        assert math.isfinite(value) and abs(value) < 1e15, f"{where}: {value!r} is not a sane number"
    elif kind == "string":
        assert isinstance(value, str), f"{where}: {value!r} is not a string"
        if schema.get("format") == "date-time":
            assert parse(value) is not None, f"{where}: {value!r} is not a date-time"
    elif kind == "boolean":
        assert isinstance(value, bool), f"{where}: {value!r}"
    elif kind == "array":
        assert isinstance(value, list), f"{where}: {value!r} is not a list"
        for i, item in enumerate(value):
            check_types(item, schema.get("items") or {}, f"{where}[{i}]")
    elif kind == "object":
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        props = schema.get("properties") or {}
        free = schema.get("additionalProperties") or schema.get("x-kubernetes-preserve-unknown-fields")
        for key, item in value.items():
            if key in props:
                check_types(item, props[key], f"{where}.{key}")
            else:
                assert free, f"{where}.{key} is not in the CRD (the API server would drop it)"


def assert_writable(plan: Plan) -> None:
    assert isinstance(plan, Plan)
    json.dumps(plan.status, allow_nan=False)
    check_types(plan.status, status_schema())
    for event in plan.events:
        assert isinstance(event.message, str) and len(event.message) < 64 * 1024


# ---- each parser on its own --------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_every_parser_answers_bounded_values_for_any_bytes(seed: int) -> None:
    rng = random.Random(seed)
    inputs = [random_bytes(rng) for _ in range(8)] + adversarial_reports(POD)
    inputs += [m.encode() for m in ADVERSARIAL_MESSAGES]
    for raw in inputs:
        report = progress.parse_report(raw, POD)
        if report is not None:
            assert 0 <= report.step <= progress.MAX_STEP and 0 <= report.attempt < 2**31
            assert 0 <= report.time <= progress.MAX_EPOCH
            assert report.first_step_at is None or 0 <= report.first_step_at <= progress.MAX_EPOCH
        text = raw.decode("utf-8", "replace")
        outcome = completion.parse_message(text)
        if outcome is not None:
            for key in ("step", "rank", "attempt", "world_size"):
                value = outcome.int_field(key)
                assert value is None or 0 <= value <= completion.MAX_STEP
            for key in ("stalled_s", "timeout_s"):
                secs = outcome.seconds_field(key)
                assert secs is None or 0 <= secs <= completion.MAX_SECONDS
        mark = lineage.parse_marker(raw[: lineage.MAX_TOKEN_BYTES])
        if mark is not None:
            assert 1 <= mark[1] < INT64 and (mark[2] is None or 0 <= mark[2] < INT64)
        writer = lineage.parse_writer(raw[: lineage.MAX_TOKEN_BYTES])
        assert writer is None or 0 <= writer[1] < 10**9
        step = storage.parse_step_dir(text)
        assert step is None or 0 <= step < 10**10
        assert parse(text) is None or parse(text).year <= 9999


def test_a_30_digit_stall_in_a_hang_message_is_not_believed() -> None:
    """`RTJ_HUNG stalled_s=<30 digits>` used to raise OverflowError in timedelta on every reconcile."""
    from tests.operator.builders import gang, listing

    pods = gang(1, 4, r2=dict(phase="Failed", exit_code=124, finished_ago=failures.HANG_GATHER_SECONDS + 1,
                              message=ADVERSARIAL_MESSAGES[0]))
    plan = reconcile(views.job_view(job_object(status=running_status(), progressTimeoutSeconds=30)), pods,
                     healthy(4), listing(40), NOW)
    assert plan.status["lastFailure"]["reason"] == c.REASON_HANG
    assert plan.status["phase"] == c.RESTARTING
    assert_writable(plan)


def test_a_step_of_thousands_of_digits_never_reaches_status() -> None:
    from tests.operator.builders import gang, listing

    status = running_status()
    status["goodput"] = {"open": {"kind": c.INFRASTRUCTURE, "occurredAt": fmt(NOW), "detectedAt": fmt(NOW)}}
    pods = gang(1, 4, r1=dict(phase="Failed", exit_code=0, finished_ago=1.0, message=ADVERSARIAL_MESSAGES[7]),
                r2=dict(phase="Failed", exit_code=124, finished_ago=1.0, message=ADVERSARIAL_MESSAGES[1]))
    plan = reconcile(views.job_view(job_object(status=status)), pods, healthy(4), listing(40), NOW)
    assert_writable(plan)


def test_non_ascii_digits_in_a_message_are_not_a_step() -> None:
    outcome = completion.parse_message(f"RTJ_PREEMPTED step={NON_ASCII}")
    assert outcome is not None and outcome.int_field("step") is None
    assert completion.bounded_int("\u00b2") is None and completion.bounded_int("12") == 12


def test_a_report_from_beyond_year_9999_or_deeply_nested_is_no_report(tmp_path: Path) -> None:
    root = tmp_path / "ml" / "demo"
    (root / progress.DIRNAME).mkdir(parents=True)
    job = views.job_view(job_object(status=running_status(), checkpoint={"root": str(root)}))
    pods = [views.pod_view(_pod_object(rank)) for rank in range(4)]
    reports = adversarial_reports(POD)
    for raw in (reports[0], reports[11]):
        (root / progress.DIRNAME / f"{POD}.json").write_bytes(raw)
        assert controller.read_progress(job, pods, NOW, sandboxed_read(root, pods)) == []
    good = json.dumps({"pod": POD, "attempt": 1, "step": 5, "time": NOW.timestamp() + 10**6,
                       "firstStepAt": NOW.timestamp() + 10**6}).encode()
    (root / progress.DIRNAME / f"{POD}.json").write_bytes(good)
    (report,) = controller.read_progress(job, pods, NOW, sandboxed_read(root, pods))
    assert report.updated <= NOW and report.first_step_at is not None and report.first_step_at <= NOW


def test_a_hang_verdict_survives_the_discovery_workers_hand_over(tmp_path: Path) -> None:
    """An in-place agent's only way to tell of a hang: the verdict in its report reaches the core as written
    (the worker hands over the file's own format, which the operator parses again)."""
    root = tmp_path / "ml" / "demo"
    (root / progress.DIRNAME).mkdir(parents=True)
    job = views.job_view(job_object(status=running_status(), checkpoint={"root": str(root)}))
    pods = [views.pod_view(_pod_object(rank)) for rank in range(4)]
    hang = progress.Hang(step=41, rank=2, stalled_seconds=20.5, timeout_seconds=20.0)
    progress.write_report(str(root), progress.Report(POD, 1, 41, NOW.timestamp() - 1, None, 0.5, 2, hang))
    (report,) = controller.read_progress(job, pods, NOW, sandboxed_read(root, pods))
    assert report.hung == hang and report.step == 41 and report.slowest_rank == 2


def sandboxed_read(root: Path, pods: list[Any]) -> dict[str, progress.Report]:
    """What a discovery worker answers for these pods (the same function, run here in-process), checked again
    on the operator's side as the pool does."""
    names = [p.name for p in pods]
    return discovery._reports_from(discovery.read_reports(str(root), str(root.parent), names), names)


def _pod_object(rank: int, *, labels: dict[str, Any] | None = None, annotations: dict[str, Any] | None = None,
                message: str | None = None, finished: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"demo-a1-{rank}",
        "labels": labels if labels is not None else {c.LABEL_JOB: "demo", c.LABEL_ATTEMPT: "1",
                                                     c.LABEL_RANK: str(rank)},
        "annotations": annotations if annotations is not None else {c.ANNOTATION_REPLICAS: "4"},
        "ownerReferences": [{"apiVersion": c.API_VERSION, "kind": c.KIND, "name": "demo", "uid": "uid-1",
                             "controller": True}],
    }
    status: dict[str, Any] = {"phase": "Running", "conditions": []}
    if message is not None:
        status["phase"] = "Failed"
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {
            "exitCode": 124, "message": message, "finishedAt": finished or fmt(NOW - timedelta(seconds=1))}}}]
    return {"metadata": meta, "spec": {"nodeName": f"n{rank}"}, "status": status}


def test_an_edited_attempt_label_or_resume_annotation_cannot_overflow_status() -> None:
    from tests.operator.builders import listing

    root = "/ckpt/demo"
    huge = str(2**70)
    pods = [views.pod_view(_pod_object(0, labels={c.LABEL_ATTEMPT: huge, c.LABEL_RANK: huge},
                                       annotations={c.ANNOTATION_REPLICAS: huge,
                                                    c.ANNOTATION_RESUME_FROM: f"{root}/step-{huge}",
                                                    c.ANNOTATION_RESUME_STEP: huge}))]
    assert pods[0].attempt == 0 and pods[0].rank == -1 and pods[0].launch_replicas is None
    plan = reconcile(views.job_view(job_object(status=running_status())), pods, healthy(4), listing(40), NOW)
    assert_writable(plan)


# ---- through the whole reconcile -------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_reconcile_always_plans_and_writes_a_valid_status_whatever_the_tenant_wrote(seed: int,
                                                                                    tmp_path: Path) -> None:
    from tests.operator.builders import listing

    rng = random.Random(seed)
    root = tmp_path / "ml" / "demo"
    (root / progress.DIRNAME).mkdir(parents=True)
    status = running_status(replicas=4)
    if rng.random() < 0.5:  # a recovery is open: reports then feed its reach, its first step and its costs
        status["goodput"] = {"open": {"kind": c.INFRASTRUCTURE, "occurredAt": fmt(NOW - timedelta(seconds=60)),
                                      "detectedAt": fmt(NOW - timedelta(seconds=50)),
                                      "launchedAt": fmt(NOW - timedelta(seconds=40)),
                                      "runningAt": fmt(NOW - timedelta(seconds=30)), "resumedStep": 10}}
        status["startTime"] = fmt(NOW - timedelta(hours=1))
    job = views.job_view(job_object(status=status, checkpoint={"root": str(root)}, progressTimeoutSeconds=30))
    pods = []
    candidates = adversarial_reports(POD)
    for rank in range(4):
        name = f"demo-a1-{rank}"
        raw = rng.choice([*adversarial_reports(name), random_bytes(rng)]) if rng.random() < 0.9 else \
            rng.choice(candidates)
        (root / progress.DIRNAME / f"{name}.json").write_bytes(raw)
        labels = {c.LABEL_JOB: "demo", c.LABEL_ATTEMPT: "1", c.LABEL_RANK: str(rank)}
        annotations: dict[str, Any] = {c.ANNOTATION_REPLICAS: "4"}
        if rng.random() < 0.2:
            annotations[c.ANNOTATION_RESUME_STEP] = rng.choice([HUGE_DIGITS, NON_ASCII, "-1", THOUSANDS[:50]])
            annotations[c.ANNOTATION_RESUME_FROM] = f"{root}/step-{annotations[c.ANNOTATION_RESUME_STEP]}"
        message = random_text(rng) if rng.random() < 0.7 else None
        finished = rng.choice([None, "garbage", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z"])
        pods.append(views.pod_view(_pod_object(rank, labels=labels, annotations=annotations, message=message,
                                               finished=finished)))
    reports = controller.read_progress(job, pods, NOW, sandboxed_read(root, pods))
    plan = reconcile(job, pods, healthy(4), listing(40), NOW, progress=reports)
    assert_writable(plan)
    # and the next pass, from what this one wrote, with the reports still there
    again = reconcile(views.job_view(job_object(status=plan.status, checkpoint={"root": str(root)},
                                                progressTimeoutSeconds=30)), pods, healthy(4), listing(40),
                      NOW + timedelta(seconds=5), progress=reports)
    assert_writable(again)


def test_a_recovery_charged_with_impossible_numbers_costs_at_most_the_jobs_wall_time() -> None:
    """One tenant's impossible step counts used to put 1e20 s into the cluster-wide recovery histogram."""
    from resilient_operator.core import goodput

    status: dict[str, Any] = {"startTime": fmt(NOW - timedelta(hours=1)), "goodput": {
        "stepSeconds": 86400.0, "open": {"kind": c.INFRASTRUCTURE, "occurredAt": fmt(NOW - timedelta(seconds=9)),
                                         "detectedAt": fmt(NOW - timedelta(seconds=8)),
                                         "launchedAt": fmt(NOW - timedelta(seconds=7)),
                                         "runningAt": fmt(NOW - timedelta(seconds=6)),
                                         "reachedStep": progress.MAX_STEP, "resumedStep": 0}}}
    goodput.close(status, NOW)
    assert status["goodput"]["lost"]["recompute"] <= 3600.0


def test_the_fuzz_corpus_reaches_the_operators_own_read_path(tmp_path: Path) -> None:
    """Guard: the report files above are read by the same function the controller uses."""
    assert os.path.basename(progress.report_path(str(tmp_path), POD)) == f"{POD}.json"
