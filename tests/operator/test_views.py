"""views (the shell's parser): spec shapes that pass the CRD but the core cannot use."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from resilient_operator import constants as c
from resilient_operator import views
from tests.operator.builders import job, pod


def container(**fields: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "t", **fields}]}}


@pytest.mark.parametrize(
    ("template", "field"),
    [
        (container(env=["A=1"]), "containers[0].env[0]"),
        ({"metadata": {"labels": "team=a"}, **container()}, "metadata.labels"),
        ({"spec": {"containers": [{"name": "t"}], "nodeSelector": ["gpu"]}}, "spec.nodeSelector"),
        (container(resources={"limits": ["cpu"]}), "resources.limits"),
        (container(resources={"requests": {"cpu": "1.2.3"}}), "resources.cpu"),
        ({"spec": {"containers": []}}, "containers"),
        ({"spec": {"containers": [{"name": "t"}], "tolerations": {"key": "a"}}}, "spec.tolerations"),
        (container(env=[{"name": "PET_NNODES", "value": "9"}]), "PET_NNODES"),
        (container(env=[{"name": "X", "value": "y" * 200_000}]), "bound"),  # x 500 replicas > 64 MiB
    ],
)
def test_unusable_templates_are_refused_naming_the_field(template: dict[str, Any], field: str) -> None:
    j = job(template=template, replicas=500, elasticPolicy={"minReplicas": 1})
    assert j.problem and field in j.problem, j.problem


def test_labels_and_annotations_are_parsed_defensively() -> None:
    impostor = pod(1, 0, labels={c.LABEL_ATTEMPT: "x", c.LABEL_RANK: "0"}, owner_uid=None)
    assert impostor.attempt == 0 and impostor.owner_uid is None
    assert pod(1, 0).owner_uid == "uid-1" and pod(1, 0).launch_replicas == 4
    view = views.node_view({"metadata": {"name": "a"}, "status": {"allocatable": {"cpu": "lots"}}}, None)
    assert view.allocatable["cpu"] == Decimal(0)


@pytest.mark.parametrize(("template", "seconds"), [
    ({"spec": {"terminationGracePeriodSeconds": 5}}, 5.0),
    ({"spec": {}}, 30.0),  # Kubernetes' default
    ({}, 30.0),
    ({"spec": {"terminationGracePeriodSeconds": "soon"}}, 30.0),  # the API server refuses it at pod creation
    ({"spec": {"terminationGracePeriodSeconds": True}}, 30.0),
    ({"spec": {"terminationGracePeriodSeconds": -1}}, 30.0),
    ({"spec": {"terminationGracePeriodSeconds": 10**9}}, views.MAX_GRACE_SECONDS),  # an in-place drain's wait
    ({"spec": "not a mapping"}, 30.0),
])  # fmt: skip
def test_the_grace_period_only_bounds_a_wait_so_a_bad_one_counts_as_unset(template: dict, seconds: float) -> None:  # type: ignore[type-arg]
    assert views.grace_seconds(template) == seconds
