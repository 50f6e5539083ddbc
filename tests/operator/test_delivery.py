"""delivery.Deliverer against real HTTP servers in threads: an agent that verifies the signature with
resilient_contract.plan.verify, one that never answers, one that drips its answer, a closed port. The one API
write (the pod relabel) goes to a recording writer here; e2e/tests/test_plan_delivery.py sends it to a real
API server."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from resilient_contract import plan
from resilient_operator import delivery
from resilient_operator.core.plan import Delivery
from resilient_operator.delivery import Deliverer, Outcome
from resilient_operator.leader import NotLeader

pytestmark = pytest.mark.timeout(60)
JOB_UID, POD_UID = "job-uid-1", "pod-uid-1"
KEY = plan.new_private_key()
LABELS = {"training.resilient.dev/attempt": "3", "training.resilient.dev/rank": "1"}


def a_plan(attempt: int = 3, pod_uid: str = POD_UID) -> plan.Plan:
    return plan.Plan(job_uid=JOB_UID, pod_uid=pod_uid, attempt=attempt, nnodes=3, node_rank=1,
                     master_addr="job-0.job", master_port=29500, resume_from="/ckpt/step-40")


def a_delivery(port: int, pod: str = "job-a3-r1", address: str = "127.0.0.1", **kw: Any) -> Delivery:
    return Delivery(pod=pod, address=address, port=port, plan=a_plan(**kw), labels=LABELS,
                    annotations={"training.resilient.dev/in-place": "3"})


@dataclass
class Writer:
    """The pod relabel, recorded; `leading` False makes the leader check fail as leader.Elector.ensure does."""

    leading: bool = True
    patches: list[tuple[str, str, str, dict[str, str], dict[str, str]]] = field(default_factory=list)

    def write_guard(self) -> None:
        if not self.leading:
            raise NotLeader("the Lease is another replica's")

    def patch_pod_metadata(self, namespace: str, name: str, uid: str, labels: Mapping[str, str],
                           annotations: Mapping[str, str]) -> bool:
        self.write_guard()
        self.patches.append((namespace, name, uid, dict(labels), dict(annotations)))
        return True


class Agent(http.server.ThreadingHTTPServer):
    """The agent's side of the contract: verify, then 200 {"attempt", "state"} / 403 / 400 / 409."""

    daemon_threads = True

    def __init__(self, public: str, hold: threading.Event | None = None, pod_uid: str = POD_UID) -> None:
        self.public, self.hold, self.pod_uid, self.bodies = public, hold, pod_uid, list[bytes]()
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Agent

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.bodies.append(body)
        if self.server.hold is not None:
            self.server.hold.wait(30)
        try:
            got = plan.verify(body, self.server.public, JOB_UID, self.server.pod_uid)
            status, answer = 200, {"attempt": got.attempt, "state": plan.STARTED}
        except plan.NotForUs as exc:
            status, answer = 403, {"error": str(exc)}
        except plan.PlanError as exc:
            status, answer = 400, {"error": str(exc)}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def agent() -> Iterator[Agent]:
    server = Agent(plan.public_key(KEY))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


class Silent:
    """Accepts connections (the kernel's backlog does) and answers nothing; `drip` sends one byte of a status
    line every 0.2 s instead, forever."""

    def __init__(self, drip: bool = False) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        if drip:
            threading.Thread(target=self._drip, daemon=True).start()

    def _drip(self) -> None:
        self.sock.settimeout(0.2)
        conns = []
        while not self.stop.is_set():
            try:
                conns.append(self.sock.accept()[0])
            except TimeoutError:
                pass
            except OSError:  # closed
                break
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.sendall(b"H")
        for conn in conns:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


class Outcomes:
    def __init__(self) -> None:
        self.seen: list[Outcome] = []
        self.cond = threading.Condition()

    def __call__(self, outcome: Outcome) -> None:
        with self.cond:
            self.seen.append(outcome)
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = 15) -> list[Outcome]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.seen) >= n, timeout), self.seen
            return list(self.seen)

    def of(self, pod: str) -> Outcome:
        return next(o for o in self.seen if o.pod == pod)


@contextlib.contextmanager
def deliverer(writer: Writer, outcomes: Outcomes, **kw: Any) -> Iterator[Deliverer]:
    d = Deliverer(writer, KEY, on_outcome=outcomes, **kw)
    try:
        yield d
    finally:
        d.close()


def counted(result: str) -> float:
    return delivery.DELIVERIES.labels(result=result)._value.get()


def test_an_acknowledged_plan_relabels_the_pod(agent: Agent) -> None:
    writer, outcomes = Writer(), Outcomes()
    before, timed = counted(delivery.ACKNOWLEDGED), delivery.ACKNOWLEDGED_SECONDS._sum.get()
    with deliverer(writer, outcomes) as d:
        assert d.submit("ml", [a_delivery(agent.port)]) == 1
        (outcome,) = outcomes.wait(1)
    assert outcome.result == delivery.ACKNOWLEDGED and outcome.attempt == 3
    assert plan.verify(agent.bodies[0], plan.public_key(KEY), JOB_UID, POD_UID) == a_plan()
    assert writer.patches == [("ml", "job-a3-r1", POD_UID, LABELS, {"training.resilient.dev/in-place": "3"})]
    assert counted(delivery.ACKNOWLEDGED) == before + 1
    assert delivery.ACKNOWLEDGED_SECONDS._sum.get() > timed  # the benches' hook: submit -> 200


def test_a_plan_the_agent_refuses_relabels_nothing(agent: Agent) -> None:
    """Signed with another key (e.g. the pod started before a key rotation): 403, no patch, no exception."""
    writer, outcomes = Writer(), Outcomes()
    before = counted(delivery.REFUSED)
    d = Deliverer(writer, plan.new_private_key(), on_outcome=outcomes)
    try:
        d.submit("ml", [a_delivery(agent.port)])
        (outcome,) = outcomes.wait(1)
    finally:
        d.close()
    assert outcome.result == delivery.REFUSED and writer.patches == []
    assert counted(delivery.REFUSED) == before + 1
    assert d.failed("ml", 3) == {POD_UID: delivery.REFUSED}  # the core replaces that pod without waiting


def test_another_pods_plan_is_refused(agent: Agent) -> None:
    writer, outcomes = Writer(), Outcomes()
    with deliverer(writer, outcomes) as d:
        d.submit("ml", [a_delivery(agent.port, pod_uid="someone-else")])
        assert outcomes.wait(1)[0].result == delivery.REFUSED
    assert writer.patches == []


def test_an_agent_that_never_answers_costs_one_thread_for_the_timeout_only(agent: Agent) -> None:
    """submit returns at once; the silent agent's delivery ends at the timeout; the others go out meanwhile."""
    silent, dripping = Silent(), Silent(drip=True)
    writer, outcomes = Writer(), Outcomes()
    try:
        with deliverer(writer, outcomes, workers=3, timeout=1.0) as d:
            started = time.monotonic()
            d.submit("ml", [a_delivery(silent.port, pod="silent"), a_delivery(dripping.port, pod="dripping"),
                            a_delivery(agent.port, pod="good")])
            assert time.monotonic() - started < 0.2  # a reconcile never waits on a socket
            outcomes.wait(3)
            assert d.failed("ml", 3) == {}  # a timeout is left to the core's clock: the agent may be busy
    finally:
        silent.close()
        dripping.close()
    assert outcomes.seen[0].pod == "good" and outcomes.of("good").result == delivery.ACKNOWLEDGED
    for pod in ("silent", "dripping"):  # the drip resets each read's timeout; the watchdog's deadline holds
        outcome = outcomes.of(pod)
        assert outcome.result == delivery.TIMEOUT, outcome
        assert 0.9 <= outcome.seconds < 1.6, outcome
    assert [p[1] for p in writer.patches] == ["good"]


def test_a_closed_port_is_unreachable_at_once() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed when the block ends: nothing listens there
    writer, outcomes = Writer(), Outcomes()
    with deliverer(writer, outcomes) as d:
        d.submit("ml", [a_delivery(port)])
        (outcome,) = outcomes.wait(1)
        # nothing listens: the core learns it on its next pass (only for this namespace and attempt)
        assert d.failed("ml", 3) == {POD_UID: delivery.UNREACHABLE}
        assert d.failed("ml", 4) == {} and d.failed("other", 3) == {}
    assert outcome.result == delivery.UNREACHABLE and outcome.seconds < 1


def test_a_host_name_is_never_resolved() -> None:
    writer, outcomes = Writer(), Outcomes()
    with deliverer(writer, outcomes) as d:
        d.submit("ml", [a_delivery(1, address="agent.example.invalid")])
        assert outcomes.wait(1)[0].result == delivery.BAD_ADDRESS


def test_a_standby_sends_nothing(agent: Agent) -> None:
    writer, outcomes = Writer(leading=False), Outcomes()
    with deliverer(writer, outcomes) as d:
        d.submit("ml", [a_delivery(agent.port)])
        assert outcomes.wait(1)[0].result == delivery.NOT_LEADER
    assert agent.bodies == [] and writer.patches == []


def test_a_200_that_does_not_say_the_attempt_started_relabels_nothing() -> None:
    """A hostile agent's answer is checked: a 200 for another attempt is not an acknowledgement."""

    class Liar(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            data = b'{"attempt": 99, "state": "started"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Liar)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    writer, outcomes = Writer(), Outcomes()
    try:
        with deliverer(writer, outcomes) as d:
            d.submit("ml", [a_delivery(int(server.server_address[1]))])
            assert outcomes.wait(1)[0].result == delivery.BAD_ANSWER
    finally:
        server.shutdown()
        server.server_close()
    assert writer.patches == []


def answering(raw: bytes) -> http.server.ThreadingHTTPServer:
    """An agent that answers every POST with these bytes, then closes."""

    class Fixed(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            with contextlib.suppress(OSError):
                self.wfile.write(raw)
            self.close_connection = True

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fixed)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


@pytest.mark.parametrize(("headers", "result"), [(0, delivery.ACKNOWLEDGED), (90, delivery.BAD_ANSWER)])
def test_an_answer_over_16_kib_is_not_read(headers: int, result: str) -> None:
    """90 headers of 600 bytes are legal HTTP (http.client takes 100 of 64 KiB each), but no agent's answer:
    the operator reads 16 KiB of it at most, per delivery in flight."""
    body = b'{"attempt": 3, "state": "started"}'
    raw = (b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 600) for i in range(headers))
           + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    server = answering(raw)
    writer, outcomes = Writer(), Outcomes()
    try:
        with deliverer(writer, outcomes) as d:
            d.submit("ml", [a_delivery(int(server.server_address[1]))])
            assert outcomes.wait(1)[0].result == result
    finally:
        server.shutdown()
        server.server_close()


def test_submit_after_close_sends_nothing(agent: Agent) -> None:
    d = Deliverer(Writer(), KEY)
    d.close()
    assert d.submit("ml", [a_delivery(agent.port)]) == 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_in_flight_per_pod_and_attempt_and_a_failed_one_resent_at_most_once_a_second() -> None:
    hold = threading.Event()
    server = Agent(plan.public_key(plan.new_private_key()), hold=hold)  # refuses: the key is not ours
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    writer, outcomes, clock = Writer(), Outcomes(), Clock()
    try:
        with deliverer(writer, outcomes, clock=clock) as d:
            one = a_delivery(server.port)
            assert d.submit("ml", [one]) == 1
            assert d.submit("ml", [one, one]) == 0  # in flight: not sent twice
            assert d.submit("ml", [a_delivery(server.port, attempt=4)]) == 1  # another attempt is another plan
            assert d.submit("other-ns", [one]) == 1  # and another namespace's pod another pod
            hold.set()
            outcomes.wait(3)
            assert {o.result for o in outcomes.seen} == {delivery.REFUSED}
            clock.now += 0.5
            assert d.submit("ml", [one]) == 0  # failed half a second ago: not yet
            clock.now += 0.6
            assert d.submit("ml", [one]) == 1  # a second later: when the core asks again
            outcomes.wait(4)
    finally:
        server.shutdown()
        server.server_close()
    assert len(server.bodies) == 4


def test_an_acknowledged_plan_is_not_sent_again(agent: Agent) -> None:
    writer, outcomes, clock = Writer(), Outcomes(), Clock()
    with deliverer(writer, outcomes, clock=clock) as d:
        d.submit("ml", [a_delivery(agent.port)])
        outcomes.wait(1)
        clock.now += 5  # the core asks again before its cache shows the new labels
        assert d.submit("ml", [a_delivery(agent.port)]) == 0
    assert len(agent.bodies) == 1 and len(writer.patches) == 1


def test_a_writer_that_fails_after_the_200_is_counted_not_raised(agent: Agent) -> None:
    class Broken(Writer):
        def patch_pod_metadata(self, *args: Any, **kw: Any) -> bool:
            raise RuntimeError("API server unavailable")

    outcomes = Outcomes()
    with deliverer(Broken(), outcomes) as d:
        d.submit("ml", [a_delivery(agent.port)])
        assert outcomes.wait(1)[0].result == delivery.PATCH_FAILED
