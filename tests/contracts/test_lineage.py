"""The fencing-token rule, on hand-made lineages (no files: the rule is pure)."""

from __future__ import annotations

import pytest

from resilient_contract import lineage
from resilient_contract.lineage import Lineage

JOB = "3f1c-uid"


@pytest.mark.parametrize(
    ("name", "starts", "step", "writer", "fence"),
    [
        ("newest attempt's own save", {1: None, 2: 10}, 20, 2, None),
        ("older attempt's save at or before the next one's start: a resume source", {1: None, 2: 10}, 10, 1, None),
        ("older attempt's save past the next one's start: written after its fence", {1: None, 2: 10}, 20, 1, 2),
        ("older attempt, next one started from scratch", {1: None, 2: None}, 5, 1, 2),
        ("fenced two attempts later", {1: None, 2: 10, 3: 30}, 31, 2, 3),
        ("an attempt two back, valid through both later starts", {1: None, 2: 10, 3: 30}, 10, 1, None),
        ("an attempt two back, past the middle one's start", {1: None, 2: 10, 3: 30}, 20, 1, 2),
        ("writer newer than any known start (its mark not written yet)", {1: None}, 20, 2, None),
    ],
)
def test_rule(name: str, starts: dict[int, int | None], step: int, writer: int, fence: int | None) -> None:
    rule = Lineage(JOB, starts)
    assert rule.fenced_by(step, (JOB, writer)) == fence, name
    assert (rule.refusal(step, (JOB, writer)) is None) == (fence is None)


def test_tokens_of_another_incarnation_or_none_are_left_to_the_other_rules() -> None:
    rule = Lineage(JOB, {1: None, 2: 10})
    assert rule.fenced_by(20, None) is None  # older than tokens
    assert rule.fenced_by(20, ("an-earlier-job-with-the-same-name", 1)) is None


def test_the_operators_record_wins_and_tokens_round_trip() -> None:
    assert Lineage.merge(JOB, [(1, None), (2, 8)], [(2, 10)]).starts == {1: None, 2: 10}
    assert lineage.parse_marker(lineage.format_marker(JOB, 3, 12)) == (JOB, 3, 12)
    assert lineage.parse_marker(lineage.format_marker(JOB, 1, None)) == (JOB, 1, None)
    assert lineage.parse_marker_name(lineage.marker_name(JOB, 7)) == (JOB, 7)
    assert lineage.parse_writer(lineage.format_writer(JOB, 4)) == (JOB, 4)
    assert lineage.job_id(None) == lineage.job_id("../x") == lineage.LOCAL_JOB


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"[]", b'{"job": "a", "attempt": 0}', b'{"job": "a", "attempt": true}',
     b'{"job": "a", "attempt": 2, "resumed_step": -1}', b'{"job": "a", "attempt": "2"}',
     b'{"job": "../x", "attempt": 2}', b"x" * 1000, b"[" * 100_000, b"attempt=1 job=a\xff"],
)
def test_hostile_tokens_are_ignored(data: bytes) -> None:
    assert lineage.parse_marker(data) is None
    assert lineage.parse_writer(data) is None
