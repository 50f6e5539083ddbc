"""history: the bounded per-attempt ledger in status, and the lineage record fencing tokens are checked by."""

from __future__ import annotations

from typing import Any

import pytest

from resilient_operator import constants as c
from resilient_operator.core import history
from tests.operator.builders import gang

TS = "2026-11-29T12:00:00Z"


def ledger(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"history": [dict(e) for e in entries]}


@pytest.mark.parametrize(
    ("name", "status", "attempt", "resumed", "expected"),
    [
        ("first attempt, from scratch", {}, 1, None, [{"attempt": 1, "replicas": 4, "startTime": TS}]),
        ("resumed attempt records its step", ledger({"attempt": 1}), 2, 20,
         [{"attempt": 1}, {"attempt": 2, "replicas": 4, "startTime": TS, "resumedFromStep": 20}]),
        ("the same attempt is not opened twice", ledger({"attempt": 2}), 2, 20, [{"attempt": 2}]),
    ],
)
def test_open_entry(name: str, status: dict[str, Any], attempt: int, resumed: int | None,
                    expected: list[dict[str, Any]]) -> None:
    history.open_entry(status, attempt, 4, resumed, TS)
    assert status["history"] == expected, name


def test_open_entry_keeps_the_last_history_limit() -> None:
    status: dict[str, Any] = {}
    for attempt in range(1, c.HISTORY_LIMIT + 6):
        history.open_entry(status, attempt, 1, None, TS)
    assert [e["attempt"] for e in status["history"]] == list(range(6, c.HISTORY_LIMIT + 6))


@pytest.mark.parametrize(
    ("name", "entry", "closed"),
    [
        ("open entry of this attempt: closed", {"attempt": 3}, True),
        ("already closed: the first reason stays", {"attempt": 3, "endTime": "earlier", "endReason": "NodeLost"},
         False),
        ("another attempt's entry: untouched", {"attempt": 2}, False),
    ],
)
def test_close_entry(name: str, entry: dict[str, Any], closed: bool) -> None:
    status = ledger(entry)
    history.close_entry(status, 3, c.REASON_GROW_BACK, TS)
    assert (status["history"][-1].get("endReason") == c.REASON_GROW_BACK) == closed, name


def test_record_nodes_names_the_attempts_nodes_once() -> None:
    status = ledger({"attempt": 1})
    history.record_nodes(status, 1, gang(1, 3) + gang(1, 1))
    assert status["history"][-1]["nodes"] == ["n0", "n1", "n2"]


@pytest.mark.parametrize(
    ("name", "entries", "starts"),
    [
        ("every attempt with its resumed step", [{"attempt": 1}, {"attempt": 2, "resumedFromStep": 20}],
         [(1, None), (2, 20)]),
        ("tenant-edited entries are skipped", [{"attempt": "1"}, {"attempt": 2, "resumedFromStep": "x"}], []),
    ],
)
def test_lineage_starts(name: str, entries: list[dict[str, Any]], starts: list[tuple[int, int | None]]) -> None:
    assert history.lineage_starts(ledger(*entries)) == starts, name


@pytest.mark.parametrize(
    ("name", "late", "step", "noted"),
    [
        ("first late write: noted", None, 30, True),
        ("an older step than one noted: not again", {"step": 40, "path": "p", "time": TS}, 30, False),
        ("a newer step: noted again", {"step": 20, "path": "p", "time": TS}, 30, True),
    ],
)
def test_note_late_write(name: str, late: dict[str, Any] | None, step: int, noted: bool) -> None:
    entry: dict[str, Any] = {"attempt": 1, **({"lateWrite": late} if late else {})}
    status = ledger(entry, {"attempt": 2})
    assert (history.note_late_write(status, 1, step, "root/step", TS) is not None) == noted, name
    assert history.note_late_write(status, 9, step, "root/step", TS) is None  # no such attempt
