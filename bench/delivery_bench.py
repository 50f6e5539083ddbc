"""Plan delivery throughput: how long until every kept pod's agent acknowledged, by delivery pool size.

An agent answers `POST /plan` only once its old workers are gone (1-2 s), so each delivery holds one of the
operator's delivery threads that long (delivery.py): the pool size (planDelivery.workers,
RTJ_DELIVERY_WORKERS) bounds how many kept pods restart per second. Here local agents (threads of this
process) verify each signed plan and hold it `--hold` seconds; the operator's Deliverer sends N plans at once
(one recovery keeping N pods) with pools of several sizes, interleaved over the repetitions. Printed: the
median time to the last acknowledgement and to the median one, and the ratio against the smallest pool.

    python bench/delivery_bench.py [--hold 1.5] [--repeats 3] [--pods 8,64,256] [--workers 8,64,256]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_contract import plan
from resilient_operator.core.plan import Delivery
from resilient_operator.delivery import ACKNOWLEDGED, Deliverer, Outcome

KEY = plan.new_private_key()
PUBLIC = plan.public_key(KEY)


class Agents(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 2048

    def __init__(self, hold: float) -> None:
        self.hold = hold
        super().__init__(("127.0.0.1", 0), _Agent)


class _Agent(http.server.BaseHTTPRequestHandler):
    server: Agents

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        raw = json.loads(body)["plan"]
        got = plan.verify(body, PUBLIC, raw["job_uid"], raw["pod_uid"])  # what every agent checks
        time.sleep(self.server.hold)  # the agent stopping its old workers, then starting the new ones
        data = json.dumps({"attempt": got.attempt, "state": plan.STARTED}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Relabels:
    """The pod relabel after a 200 (an API call in the operator; instant here: this measures the agents)."""

    def write_guard(self) -> None:
        pass

    def patch_pod_metadata(self, namespace: str, name: str, uid: str, labels: Mapping[str, str],
                           annotations: Mapping[str, str]) -> bool:
        return True


def one_recovery(port: int, pods: int, workers: int) -> tuple[float, float]:
    """(seconds to the last acknowledgement, median seconds to an acknowledgement)."""
    done: list[Outcome] = []
    cond = threading.Condition()

    def note(outcome: Outcome) -> None:
        with cond:
            done.append(outcome)
            cond.notify_all()

    deliverer = Deliverer(Relabels(), KEY, workers=workers, timeout=60, on_outcome=note)
    deliveries = [Delivery(pod=f"job-{i}", address="127.0.0.1", port=port, labels={}, annotations={},
                           plan=plan.Plan("job-uid", f"pod-uid-{i}", 2, pods, i, "job-0.job", 29500, ""))
                  for i in range(pods)]
    started = time.monotonic()
    deliverer.submit("bench", deliveries)
    with cond:
        assert cond.wait_for(lambda: len(done) == pods, 600)
    last = time.monotonic() - started
    deliverer.close()
    assert all(o.result == ACKNOWLEDGED for o in done), {o.result for o in done}
    return last, statistics.median(o.seconds for o in done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hold", type=float, default=1.5, help="seconds an agent takes to answer")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pods", default="8,64,256", help="kept pods per recovery")
    parser.add_argument("--workers", default="8,64,256", help="delivery pool sizes")
    args = parser.parse_args()
    agents = Agents(args.hold)
    threading.Thread(target=agents.serve_forever, args=(0.05,), daemon=True).start()
    port = int(agents.server_address[1])
    pods, pools = [int(p) for p in args.pods.split(",")], [int(w) for w in args.workers.split(",")]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; agent hold {args.hold} s, "
          f"{args.repeats} repetitions, pool sizes interleaved")
    results: dict[tuple[int, int], list[tuple[float, float]]] = {(n, w): [] for n in pods for w in pools}
    for _ in range(args.repeats):
        for n in pods:
            for w in pools:
                results[(n, w)].append(one_recovery(port, n, w))
    versus = f"vs pool {pools[0]}"
    print(f"{'kept pods':>9} {'pool':>5} {'last ack (median s)':>20} {'median ack (s)':>15} {versus:>12}")
    for n in pods:
        base = statistics.median(r[0] for r in results[(n, pools[0])])
        for w in pools:
            last = statistics.median(r[0] for r in results[(n, w)])
            med = statistics.median(r[1] for r in results[(n, w)])
            print(f"{n:>9} {w:>5} {last:>20.2f} {med:>15.2f} {base / last:>11.1f}x")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    agents.shutdown()


if __name__ == "__main__":
    main()
