"""The fencing-token rule, on hand-made lineages (no files: the rule is pure)."""

from __future__ import annotations

import pytest

from resilient_contract import lineage
from resilient_contract.lineage import Lineage


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
        ("no writer token: predates tokens", {1: None, 2: 10}, 20, None, None),
        ("writer newer than any known start (its mark not written yet)", {1: None}, 20, 2, None),
    ],
)
def test_rule(name: str, starts: dict[int, int | None], step: int, writer: int | None, fence: int | None) -> None:
    assert Lineage(starts).fenced_by(step, writer) == fence, name
    assert (Lineage(starts).refusal(step, writer) is None) == (fence is None)


def test_the_operators_record_wins_and_marks_round_trip() -> None:
    from_storage = [(1, None), (2, 8)]
    from_status = [(2, 10)]
    assert Lineage.merge(from_storage, from_status).starts == {1: None, 2: 10}
    assert lineage.parse_marker(lineage.format_marker(3, 12)) == (3, 12)
    assert lineage.parse_marker(lineage.format_marker(1, None)) == (1, None)
    assert lineage.parse_marker_name(lineage.marker_name(7)) == 7
    assert lineage.parse_writer(lineage.format_writer(4)) == 4


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"[]", b'{"attempt": 0}', b'{"attempt": true}', b'{"attempt": 2, "resumed_step": -1}',
     b'{"attempt": "2"}', b"x" * 1000, b'[' * 100_000],
)
def test_hostile_marks_are_ignored(data: bytes) -> None:
    assert lineage.parse_marker(data) is None
    assert lineage.parse_writer(data) is None
