"""Leader election (resilient_operator.leader): the pure rule as a table, then two electors sharing one Lease
through an in-memory API with the API server's resourceVersion semantics and a clock the test moves."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from resilient_operator.leader import Action, Elector, NotLeader, Record, Timings, decide

T = Timings(lease_duration=15, renew_deadline=10, retry_period=2)
ME, OTHER = "op-a", "op-b"


def rec(holder: str, duration: float | None = 15, rv: str = "7") -> Record:
    return Record(holder=holder, lease_duration=duration, resource_version=rv)


# (record, observed_at, now, last_renew) -> action, for identity ME
TABLE = [
    ("no Lease: create it", None, None, 100, None, Action.CREATE),
    ("released (holder empty): acquire at once", rec(""), 99, 100, None, Action.ACQUIRE),
    ("another holds it, seen changing 1 s ago: wait", rec(OTHER), 99, 100, None, Action.WAIT),
    ("another's, unchanged for 14.9 s by our clock: wait", rec(OTHER), 85.1, 100, None, Action.WAIT),
    ("another's, unchanged for its full duration by our clock: acquire", rec(OTHER), 85, 100, None, Action.ACQUIRE),
    ("the record's own duration counts, not ours", rec(OTHER, duration=30), 80, 100, None, Action.WAIT),
    ("a record without a duration: ours", rec(OTHER, duration=None), 85, 100, None, Action.ACQUIRE),
    ("ours, and we lead: renew", rec(ME), 98, 100, 98, Action.RENEW),
    ("ours, renewed 9.9 s ago: still renew", rec(ME), 90.1, 100, 90.1, Action.RENEW),
    ("ours, but no successful renewal for the renew deadline: step down", rec(ME), 90, 100, 90, Action.STEP_DOWN),
    ("a frozen leader thaws 20 s later: step down, even though the Lease still names it", rec(ME), 80, 100, 80,
     Action.STEP_DOWN),
    ("we lead but the Lease names another: step down", rec(OTHER), 99, 100, 98, Action.STEP_DOWN),
    ("we lead but the Lease was deleted: step down", None, None, 100, 98, Action.STEP_DOWN),
    ("ours from a previous process of this pod (container restart): take it back at once", rec(ME), 99, 100, None,
     Action.ACQUIRE),
    ("never observed (first read just now) another's: wait a full duration", rec(OTHER), 100, 100, None,
     Action.WAIT),
]


@pytest.mark.parametrize(("case", "record", "observed_at", "now", "last_renew", "want"), TABLE,
                         ids=[row[0] for row in TABLE])  # fmt: skip
def test_decide(case: str, record: Record | None, observed_at: float | None, now: float, last_renew: float | None,
                want: Action) -> None:
    assert decide(record, observed_at, now, ME, last_renew, T) is want, case


def test_timings_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        Timings(lease_duration=10, renew_deadline=10, retry_period=2)


class FakeLeases:
    """One Lease with the API server's rules: create fails if it exists, replace fails unless the body carries
    the current resourceVersion; every write bumps it. `down` makes every call fail (an outage)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.rv = 0
        self.writes: list[str] = []
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("API server unreachable")

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.rv)
        self.writes.append(body["spec"]["holderIdentity"])
        return copy.deepcopy(self.lease)

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check()
        return copy.deepcopy(self.lease)

    def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        self._check()
        return None if self.lease is not None else self._store(body)

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any] | None:
        self._check()
        if self.lease is None or body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            return None
        return self._store(body)

    @property
    def holder(self) -> str:
        return (self.lease or {}).get("spec", {}).get("holderIdentity", "")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def pair() -> tuple[FakeLeases, Clock, Elector, Elector, list[str]]:
    api, clock, lost = FakeLeases(), Clock(), []
    a = Elector(api, "ns", "lease", ME, T, on_lose=lambda: lost.append(ME), clock=clock)
    b = Elector(api, "ns", "lease", OTHER, T, on_lose=lambda: lost.append(OTHER), clock=clock)
    return api, clock, a, b, lost


def run(clock: Clock, electors: list[Elector], seconds: float, frozen: tuple[Elector, ...] = ()) -> None:
    """Advance time by retry periods, each live elector taking its turn."""
    end = clock.t + seconds
    while clock.t < end:
        clock.t += T.retry_period
        for e in electors:
            if e not in frozen and not e._stop.is_set():
                e.step()


def test_one_leader_and_a_standby_that_waits() -> None:
    api, clock, a, b, lost = pair()
    assert a.step() is Action.CREATE and a.holding() and api.holder == ME and api.lease is not None
    assert api.lease["spec"]["leaseDurationSeconds"] == 15 and "acquireTime" in api.lease["spec"]
    assert b.step() is Action.WAIT and not b.holding()
    run(clock, [a, b], 60)
    assert api.holder == ME and a.holding() and not b.holding() and not lost
    with pytest.raises(NotLeader):
        b.ensure()
    a.ensure()


def test_a_dead_leader_is_replaced_after_the_lease_duration_by_the_standbys_clock() -> None:
    api, clock, a, b, _lost = pair()
    a.step()
    b.step()
    run(clock, [a, b], 10)
    start = clock.t  # a dies now: its last renewal was at most one period ago
    while not b.holding():
        run(clock, [b], T.retry_period)
        assert clock.t - start <= T.lease_duration + 2 * T.retry_period
    assert clock.t - start >= T.lease_duration - T.retry_period
    assert api.holder == OTHER and api.lease is not None and api.lease["spec"]["leaseTransitions"] == 1


def test_a_frozen_leader_thaws_steps_down_and_writes_nothing() -> None:
    api, clock, a, b, lost = pair()
    a.step()
    b.step()
    run(clock, [a, b], 6)
    run(clock, [a, b], 30, frozen=(a,))  # a is SIGSTOPped; b takes over meanwhile
    assert api.holder == OTHER
    writes = len(api.writes)
    with pytest.raises(NotLeader):  # a thawed worker thread, about to write
        a.ensure()
    assert a.step() is Action.STEP_DOWN and lost == [ME]  # before any call: too late to renew
    assert len(api.writes) == writes and api.holder == OTHER


def test_a_leader_frozen_while_nobody_took_over_still_steps_down() -> None:
    api, clock, a, _b, lost = pair()
    a.step()
    clock.t += 12  # past the renew deadline; the Lease (15 s) is not even expired
    assert a.step() is Action.STEP_DOWN and lost == [ME] and api.writes == [ME]


def test_a_leader_that_cannot_reach_the_api_stops_writing_within_the_renew_deadline() -> None:
    api, clock, a, _b, lost = pair()
    a.step()
    api.down = True
    for _ in range(4):
        clock.t += T.retry_period
        with pytest.raises(ConnectionError):
            a.step()
        a.ensure()  # 8 s: still within the deadline
    clock.t += T.retry_period
    with pytest.raises(NotLeader):
        a.ensure()
    assert a.step() is Action.STEP_DOWN and lost == [ME]


def test_renewal_is_guarded_by_resource_version_so_a_lost_race_makes_the_leader_step_down() -> None:
    api, clock, a, b, lost = pair()
    a.step()
    b.step()
    # someone (an admin, or a standby that judged the Lease expired) wrote it between a's read and a's update
    assert api.lease is not None
    stale = copy.deepcopy(api.lease)
    api.lease["spec"]["holderIdentity"] = OTHER
    api.rv += 1
    api.lease["metadata"]["resourceVersion"] = str(api.rv)
    assert a.api.replace_lease("ns", "lease", stale) is None  # the old resourceVersion is refused
    clock.t += T.retry_period
    assert a.step() is Action.STEP_DOWN and lost == [ME]


def test_release_lets_the_standby_take_over_within_a_retry_period() -> None:
    api, clock, a, b, lost = pair()
    a.step()
    b.step()
    a.stop(release=True)
    assert api.holder == "" and not a.holding()
    clock.t += T.retry_period
    assert b.step() is Action.ACQUIRE and b.holding() and api.holder == OTHER and not lost


def test_a_restarted_container_takes_its_own_lease_back_at_once() -> None:
    api, clock, a, b, lost = pair()
    a.step()
    b.step()
    again = Elector(api, "ns", "lease", ME, T, on_lose=lambda: lost.append("again"), clock=clock)
    clock.t += 1
    assert again.step() is Action.ACQUIRE and again.holding() and api.holder == ME
    assert api.lease is not None and api.lease["spec"]["leaseTransitions"] == 0  # same holder: no transition
    run(clock, [again, b], 30)
    assert api.holder == ME and not lost


def test_a_standby_wakes_when_the_lease_expires_not_a_retry_period_later() -> None:
    api, clock, a, b, _lost = pair()
    a.step()
    assert b.step() is Action.WAIT and b.next_wait() == T.retry_period  # 15 s to go
    clock.t += 14.5  # a died right after its write; b last saw the Lease change 14.5 s ago
    assert b.next_wait() == pytest.approx(0.51)
    clock.t += 0.51
    assert b.step() is Action.ACQUIRE and api.holder == OTHER
    assert b.next_wait() == T.retry_period  # leading: renew every retry period
