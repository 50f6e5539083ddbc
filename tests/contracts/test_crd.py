"""The CRD: structure, printer columns, defaults, and CEL rules evaluated offline with cel-python.

The same rules run in a real API server in the cluster tests (e2e/); here each invalid spec must be
rejected by exactly the rule whose message names the offending field.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from resilient_contract.storage.s3 import parse_uri
from resilient_operator import constants as c
from tests.operator.builders import apply_defaults, crd, job_object, schema

RULE_KEY = "x-kubernetes-validations"


def violations(obj: Any, node: dict[str, Any]) -> list[str]:
    """Messages of every CEL rule that fails, walking the schema like the API server does."""
    found: list[str] = []
    env = celpy.Environment()
    for rule in node.get(RULE_KEY, []):
        program = env.program(env.compile(rule["rule"]))
        if not bool(program.evaluate({"self": celpy.json_to_cel(obj)})):
            found.append(rule["message"])
    if isinstance(obj, dict):
        for key, sub in (node.get("properties") or {}).items():
            if key in obj:
                found += violations(obj[key], sub)
    return found


def valid_job(**spec: Any) -> dict[str, Any]:
    obj = job_object(**spec)
    obj.pop("status")
    return obj


def test_identity_and_printer_columns() -> None:
    doc = crd()
    assert doc["spec"]["group"] == c.GROUP
    assert doc["spec"]["names"]["kind"] == c.KIND and doc["spec"]["names"]["plural"] == c.PLURAL
    assert "rtj" in doc["spec"]["names"]["shortNames"]
    version = doc["spec"]["versions"][0]
    assert version["name"] == c.VERSION and version["subresources"] == {"status": {}}
    columns = {col["name"]: col["jsonPath"] for col in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Workers"] == ".status.workers"
    assert columns["Restarts"] == ".status.restartCount"
    assert columns["Checkpoint"] == ".status.latestCheckpoint.step"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_phase_enum_matches_constants() -> None:
    enum = set(schema()["properties"]["status"]["properties"]["phase"]["enum"])
    phases = {c.PENDING, c.STARTING, c.RUNNING, c.RESTARTING, c.WAITING_FOR_CAPACITY, c.BACKING_OFF,
              c.SUSPENDED, c.QUEUED, c.SUCCEEDED, c.FAILED}  # fmt: skip
    assert enum == phases


def declared(node: dict[str, Any]) -> set[str]:
    return set((node.get("properties") or {}).keys())


def status_paths(value: Any, node: dict[str, Any], prefix: str = "status") -> list[str]:
    """Every field in `value` that the schema does not declare (kopf would silently drop it)."""
    missing: list[str] = []
    open_ended = node.get("x-kubernetes-preserve-unknown-fields")
    if isinstance(value, dict) and node.get("type") == "object" and not open_ended:
        for key, sub in value.items():
            if key in declared(node):
                missing += status_paths(sub, node["properties"][key], f"{prefix}.{key}")
            elif isinstance(node.get("additionalProperties"), dict):  # a map, e.g. status.kueue.flavors
                missing += status_paths(sub, node["additionalProperties"], f"{prefix}.{key}")
            else:
                missing.append(f"{prefix}.{key}")
    elif isinstance(value, list) and "items" in node:
        for item in value:
            missing += status_paths(item, node["items"], prefix + "[]")
    return missing


def test_every_status_field_the_core_writes_is_declared() -> None:
    """Drive the core through its table and check every status it produced against the schema."""
    from resilient_operator.core import reconcile
    from tests.operator.builders import NOW
    from tests.operator.test_reconcile_table import ROWS

    status_schema = schema()["properties"]["status"]
    for row in ROWS:
        plan = reconcile(row.job, row.pods, row.nodes, row.listing, NOW)
        assert status_paths(plan.status, status_schema) == [], row.name


def test_defaults_fill_a_minimal_job() -> None:
    obj = apply_defaults(
        {"spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "t"}]}},
                  "checkpoint": {"root": "/ckpt"}}},
        schema(),
    )  # fmt: skip
    spec = obj["spec"]
    assert spec["nprocPerNode"] == 1 and spec["suspend"] is False
    assert spec["elasticPolicy"] == {"minReplicas": 1, "replicasMultipleOf": 1, "growBack": True}
    assert spec["failurePolicy"]["maxInfrastructureRestarts"] == 10
    assert spec["checkpoint"]["keep"] == 3


def test_valid_job_passes_every_rule() -> None:
    assert violations(valid_job(), schema()) == []


INVALID = [
    ("min above desired", dict(replicas=2, elasticPolicy={"minReplicas": 3}), "spec.replicas must be >="),
    ("desired above max", dict(replicas=5, elasticPolicy={"minReplicas": 1, "maxReplicas": 4}),
     "spec.replicas must be <="),
    ("min above max", dict(replicas=2, elasticPolicy={"minReplicas": 3, "maxReplicas": 2}),
     "minReplicas must be <= spec.elasticPolicy.maxReplicas"),
    ("desired not a multiple", dict(replicas=6, elasticPolicy={"minReplicas": 4, "replicasMultipleOf": 4}),
     "spec.replicas must be a multiple"),
    ("min not a multiple", dict(replicas=8, elasticPolicy={"minReplicas": 2, "replicasMultipleOf": 4}),
     "spec.elasticPolicy.minReplicas must be a multiple"),
    ("max not a multiple", dict(replicas=8, elasticPolicy={"minReplicas": 4, "maxReplicas": 10,
                                                          "replicasMultipleOf": 4}),
     "spec.elasticPolicy.maxReplicas must be a multiple"),
    ("relative checkpoint root", dict(checkpoint={"root": "ckpt/here"}), "spec.checkpoint.root must be an absolute"),
    ("unsupported scheme", dict(checkpoint={"root": "gs://bucket/x"}), "an absolute path, a file:/// URI or s3://"),
    ("s3 bucket too short", dict(checkpoint={"root": "s3://ab/x"}), "needs a valid bucket name"),
    ("s3 bucket uppercase", dict(checkpoint={"root": "s3://Bucket/x"}), "needs a valid bucket name"),
    ("s3 bucket underscore", dict(checkpoint={"root": "s3://my_bucket/x"}), "needs a valid bucket name"),
    ("s3 empty segment", dict(checkpoint={"root": "s3://bucket/a//b"}), "no empty path segments"),
    ("s3 dot-dot", dict(checkpoint={"root": "s3://bucket/a/../b"}), "must not contain '..'"),
    ("s3 dot segment", dict(checkpoint={"root": "s3://bucket/a/./b"}), "'.' or '..' segments"),
    ("s3 dot-dot bucket", dict(checkpoint={"root": "s3://my..bucket/x"}), "'..' in the bucket name"),
    ("dotdot in root", dict(checkpoint={"root": "/ckpt/../etc"}), "must not contain '..'"),
    ("restartPolicy Always", dict(template={"spec": {"restartPolicy": "Always", "containers": [{"name": "t"}]}}),
     "restartPolicy must be Never"),
    ("backoff above its max", dict(failurePolicy={"applicationBackoffSeconds": 600,
                                                 "maxApplicationBackoffSeconds": 60}),
     "applicationBackoffSeconds must be <="),
    ("staging size zero", dict(checkpoint={"root": "/ckpt/x", "localStaging": {"sizeLimit": "0Gi"}}),
     "spec.checkpoint.localStaging.sizeLimit must be a positive size in bytes"),
    ("staging size negative", dict(checkpoint={"root": "/ckpt/x", "localStaging": {"sizeLimit": -1}}),
     "spec.checkpoint.localStaging.sizeLimit must be a positive size in bytes"),
    ("staging size not a quantity",
     dict(checkpoint={"root": "/ckpt/x", "localStaging": {"medium": "Memory", "sizeLimit": "lots"}}),
     "spec.checkpoint.localStaging.sizeLimit must be a positive size in bytes"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "spec", "message"), INVALID, ids=[i[0] for i in INVALID])
def test_invalid_spec_is_rejected_naming_the_field(case: str, spec: dict[str, Any], message: str) -> None:
    found = violations(valid_job(**spec), schema())
    assert found and any(message in f for f in found), found
    assert all(f.startswith(("spec.", "metadata.")) for f in found)


@pytest.mark.parametrize("root", ["/ckpt/team-a/job", "file:///ckpt/job", "s3://ckpt/team-a/job", "s3://ckpt",
                                  "s3://my.bucket-1/a/b/", "s3://ckpt/team-a/step.v2"])  # fmt: skip
def test_accepted_roots(root: str) -> None:
    """What the root's description promises is accepted; the s3 ones parse as the operator parses them."""
    assert violations(valid_job(checkpoint={"root": root}), schema()) == []
    if root.startswith("s3://"):
        parse_uri(root)


def test_long_name_is_rejected() -> None:
    obj = valid_job()
    obj["metadata"]["name"] = "x" * 41
    assert violations(obj, schema()) == [
        "metadata.name must be at most 40 characters: pod names add an attempt and rank suffix"
    ]


def test_rules_carry_field_paths_that_exist() -> None:
    """fieldPath must point at a declared property, or the API server rejects the CRD."""

    def walk(node: dict[str, Any]) -> None:
        for rule in node.get(RULE_KEY, []):
            path = rule.get("fieldPath")
            if path:
                target = node
                for part in path.strip(".").split("."):
                    target = target["properties"][part]
        for sub in (node.get("properties") or {}).values():
            walk(sub)

    walk(copy.deepcopy(schema()))
