"""Node health from observed Lease changes: skewed node clocks are neither lost at once nor immortal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from resilient_operator.core import health
from resilient_operator.core.probes import LeaseProbes
from resilient_operator.core.timeutil import fmt
from tests.operator import builders

T0 = datetime(2025, 1, 1, tzinfo=UTC)
TIMEOUT = 20.0
RENEW_EVERY = 10


def _renew_time(at: float, skew: float) -> str:
    """The renewTime a node whose clock is `skew` seconds off writes at true time `at`."""
    return fmt(T0 + timedelta(seconds=at + skew))


def _lost_at(probes: LeaseProbes, at: float) -> bool:
    view = builders.node("n")
    now = T0 + timedelta(seconds=at)
    view = type(view)(**{**view.__dict__, "lease_renewed": probes.renewed("n")})
    return health.node_loss("n", view, now, TIMEOUT) is not None


# (case, node clock skew s, node renews until true time s (None: forever), operator checks at s, lost?)
ROWS = [
    ("clock 60 s behind, alive", -60, None, 200, False),
    ("clock 60 s ahead, alive", 60, None, 200, False),
    ("clock 60 s behind, renewal stops, within timeout", -60, 100, 100 + TIMEOUT - 1, False),
    ("clock 60 s behind, renewal stops, past timeout", -60, 100, 100 + TIMEOUT, True),
    ("clock 60 s ahead, renewal stops, within timeout", 60, 100, 100 + TIMEOUT - 1, False),
    ("clock 60 s ahead, renewal stops, past timeout", 60, 100, 100 + TIMEOUT, True),
    ("clock in step, renewal stops, past timeout", 0, 100, 100 + TIMEOUT, True),
]


@pytest.mark.parametrize(("skew", "until", "check", "lost"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_skewed_clock(skew: float, until: float | None, check: float, lost: bool) -> None:
    probes, last = LeaseProbes(), ""
    for at in range(0, int(check) + 1):  # the operator's watch delivers each renewal as it happens
        if at % RENEW_EVERY == 0 and (until is None or at <= until):
            last = _renew_time(at, skew)
        probes.observe("n", last, T0 + timedelta(seconds=at))  # every second: a renewal or an unchanged re-list
    assert _lost_at(probes, check) is lost


@pytest.mark.parametrize(("elapsed", "lost"), [(0, False), (TIMEOUT - 1, False), (TIMEOUT, True)])
def test_operator_restart_gives_every_node_a_full_timeout(elapsed: float, lost: bool) -> None:
    """A node dead for an hour before the operator started: its first sighting counts as a renewal."""
    probes = LeaseProbes()
    start = 3600.0
    assert probes.observe("n", _renew_time(0, 0), T0 + timedelta(seconds=start))
    assert _lost_at(probes, start + elapsed) is lost


def test_a_clock_stepping_back_still_counts_as_renewal() -> None:
    probes = LeaseProbes()
    probes.observe("n", _renew_time(0, 0), T0)
    assert probes.observe("n", _renew_time(10, -120), T0 + timedelta(seconds=10))
    assert probes.renewed("n") == T0 + timedelta(seconds=10)


def test_an_unchanged_lease_is_not_a_renewal_and_a_deleted_one_starts_afresh() -> None:
    probes = LeaseProbes()
    probes.observe("n", "x", T0)
    assert not probes.observe("n", "x", T0 + timedelta(seconds=30))
    assert probes.renewed("n") == T0
    probes.forget("n")
    assert probes.renewed("n") is None
    assert probes.observe("n", "x", T0 + timedelta(seconds=40))


@pytest.mark.parametrize(("elapsed", "lost"), [(TIMEOUT - 1, False), (TIMEOUT, True)])
def test_after_the_operator_was_blind_every_node_gets_a_full_timeout(elapsed: float, lost: bool) -> None:
    """An API-server outage: no renewal could be seen for 30 s; that is not evidence against the node."""
    probes = LeaseProbes()
    probes.observe("n", _renew_time(0, 0), T0)
    probes.regrace(T0 + timedelta(seconds=30))
    assert _lost_at(probes, 30 + elapsed) is lost
