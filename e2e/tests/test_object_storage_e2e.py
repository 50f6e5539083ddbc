"""End to end with checkpoints in object storage: a real S3 server (SeaweedFS) inside the cluster.

The platform admin's part: a bucket, read-only keys for the operator as a Secret in its namespace, and an
`objectStorage.areas` entry mapping `s3://<bucket>/<namespace>` to the tenant's namespace (helm upgrade).
The tenant's part: a Secret with read-write keys and the endpoint, referenced from the job's pod template
(`envFrom`), and `spec.checkpoint.root: s3://...`. The job never names the operator's credentials.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e import scenarios, support
from e2e.localcluster.cluster import Cluster, wait_for
from e2e.s3server import REGION, Identity, S3Server
from e2e.support import (
    MOUNT,
    OPERATOR_NS,
    RELEASE,
    events,
    get_job,
    injected_env,
    job_pods,
    node_of,
    running_attempt,
    wait_operator_ready,
    wait_phase,
)
from resilient_contract import environment, storage
from resilient_operator import constants as c

pytestmark = [pytest.mark.cluster]
BUCKET = "rtj-e2e"
OTHER_BUCKET = "rtj-other-team"
OPERATOR_SECRET = "rtj-s3-readonly"
TENANT_SECRET = "s3-keys"


@pytest.fixture(scope="module")
def s3(cluster: Any, operator: str) -> Iterator[tuple[S3Server, Identity, Identity]]:
    """SeaweedFS in the cluster's network namespace with a tenant identity (read-write on the bucket) and
    the operator's (read-only); the operator's keys as a Secret in its namespace."""
    if not isinstance(cluster, Cluster):
        pytest.skip("the S3 server runs inside the local substrate's network namespace")
    tenant = Identity.for_bucket("tenant", BUCKET)
    reader = Identity.new("operator", [f"Read:{BUCKET}", f"List:{BUCKET}", f"Read:{OTHER_BUCKET}",
                                       f"List:{OTHER_BUCKET}"])  # fmt: skip
    server = cluster.start_s3([tenant, reader])
    server.create_bucket(BUCKET)
    server.create_bucket(OTHER_BUCKET)
    cluster.kubectl("create", "secret", "generic", OPERATOR_SECRET, "-n", OPERATOR_NS,
                    f"--from-literal=AWS_ACCESS_KEY_ID={reader.access_key}",
                    f"--from-literal=AWS_SECRET_ACCESS_KEY={reader.secret_key}")  # fmt: skip
    yield server, tenant, reader


def grant_area(cluster: Cluster, server: S3Server, namespace: str) -> str:
    """The admin maps s3://BUCKET/<namespace> to the namespace (helm upgrade); returns the area's URI."""
    area = f"s3://{BUCKET}/{namespace}"
    areas = [{"uri": area, "namespaces": [namespace], "secret": OPERATOR_SECRET, "endpoint": server.endpoint,
              "region": REGION}]  # fmt: skip
    import json

    cluster.helm("upgrade", RELEASE, str(support.CHART), "--namespace", OPERATOR_NS, "--reuse-values", "--wait",
                 "--timeout", "120s", "--set-json", f"objectStorage.areas={json.dumps(areas)}")  # fmt: skip
    wait_for(lambda: support.operator_pod(cluster) is not None and OPERATOR_SECRET in str(
        support.operator_pod(cluster).spec.volumes), 120, "the operator pod with the area's keys")  # fmt: skip
    wait_operator_ready(cluster)
    return area


def tenant_secret(cluster: Cluster, namespace: str, server: S3Server, tenant: Identity) -> None:
    env = server.client_env(tenant)
    cluster.kubectl("create", "secret", "generic", TENANT_SECRET, "-n", namespace,
                    *(f"--from-literal={k}={v}" for k, v in env.items()))  # fmt: skip


def s3_job(namespace: str, name: str, root: str, **kw: Any) -> dict[str, Any]:
    job = scenarios.example_job(name, namespace, extra_args=(f"--dump-state={MOUNT}/{namespace}/{name}.pt",), **kw)
    job["spec"]["checkpoint"]["root"] = root
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["envFrom"] = [{"secretRef": {"name": TENANT_SECRET}}]
    return job


def newest_complete(server: S3Server, root: str) -> storage.Verdict | None:
    admin = server.admin
    creds = storage.s3.S3Credentials(admin.access_key, admin.secret_key, server.local_endpoint, REGION)
    store = storage.s3.S3Store(root, creds)
    try:
        return storage.scan(store, storage.UNBOUNDED_SCAN).latest
    except storage.StorageError:
        return None
    finally:
        store.close()


@pytest.mark.timeout(600)
def test_node_loss_with_an_s3_root_resumes_smaller_from_the_bucket(
    cluster: Cluster, job_ns: str, s3: tuple[S3Server, Identity, Identity], reference: dict[str, Any]
) -> None:
    import torch

    server, tenant, _ = s3
    ns, name = job_ns, "s3tiny"
    area = grant_area(cluster, server, ns)
    tenant_secret(cluster, ns, server, tenant)
    scenarios.shared_claim(cluster, ns)  # only for the final model dump the test compares
    dump_dir = cluster.host_path(f"{support.HOST_DIR}/{ns}")
    dump_dir.mkdir(parents=True, exist_ok=True)
    dump_dir.chmod(0o1777)  # the workers run as the image's non-root user
    root = f"{area}/{name}"
    job = s3_job(ns, name, root, steps=scenarios.STEPS)
    cluster.apply(job)
    pods = running_attempt(cluster, ns, name, 1, 4, timeout=180)
    first = wait_for(lambda: newest_complete(server, root), 180, "the first complete checkpoint in the bucket")
    timeline = scenarios.kill_and_time(cluster, ns, name, node_of(pods, "1"))
    print(f"\nS3 root: recovery timeline after killing {timeline.node}: {timeline.row()}")

    assert timeline.attempt == 2 and timeline.replicas == 3
    status = get_job(cluster, ns, name)["status"]
    resumed = status["resumedFrom"]
    assert resumed["path"].startswith(root + "/") and resumed["step"] >= first.step
    new = running_attempt(cluster, ns, name, 2, 3)
    assert injected_env(new[0])[environment.RESUME_FROM] == resumed["path"]

    final = wait_phase(cluster, ns, name, c.SUCCEEDED, 300)
    assert final["restarts"]["infrastructure"] == 1
    rank0 = next(p.metadata.name for p in job_pods(cluster, ns, name) if p.metadata.labels[c.LABEL_RANK] == "0")
    result = scenarios.result_line(scenarios.trainer_log(cluster, ns, rank0))
    assert result and result["step"] == str(scenarios.STEPS) and result["world_size"] == "3"
    state = torch.load(cluster.host_path(f"{support.HOST_DIR}/{ns}/{name}.pt"), weights_only=False)
    diff = scenarios.relative_difference(reference["model"], state["model"])
    print(f"final model vs failure-free reference: relative difference {diff:.2e}")
    assert diff <= scenarios.TOLERANCE
    assert any("restarted 4 -> 3 workers" in e for e in events(cluster, ns, name))
    # retention ran in the bucket and kept the resume source
    assert newest_complete(server, root) is not None
    source = storage.check_step(storage.s3.S3Store(root, storage.s3.S3Credentials(
        server.admin.access_key, server.admin.secret_key, server.local_endpoint, REGION)), resumed["path"].rsplit(
        "/", 1)[1])  # fmt: skip
    assert source.complete, source


@pytest.mark.timeout(300)
def test_a_bucket_outside_the_namespaces_area_is_refused_with_a_condition(
    cluster: Cluster, job_ns: str, s3: tuple[S3Server, Identity, Identity]
) -> None:
    server, tenant, _ = s3
    ns, name = job_ns, "s3thief"
    grant_area(cluster, server, ns)
    tenant_secret(cluster, ns, server, tenant)
    # another team's bucket (the operator could read it: the area mapping, not the keys, is the boundary)
    cluster.apply(s3_job(ns, name, f"s3://{OTHER_BUCKET}/{ns}/{name}"))

    def refused() -> dict[str, Any] | None:
        conds = {x["type"]: x for x in get_job(cluster, ns, name).get("status", {}).get("conditions", [])}
        cond = conds.get(c.COND_STORAGE)
        return cond if cond and cond["status"] == "False" else None

    cond = wait_for(refused, 60, "CheckpointStorageReady=False")
    assert cond["reason"] == storage.errors.REASON_ROOT_OUTSIDE_AREA, cond
    assert not job_pods(cluster, ns, name)
