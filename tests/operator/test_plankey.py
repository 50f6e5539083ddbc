"""plankey.load: start-up rides out a restarting API server but not a refusal. (The Secret's life on a real API
server, the race between replicas and the chart's Role: e2e/tests/test_plan_delivery.py.)"""

from __future__ import annotations

import base64
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from resilient_contract import plan
from resilient_operator import plankey

PRIVATE = plan.new_private_key()


class Flaky:
    """read_namespaced_secret fails with each of `errors` in turn, then returns the Secret."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.reads = list(errors), 0

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> client.V1Secret:
        self.reads += 1
        if self.errors:
            raise self.errors.pop(0)
        return client.V1Secret(data={plankey.DATA_KEY: base64.b64encode(PRIVATE).decode()})


def test_transient_errors_are_tried_again_with_backoff() -> None:
    pauses: list[float] = []
    core = Flaky(ApiException(status=503), urllib3.exceptions.ProtocolError("reset"),
                 ConnectionRefusedError(), ApiException(status=429))
    key = plankey.load(core, "ops", "k", sleep=pauses.append)
    assert key.private == PRIVATE and key.public == plan.public_key(PRIVATE)
    assert pauses == [0.5, 1.0, 2.0, 4.0] and core.reads == 5


@pytest.mark.parametrize("error", [ApiException(status=403), ApiException(status=401), ValueError("bug")])
def test_a_refusal_is_not_tried_again(error: Exception) -> None:
    core, pauses = Flaky(error), list[float]()
    with pytest.raises(type(error)):
        plankey.load(core, "ops", "k", sleep=pauses.append)
    assert pauses == [] and core.reads == 1


def test_an_api_server_down_past_the_deadline_stops_the_wait() -> None:
    core = Flaky(*[ApiException(status=503)] * 100)
    with pytest.raises(ApiException):
        plankey.load(core, "ops", "k", deadline_seconds=0.0, sleep=lambda _: None)
    assert core.reads == 1


def test_a_malformed_key_is_refused_at_once() -> None:
    class Short(Flaky):
        def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> client.V1Secret:
            self.reads += 1
            return client.V1Secret(data={plankey.DATA_KEY: "not base64!"})

    core = Short()
    with pytest.raises(plankey.PlanKeyError):
        plankey.load(core, "ops", "k", sleep=lambda _: None)
    assert core.reads == 1
