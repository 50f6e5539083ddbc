"""spec.checkpoint.localStaging, the operator's side of the two-tier checkpoint writer: the node-local emptyDir a
save's shards land in before their upload, its mount and the environment naming it; what the spec view refuses;
and a changed setting counting as a changed template (kept pods could not gain the volume)."""

from __future__ import annotations

import re
from typing import Any

import celpy
import pytest
import yaml

from resilient_contract import environment
from resilient_operator import constants as c
from resilient_operator import views
from resilient_operator.core import inplace, reconcile, render
from resilient_operator.core.model import LOCAL_STAGING_VOLUME, LocalStaging, OperatorConfig
from resilient_operator.views import SpecProblem, job_spec
from tests.contracts.test_crd import violations
from tests.operator.builders import (
    DEFAULT_TEMPLATE_HASH,
    NOW,
    ROOT,
    apply_defaults,
    gang,
    job,
    job_object,
    listing,
    node,
    nodes,
    pod,
    running_status,
    schema,
)

MOUNT = environment.LOCAL_CHECKPOINT_MOUNT
TEMPLATE: dict[str, Any] = {"spec": {"containers": [
    {"name": "trainer", "image": "trainer:1", "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints"}]},
    {"name": "sidecar", "image": "side:1"}],
    "volumes": [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": "rtj-checkpoints"}}]}}


def staged(**staging: Any) -> dict[str, Any]:
    return {"checkpoint": {"localStaging": staging}}


def rendered(**spec: Any) -> dict[str, Any]:
    j = job(**spec)
    assert j.problem is None, j.problem
    return render.pod_manifest(j, 1, 0, 4, None)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_absent_renders_the_pod_as_before() -> None:
    manifest = rendered(template=TEMPLATE)
    assert manifest["spec"]["volumes"] == TEMPLATE["spec"]["volumes"]
    assert [k.get("volumeMounts") for k in manifest["spec"]["containers"]] == [
        TEMPLATE["spec"]["containers"][0]["volumeMounts"], None]
    assert all(environment.LOCAL_CHECKPOINT_DIR not in env_of(k) for k in manifest["spec"]["containers"])
    assert environment.local_checkpoint_dir(env_of(manifest["spec"]["containers"][0])) is None  # straight to the root
    # the template hash is the template's alone, as before: pods of running jobs stay keepable over an upgrade
    default = rendered()
    assert default["metadata"]["annotations"][c.ANNOTATION_TEMPLATE_HASH] == DEFAULT_TEMPLATE_HASH


def test_disk_staging_adds_an_emptydir_mounted_in_every_container_and_names_it_in_the_env() -> None:
    manifest = rendered(template=TEMPLATE, **staged())
    volumes = {v["name"]: v for v in manifest["spec"]["volumes"]}
    assert volumes[LOCAL_STAGING_VOLUME] == {"name": LOCAL_STAGING_VOLUME, "emptyDir": {}}  # the node's disk
    assert volumes["checkpoints"] == TEMPLATE["spec"]["volumes"][0]  # the user's volumes are kept
    for container in manifest["spec"]["containers"]:
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts[LOCAL_STAGING_VOLUME] == MOUNT
        # what the trainer reads: the directory the shards go to first
        assert environment.local_checkpoint_dir(env_of(container)) == MOUNT
    assert manifest["spec"]["containers"][0]["volumeMounts"][0] == {"name": "checkpoints", "mountPath": "/checkpoints"}
    # rendering did not edit the job's template in place (every pod of the attempt starts from it)
    j = job(template=TEMPLATE, **staged())
    render.pod_manifest(j, 1, 1, 4, None)
    assert j.spec.template == TEMPLATE and LOCAL_STAGING_VOLUME not in str(TEMPLATE)


@pytest.mark.parametrize(("staging", "empty_dir"), [
    ({"medium": "Memory"}, {"medium": "Memory"}),
    ({"medium": "Memory", "sizeLimit": "16Gi"}, {"medium": "Memory", "sizeLimit": "16Gi"}),
    ({"medium": "Disk", "sizeLimit": "500G"}, {"sizeLimit": "500G"}),
    ({"sizeLimit": 1073741824}, {"sizeLimit": "1073741824"}),  # an integer quantity (int-or-string)
])  # fmt: skip
def test_medium_and_size_limit_reach_the_emptydir(staging: dict[str, Any], empty_dir: dict[str, Any]) -> None:
    volumes = {v["name"]: v for v in rendered(**staged(**staging))["spec"]["volumes"]}
    assert volumes[LOCAL_STAGING_VOLUME]["emptyDir"] == empty_dir


def test_the_crd_defaults_the_medium_to_disk() -> None:
    spec = job_object(**staged())["spec"]
    assert spec["checkpoint"]["localStaging"] == {"medium": "Disk"}
    assert job_spec(spec).local_staging == LocalStaging("Disk", None)
    assert job_spec(job_object()["spec"]).local_staging is None


CONFLICTS = [
    ("a volume of its name", {"spec": {"containers": [{"name": "t"}],
                                       "volumes": [{"name": "x", "emptyDir": {}},
                                                   {"name": LOCAL_STAGING_VOLUME, "emptyDir": {}}]}},
     ["spec.template.spec.volumes[1]", LOCAL_STAGING_VOLUME]),
    ("a mount of its name", {"spec": {"containers": [
        {"name": "t"}, {"name": "u", "volumeMounts": [{"name": LOCAL_STAGING_VOLUME, "mountPath": "/x"}]}]}},
     ["spec.template.spec.containers[1].volumeMounts[0]", LOCAL_STAGING_VOLUME]),
    ("a mount at its path", {"spec": {"containers": [
        {"name": "t", "volumeMounts": [{"name": "scratch", "mountPath": MOUNT + "/"}]}],
        "volumes": [{"name": "scratch", "emptyDir": {}}]}},
     ["spec.template.spec.containers[0].volumeMounts[0]", MOUNT]),
    ("its env", {"spec": {"containers": [{"name": "t", "env": [
        {"name": environment.LOCAL_CHECKPOINT_DIR, "value": "/scratch"}]}]}},
     ["spec.template.spec.containers[0].env[0]", environment.LOCAL_CHECKPOINT_DIR]),
    ("a malformed mount", {"spec": {"containers": [{"name": "t", "volumeMounts": ["/x"]}]}},
     ["spec.template.spec.containers[0].volumeMounts[0] must be an object"]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "template", "named"), CONFLICTS, ids=[row[0] for row in CONFLICTS])
def test_a_template_that_collides_with_what_staging_adds_is_refused_naming_it(
        case: str, template: dict[str, Any], named: list[str]) -> None:
    j = job(template=template, **staged())
    assert j.problem and all(n in j.problem for n in named), j.problem


def test_the_volume_name_is_free_to_use_without_staging() -> None:
    template = CONFLICTS[0][1]
    assert job(template=template).problem is None


BAD_VALUES = [
    ({"medium": "SSD"}, "spec.checkpoint.localStaging.medium must be Disk or Memory, not 'SSD'"),
    ({"medium": ""}, "spec.checkpoint.localStaging.medium must be Disk or Memory"),
    ({"medium": ["Memory"]}, "spec.checkpoint.localStaging.medium must be Disk or Memory"),
    ({"sizeLimit": "lots"}, "spec.checkpoint.localStaging.sizeLimit must be a positive size in bytes"),
    ({"sizeLimit": "0"}, "not '0'"),
    ({"sizeLimit": "-1Gi"}, "not '-1Gi'"),
    ({"sizeLimit": 0}, "sizeLimit must be a positive size"),
    ({"sizeLimit": True}, "sizeLimit must be a positive size"),
    ({"sizeLimit": {"Gi": 4}}, "sizeLimit must be a positive size"),
    ({"sizeLimit": "100m"}, "sizeLimit must be a positive size"),  # a tenth of a byte
    ({"sizeLimit": "1e40"}, "sizeLimit must be a positive size"),  # more than a quantity holds
]  # fmt: skip


@pytest.mark.parametrize(("staging", "message"), BAD_VALUES, ids=[repr(b[0]) for b in BAD_VALUES])
def test_a_bad_value_is_a_spec_problem_naming_the_field_never_a_crash(staging: dict[str, Any], message: str) -> None:
    j = job(**staged(**staging))  # the CRD's defaulting fills nothing over a value that is present
    assert j.problem and message in j.problem, j.problem


def test_staging_that_is_not_an_object_is_refused() -> None:
    obj = job_object()
    obj["spec"]["checkpoint"]["localStaging"] = "Memory"  # not an object at all
    with pytest.raises(SpecProblem, match=r"spec\.checkpoint\.localStaging must be an object"):
        job_spec(obj["spec"])


# The CRD's rule (run here with cel-python, in the API server for real) and the operator's own check agree on
# what a size is: a positive whole-ish number of bytes, decimal or binary suffix.
SIZES = [("200Gi", True), ("500G", True), ("1.5Ti", True), (".5Gi", True), ("1e9", True), ("100", True),
         (1073741824, True), ("0", False), ("0Gi", False), ("0.0", False), ("-1Gi", False), (0, False),
         (-5, False), ("lots", False), ("10K", False), ("500m", False), ("1 Gi", False)]  # fmt: skip


def staging_schema() -> dict[str, Any]:
    out: dict[str, Any] = schema()["properties"]["spec"]["properties"]["checkpoint"]["properties"]["localStaging"]
    return out


@pytest.mark.parametrize(("size", "ok"), SIZES, ids=[repr(s[0]) for s in SIZES])
def test_the_crd_and_the_operator_agree_on_sizes(size: Any, ok: bool) -> None:
    node_schema = staging_schema()
    env = celpy.Environment()
    verdicts = []
    for rule in node_schema["x-kubernetes-validations"]:
        program = env.program(env.compile(rule["rule"]))
        verdicts.append(bool(program.evaluate({"self": celpy.json_to_cel({"sizeLimit": size})})))
        assert rule["message"].startswith("spec.checkpoint.localStaging.sizeLimit must be a positive size")
    assert all(verdicts) is ok
    assert (job(**staged(sizeLimit=size)).problem is None) is ok
    if ok and isinstance(size, str):  # the openAPI quantity pattern (the API server's first check) lets it in
        assert re.search(node_schema["properties"]["sizeLimit"]["pattern"], size)


def test_the_crd_offers_exactly_the_media_the_operator_renders() -> None:
    medium = staging_schema()["properties"]["medium"]
    assert medium["enum"] == ["Disk", "Memory"] and medium["default"] == "Disk"
    size = staging_schema()["properties"]["sizeLimit"]
    assert size["x-kubernetes-int-or-string"] is True and size["anyOf"] == [{"type": "integer"}, {"type": "string"}]


def test_a_changed_staging_is_a_changed_template() -> None:
    template = job().spec.template
    hashes = {inplace.template_hash(template, staging) for staging in
              (None, LocalStaging("Disk"), LocalStaging("Memory"), LocalStaging("Memory", "8Gi"))}
    assert len(hashes) == 4
    assert inplace.template_hash(template, None) == inplace.template_hash(template) == DEFAULT_TEMPLATE_HASH
    assert inplace.template_hash(template, LocalStaging("Disk")) == inplace.template_hash(template, LocalStaging())
    for spec in ({}, staged(), staged(medium="Memory")):  # what a pod carries is what the job's spec gives
        j = job(**spec)
        annotations = render.pod_manifest(j, 1, 0, 4, None)["metadata"]["annotations"]
        assert annotations[c.ANNOTATION_TEMPLATE_HASH] == inplace.template_hash(j.spec.template, j.spec.local_staging)


CONFIG = OperatorConfig(plan_public_key="operator-public-key", in_place_ack_seconds=10.0)
IN_PLACE = {"restartStrategy": "InPlace", "nodeLossTimeoutSeconds": 20}


def lost_n3() -> dict[str, Any]:
    return nodes(node("n0"), node("n1"), node("n2"), node("n3", lease_age=25.0))


def test_in_place_keeps_pods_rendered_with_the_same_staging() -> None:
    j = job(running_status(), **IN_PLACE, **staged(medium="Memory"))
    current = inplace.job_hash(j)
    pods = [pod(1, r, node_name=f"n{r}", template=current) for r in range(4)]
    plan = reconcile(j, pods, lost_n3(), listing(40), NOW, config=CONFIG)
    assert plan.force_delete == ["demo-a1-3"] and plan.delete == []  # the survivors carry on, local copy and all


def test_in_place_recreates_pods_rendered_before_staging_was_set() -> None:
    j = job(running_status(), **IN_PLACE, **staged())
    plan = reconcile(j, gang(1, 4), lost_n3(), listing(40), NOW, config=CONFIG)  # pods of the template alone
    assert sorted(plan.delete + plan.force_delete) == [f"demo-a1-{r}" for r in range(4)]  # none can gain the volume


def test_the_example_job_is_valid_and_renders_its_staging() -> None:
    """examples/job-local-staging.yaml: the CRD's rules accept it, the operator takes it, the pod gets the tier."""
    obj = apply_defaults(yaml.safe_load((ROOT / "examples" / "job-local-staging.yaml").read_text()), schema())
    assert violations(obj, schema()) == []
    obj["metadata"].update(namespace="default", uid="uid-1")
    example = views.job_view(obj)
    assert example.problem is None, example.problem
    assert example.spec.local_staging == LocalStaging("Disk", "4Gi")
    manifest = render.pod_manifest(example, 1, 0, 4, None)
    assert {"name": LOCAL_STAGING_VOLUME, "emptyDir": {"sizeLimit": "4Gi"}} in manifest["spec"]["volumes"]
    assert environment.local_checkpoint_dir(env_of(manifest["spec"]["containers"][0])) == MOUNT
