"""The chart's example ValidatingAdmissionPolicy, installed with helm on the real API server: a job whose
template asks for host access is refused at apply (create and update) with a message naming the field; a
compliant job is admitted and runs; namespaces outside `admissionPolicy.namespaces` are not judged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.localcluster.cluster import Cluster, wait_for
from e2e.support import MOUNT, RELEASE, apply, running_attempt, tiny_job
from e2e.tests.operator_fixtures import namespace  # noqa: F401  (fixture)
from e2e.tests.test_security import release_with

pytestmark = [pytest.mark.cluster]


def compliant_job(cl: Cluster, name: str, ns: str) -> dict[str, Any]:
    """A tiny job whose checkpoint volume is a PVC (the e2e default, a hostPath volume, is what the policy refuses)."""
    job = tiny_job(name, ns)
    job["spec"]["checkpoint"]["root"] = f"{MOUNT}/{ns}/{name}"
    job["spec"]["template"]["spec"]["volumes"] = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}]
    return job


def privileged(job: dict[str, Any]) -> dict[str, Any]:
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return job


def refusal(cl: Cluster, manifest: dict[str, Any], *flags: str) -> str:
    """stderr of a refused apply; fails the test if the API server admitted it."""
    res = cl.kubectl("apply", *flags, "-f", "-", input=json.dumps(manifest), check=False)
    assert res.returncode != 0, f"admitted: {manifest['metadata']['name']}"
    return res.stderr


@pytest.fixture
def policy(cluster: Cluster, namespace: str) -> Iterator[str]:
    """The session's release upgraded with the policy on for this test's namespace only (the operator's
    Deployment does not change, so it keeps running); rolled back afterwards."""
    with release_with(cluster, "admissionPolicy.enabled=true", f"admissionPolicy.namespaces={{{namespace}}}"):
        yield cluster.kubectl("get", "validatingadmissionpolicy", "-l", f"app.kubernetes.io/instance={RELEASE}",
                              "-o", "jsonpath={.items[0].metadata.name}").stdout  # fmt: skip
    assert not cluster.kubectl("get", "validatingadmissionpolicy", "-l", f"app.kubernetes.io/instance={RELEASE}",
                               "-o", "name").stdout.strip(), "the policy outlived its test"  # fmt: skip


@pytest.mark.timeout(300)
def test_privileged_template_is_refused_and_a_compliant_one_admitted(cluster: Cluster, namespace: str,
                                                                     policy: str) -> None:  # fmt: skip
    cluster.create_shared_pvc("ckpt", namespace)
    bad = privileged(compliant_job(cluster, "priv", namespace))
    # a new policy takes effect once the API server has compiled it and seen its binding: poll, dry-run
    message = wait_for(lambda: (r := cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(bad),
                                                     check=False)).returncode != 0 and r.stderr,
                       30, "the policy in force")  # fmt: skip
    assert policy in message and "securityContext.privileged" in message, message
    assert "securityContext.privileged" in refusal(cluster, bad)
    # the e2e default template mounts the checkpoints with hostPath: refused too, naming that field
    assert "hostPath" in refusal(cluster, tiny_job("hostpath", namespace))
    host_net = compliant_job(cluster, "hostnet", namespace)
    host_net["spec"]["template"]["spec"]["hostNetwork"] = True
    assert "hostNetwork" in refusal(cluster, host_net)
    assert not cluster.kubectl("get", "rtj", "-n", namespace, "-o", "name").stdout.strip()

    ok = compliant_job(cluster, "ok", namespace)
    apply(cluster, ok)
    running_attempt(cluster, namespace, "ok", 1, 1)
    # an update that adds host access is refused as well; the running job is unchanged
    assert "securityContext.privileged" in refusal(cluster, privileged(compliant_job(cluster, "ok", namespace)))
    live = json.loads(cluster.kubectl("get", "rtj", "ok", "-n", namespace, "-o", "json").stdout)
    assert "securityContext" not in live["spec"]["template"]["spec"]["containers"][0]

    # another namespace is outside admissionPolicy.namespaces: the same template passes admission there
    cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(privileged(
        compliant_job(cluster, "priv", "default"))))  # fmt: skip
