"""Hostile and broken input, and least privilege, against the real API server and the helm-installed operator.

- invalid specs are rejected at apply time by the CRD's rules, with a message naming the field;
- a `.metadata` pickle crafted to run code is never run: the checkpoint is skipped and an event says why;
- an unreadable checkpoint root is a condition, not a crash; a crash-looping trainer stops at its budget
  with back-off; an image or command that cannot start fails the job with the reason;
- worker pods get no API token unless the template asks; pods pass Pod Security "restricted";
- every rule of the operator's ClusterRole is needed: without it something observable breaks;
- a namespaced install (watchNamespaces) runs jobs with Roles and no cluster-wide rights but nodes and Leases.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from e2e import support
from e2e.cluster import ClusterLike, wait_for
from e2e.support import CHART, HOST_DIR, MOUNT, OPERATOR_NS, RELEASE
from e2e.tests.operator_fixtures import namespace  # noqa: F401  (fixture)
from resilient_contract import storage
from resilient_operator import constants as c
from tests.contracts.test_crd import INVALID

pytestmark = [pytest.mark.cluster]


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {x["type"]: x for x in status.get("conditions") or []}


def reconciles(cl: ClusterLike) -> float:
    samples = support.metric_samples(support.operator_metrics(cl), "rtj_reconcile_seconds_count")
    return sum(v for k, v in samples.items())


# ---- invalid specs ------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_invalid_specs_are_rejected_at_apply_naming_the_field(cluster: ClusterLike, namespace: str) -> None:
    """The offline CEL table (tests/contracts/test_crd.py), replayed against the real API server."""
    failures = []
    cases = [(case, spec, message) for case, spec, message in INVALID]
    long_name = support.job_manifest("x" * 41, namespace)
    for case, spec, message in cases:
        manifest = support.job_manifest("bad", namespace, **copy.deepcopy(spec))
        res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(manifest), check=False)
        if res.returncode == 0 or message not in res.stderr:
            failures.append(f"{case}: rc={res.returncode} stderr={res.stderr.strip()[:300]}")
    res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(long_name), check=False)
    if res.returncode == 0 or "metadata.name must be at most 40 characters" not in res.stderr:
        failures.append(f"long name: {res.stderr.strip()[:300]}")
    # schema-level (non-CEL) rejections name the field too
    for case, patch, field in (("negative replicas", {"replicas": -1}, "spec.replicas"),
                               ("string replicas", {"replicas": "three"}, "spec.replicas"),
                               ("no template", {"template": None}, "spec.template")):  # fmt: skip
        manifest = support.job_manifest("bad", namespace)
        manifest["spec"].update(patch)
        if patch.get("template", 1) is None:
            del manifest["spec"]["template"]
        res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(manifest), check=False)
        if res.returncode == 0 or field not in res.stderr:
            failures.append(f"{case}: rc={res.returncode} stderr={res.stderr.strip()[:300]}")
    assert not failures, "\n".join(failures)
    assert not cluster.kubectl("get", "rtj", "-n", namespace, "-o", "name").stdout.strip()


# ---- hostile checkpoint metadata -----------------------------------------------------------------------
class _RunsCode:
    """Unpickling this calls os.system: what a hostile `.metadata` would do to a naive reader."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> Any:
        return (os.system, (self.command,))


@pytest.mark.timeout(240)
def test_crafted_metadata_never_runs_and_is_skipped(cluster: ClusterLike, namespace: str, tmp_path: Path) -> None:
    root = cluster.host_path(f"{HOST_DIR}/{namespace}/evil")
    support.make_checkpoint(root, step=12)
    evil = support.make_checkpoint(root, step=24)
    marker = Path(f"/dev/shm/rtj-pwned-{namespace}")  # visible to every pod process and to this test
    marker.unlink(missing_ok=True)
    restarts = support.operator_restarts(cluster)
    (evil / storage.METADATA_FILE).write_bytes(pickle.dumps(_RunsCode(f"touch {marker}"), protocol=2))
    # the same reader the operator uses, here first: rejected without running
    verdict = storage.check_step(storage.LocalStore(str(root)), "step-0000000024")
    assert not verdict.complete and "unsafe" in verdict.reason and not marker.exists()

    support.apply(cluster, support.job_manifest("evil", namespace, replicas=2))
    pods = support.running_attempt(cluster, namespace, "evil", 1, 2)
    resume = {e.name: e.value for e in pods[0].spec.containers[0].env}.get("RTJ_RESUME_FROM")
    assert resume == f"{MOUNT}/{namespace}/evil/step-0000000012"
    status = support.job_status(cluster, namespace, "evil")
    assert status["latestCheckpoint"]["step"] == 12 and status["resumedFrom"]["step"] == 12
    story = wait_for(lambda: [e for e in support.events(cluster, namespace, "evil")
                              if e.startswith(c.REASON_CHECKPOINT_SKIPPED)], 30, "the skip event")  # fmt: skip
    assert "step-0000000024" in story[0] and "unsafe .metadata rejected without running it" in story[0], story
    assert not marker.exists(), "the crafted .metadata ran code"
    assert support.operator_restarts(cluster) == restarts


# ---- unreadable checkpoint root ------------------------------------------------------------------------
@pytest.mark.timeout(240)
def test_unreadable_checkpoint_root_is_a_condition_not_a_crash(cluster: ClusterLike, namespace: str) -> None:
    host = cluster.host_path(f"{HOST_DIR}/{namespace}/unread")
    host.parent.mkdir(parents=True, exist_ok=True)
    host.write_text("a file where the checkpoint directory should be\n")
    restarts = support.operator_restarts(cluster)
    support.apply(cluster, support.job_manifest("unread", namespace, replicas=2))

    def unreadable() -> dict[str, Any] | None:
        cond = conditions(support.job_status(cluster, namespace, "unread")).get(c.COND_STORAGE)
        return cond if cond and cond["status"] == "False" else None

    cond = wait_for(unreadable, 60, "CheckpointStorageReady=False")
    assert cond["reason"] == c.REASON_STORAGE_UNREADABLE and "not a directory" in cond["message"], cond
    status = support.job_status(cluster, namespace, "unread")
    assert status["phase"] not in (c.RUNNING, c.STARTING) and not support.job_pods(cluster, namespace, "unread")
    wait_for(lambda: any(e.startswith(c.REASON_STORAGE_UNREADABLE)
                         for e in support.events(cluster, namespace, "unread")),
             30, "the StorageUnreadable event")  # fmt: skip
    # the volume is fixed: the job starts on the operator's storage retry timer, no restart needed
    host.unlink()
    host.mkdir()
    support.running_attempt(cluster, namespace, "unread", 1, 2, timeout=90)
    assert conditions(support.job_status(cluster, namespace, "unread"))[c.COND_STORAGE]["status"] == "True"
    assert support.operator_restarts(cluster) == restarts, "the operator crashed on an unreadable root"


# ---- crash loop ----------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_crash_looping_trainer_stops_at_its_budget_with_backoff(cluster: ClusterLike, namespace: str) -> None:
    before = reconciles(cluster)
    restarts = support.operator_restarts(cluster)
    manifest = support.tiny_job("loop", namespace, script="exit 7", replicas=2,
                        failurePolicy={"maxApplicationRestarts": 2, "applicationBackoffSeconds": 2})  # fmt: skip
    support.apply(cluster, manifest)
    status = support.wait_phase(cluster, namespace, "loop", c.FAILED, timeout=180)
    assert status["restarts"] == {"infrastructure": 0, "application": 2, "planned": 0}
    assert status["lastFailure"]["exitCode"] == 7 and status["lastFailure"]["kind"] == c.APPLICATION
    assert conditions(status)[c.COND_FAILED]["reason"] == c.REASON_APP_BUDGET
    history = status["history"]
    assert [h["attempt"] for h in history] == [1, 2, 3]

    def ts(value: str) -> float:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").timestamp()

    gaps = [ts(history[i + 1]["startTime"]) - ts(history[i]["endTime"]) for i in range(2)]
    # back-off 2 s then 4 s (timestamps have 1 s resolution)
    assert gaps[0] >= 1 and gaps[1] >= 3, gaps
    story = wait_for(lambda: (e := support.events(cluster, namespace, "loop")) and any(
        x.startswith(c.REASON_APP_BUDGET) for x in e) and e, 30, "the budget event")  # fmt: skip
    backoffs = [e for e in story if e.startswith(c.REASON_BACKOFF)]
    assert len(backoffs) == 2 and "in 2s" in backoffs[0] and "in 4s" in backoffs[1], backoffs
    # no hot loop: the failed job is left alone
    settled = reconciles(cluster)
    wait_for(lambda: not [p for p in support.job_pods(cluster, namespace, "loop") if p.status.phase == "Running"], 30,
             "no worker running")  # fmt: skip
    time.sleep(5)  # a measurement window, not a synchronisation: reconciles of a finished job must stop
    after = reconciles(cluster)
    print(f"\nreconciles: {settled - before:.0f} for 3 attempts; {after - settled:.0f} in 5 s after failing")
    assert settled - before < 150, "reconciles per crash-looping job look like a hot loop"
    assert after - settled <= 5
    assert support.operator_restarts(cluster) == restarts


# ---- containers that cannot start ----------------------------------------------------------------------
@pytest.mark.timeout(240)
def test_image_or_command_that_cannot_start_fails_the_job_with_the_reason(cluster: ClusterLike, namespace: str) -> None:
    bad_image = support.tiny_job("noimage", namespace, failurePolicy={"maxApplicationRestarts": 0})
    ctr = bad_image["spec"]["template"]["spec"]["containers"][0]
    ctr["image"] = "registry.invalid/does-not-exist:1"
    del ctr["command"]  # the image's entrypoint: unknown here, as an unpullable image
    bad_cmd = support.tiny_job("nocmd", namespace, failurePolicy={"maxApplicationRestarts": 0})
    bad_cmd["spec"]["template"]["spec"]["containers"][0]["command"] = ["/no/such/trainer"]
    support.apply(cluster, bad_image)
    support.apply(cluster, bad_cmd)
    image = support.wait_phase(cluster, namespace, "noimage", c.FAILED, timeout=120)
    assert image["lastFailure"]["reason"] == c.REASON_IMAGE_CANNOT_START
    assert "ErrImagePull" in image["lastFailure"]["message"], image["lastFailure"]
    cmd = support.wait_phase(cluster, namespace, "nocmd", c.FAILED, timeout=120)
    assert cmd["lastFailure"]["exitCode"] == 128 and "StartError" in cmd["lastFailure"]["message"], cmd
    for name in ("noimage", "nocmd"):
        wait_for(lambda n=name: not [p for p in support.job_pods(cluster, namespace, n)
                                     if p.metadata.deletion_timestamp is None
                                     and p.status.phase not in ("Failed", "Succeeded")],
                 60, f"{name} fenced")  # fmt: skip


# ---- worker pods: token and Pod Security ---------------------------------------------------------------
def _token_mounted(pod: Any) -> bool:
    return any(v.projected and any(s.service_account_token for s in v.projected.sources or [])
               for v in pod.spec.volumes or [])  # fmt: skip


@pytest.mark.timeout(180)
def test_worker_service_account_has_no_api_rights(cluster: ClusterLike, namespace: str) -> None:
    """Worker pods run as their namespace's default ServiceAccount; the chart grants it nothing."""
    sa = f"system:serviceaccount:{namespace}:default"
    for verb, resource in (("list", "pods"), ("get", "secrets"), ("create", "pods"), ("list", "nodes"),
                           ("patch", "resilienttrainingjobs.training.resilient.dev/status")):  # fmt: skip
        res = cluster.kubectl("auth", "can-i", verb, resource, "-n", namespace, "--as", sa, check=False)
        assert res.stdout.strip() == "no", f"worker SA may {verb} {resource}"


@pytest.mark.timeout(180)
def test_worker_pods_get_no_token_unless_asked(cluster: ClusterLike, namespace: str) -> None:
    support.apply(cluster, support.tiny_job("notoken", namespace))
    asked = support.tiny_job("token", namespace)
    asked["spec"]["template"]["spec"]["automountServiceAccountToken"] = True
    support.apply(cluster, asked)
    with_token = support.running_attempt(cluster, namespace, "token", 1, 1)
    assert _token_mounted(with_token[0]), "a template that asks for a token must get one"
    pods = support.running_attempt(cluster, namespace, "notoken", 1, 1)
    assert pods[0].spec.automount_service_account_token is False and not _token_mounted(pods[0])


RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                  "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
RESTRICTED_CTR = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                  "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip


@pytest.mark.timeout(240)
def test_pods_pass_pod_security_restricted(cluster: ClusterLike, namespace: str) -> None:
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    manifest = support.tiny_job("psa", namespace, replicas=2)
    spec = manifest["spec"]["template"]["spec"]
    spec["securityContext"] = RESTRICTED_POD
    spec["containers"][0]["securityContext"] = RESTRICTED_CTR
    # restricted forbids hostPath: the checkpoint volume comes through a PVC (an RWX hostPath PV)
    cluster.create_shared_pvc("ckpt", namespace)
    spec["volumes"] = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}]
    support.apply(cluster, manifest)
    pods = support.running_attempt(cluster, namespace, "psa", 1, 2)
    assert all(p.spec.security_context.run_as_non_root for p in pods)
    # the operator's own pod passes too (server-side dry run reports violating pods as warnings), except
    # for the hostPath checkpoint volume this test install chose (checkpointStorage.hostPath; restricted
    # allows only PVC-style volumes, so production installs use checkpointStorage.existingClaim)
    res = cluster.kubectl("label", "--dry-run=server", "--overwrite", "namespace", OPERATOR_NS,
                          "pod-security.kubernetes.io/enforce=restricted")  # fmt: skip
    problems = [ln for ln in res.stderr.splitlines() if ln.startswith("Warning: rtj-")]
    assert all(ln.endswith(": restricted volume types") for ln in problems), res.stderr
    # a template that is not restricted-compliant is refused by admission: the job never runs a pod
    support.apply(cluster, support.tiny_job("rootjob", namespace))

    def refused() -> bool:
        st = support.job_status(cluster, namespace, "rootjob")
        return st.get("attempt") == 1 and not support.job_pods(cluster, namespace, "rootjob")

    wait_for(refused, 60, "attempt 1 recorded with its pods refused")
    story = support.events(cluster, namespace, "rootjob")
    phase = support.job_status(cluster, namespace, "rootjob").get("phase")
    print(f"\nnon-compliant template: phase {phase}, events {story}")


# ---- least privilege: every ClusterRole rule is needed --------------------------------------------------
def _role_name(cl: ClusterLike) -> str:
    out = cl.kubectl("get", "clusterrole", "-l", "app.kubernetes.io/instance=rtj", "-o", "name").stdout.split()
    assert len(out) == 1, out
    return out[0].split("/", 1)[1]


def _rules(cl: ClusterLike) -> list[dict[str, Any]]:
    return list(json.loads(cl.kubectl("get", "clusterrole", _role_name(cl), "-o", "json").stdout)["rules"])


def _rule_id(rule: dict[str, Any]) -> str:
    return f"{(rule.get('apiGroups') or [''])[0] or 'core'}/{rule['resources'][0]}"


RULES = ["training.resilient.dev/resilienttrainingjobs", "training.resilient.dev/resilienttrainingjobs/status",
         "core/pods", "core/services", "core/nodes", "core/events",
         "policy/poddisruptionbudgets"]  # fmt: skip
UNNEEDED: dict[str, str] = {}  # rule -> why (filled from what the sweep shows)


def _set_rules(cl: ClusterLike, rules: list[dict[str, Any]]) -> None:
    role = json.loads(cl.kubectl("get", "clusterrole", _role_name(cl), "-o", "json").stdout)
    role["rules"] = rules
    role["metadata"].pop("resourceVersion", None)
    cl.kubectl("replace", "-f", "-", input=json.dumps(role))


@pytest.fixture
def full_rules(cluster: ClusterLike) -> Any:
    rules = _rules(cluster)
    assert sorted(_rule_id(r) for r in rules) == sorted(RULES), "the chart's rules changed: update RULES"
    yield rules
    _set_rules(cluster, rules)
    support.replace_operator_pods(cluster)  # fresh processes (every replica) with every watch under the full role


def _healthy(cl: ClusterLike, ns: str, name: str) -> bool:
    st = support.job_status(cl, ns, name)
    if st.get("phase") != c.RUNNING:
        return False
    try:
        support.core(cl).read_namespaced_service(name, ns)
    except Exception:
        return False
    return any(e.startswith(c.REASON_ALL_RUNNING) for e in support.events(cl, ns, name))


@pytest.mark.timeout(600)
def test_every_clusterrole_rule_is_needed(cluster: ClusterLike, namespace: str,
                                          full_rules: list[dict[str, Any]]) -> None:
    """Remove one rule, restart the operator, submit a job: it must visibly break (403 in the log, no
    status, no pods, no Service or no events). A rule whose removal changes nothing is reported."""
    results: dict[str, str] = {}
    for index, rule in enumerate(full_rules):
        rid = _rule_id(rule)
        _set_rules(cluster, [r for i, r in enumerate(full_rules) if i != index])
        # New pods for every replica (a standby with the old rules' watches would take over); without some rules
        # none can lead, so their logs are read, all of them
        replicas = support.replace_operator_pods(cluster, leading=False)
        name = f"rbac{index}"
        support.apply(cluster, support.tiny_job(name, namespace))
        deadline = time.monotonic() + 25
        outcome = ""
        while time.monotonic() < deadline:
            text = "\n".join(cluster.pod_log(support.OPERATOR_NS, pod) for pod in replicas)
            refused = [ln for ln in text.splitlines() if '" 403 ' in ln or "orbidden" in ln]
            if refused:
                outcome = "forbidden: " + refused[0][:200]
                break
            if _healthy(cluster, namespace, name):
                break
            time.sleep(0.5)
        healthy = _healthy(cluster, namespace, name)
        if not outcome and not healthy:
            st = support.job_status(cluster, namespace, name)
            pods = len(support.job_pods(cluster, namespace, name))
            outcome = f"job not healthy in 25 s: phase {st.get('phase')}, pods {pods}"
        results[rid] = outcome or "NOTHING BROKE"
        print(f"\nwithout {rid}: {results[rid]}")
    unneeded = sorted(r for r, o in results.items() if o == "NOTHING BROKE")
    assert unneeded == sorted(UNNEEDED), f"rules whose removal broke nothing: {unneeded}; results {results}"


@pytest.mark.timeout(240)
def test_service_exists_after_a_failure_between_status_write_and_creates(cluster: ClusterLike, namespace: str) -> None:
    """The state of an operator that crashed after writing attempt 1 but before creating the Service: here
    the Service create is refused (RBAC) for a while, then allowed. The job must end with its Service."""
    rules = _rules(cluster)

    def errors() -> float:
        return sum(support.metric_samples(support.operator_metrics(cluster), "rtj_reconcile_errors_total").values())

    # the leader's metrics endpoint may still be starting (the rule sweep before this test restarts the replicas)
    before = wait_for(lambda: (errors(),), 60, "the operator's metrics")[0]
    _set_rules(cluster, [r for r in rules if _rule_id(r) != "core/services"])
    try:
        support.apply(cluster, support.tiny_job("nosvc", namespace))
        wait_for(lambda: support.job_status(cluster, namespace, "nosvc").get("attempt") == 1, 60, "attempt 1 written")
        wait_for(lambda: errors() >= before + 2, 60, "the refused create retried")
    finally:
        _set_rules(cluster, rules)
    support.wait_phase(cluster, namespace, "nosvc", c.RUNNING, timeout=60)
    wait_for(lambda: support.core(cluster).read_namespaced_service("nosvc", namespace), 30, "the rendezvous Service")


# ---- least privilege, namespaced install: Roles in the watched namespaces, nothing cluster-wide but nodes --
@contextmanager
def release_with(cl: ClusterLike, *sets: str) -> Iterator[None]:
    """The session's release upgraded with these `--set`s (on top of its install values), rolled back to
    the exact previous revision afterwards (a `--set x=null` under --reuse-values does not restore a default)."""
    revision = json.loads(cl.helm("status", RELEASE, "--namespace", OPERATOR_NS, "-o", "json").stdout)["version"]
    cl.helm("upgrade", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--reuse-values",
            *[arg for s in sets for arg in ("--set", s)], "--wait", "--timeout", "120s")  # fmt: skip
    try:
        yield
    finally:
        cl.helm("rollback", RELEASE, str(revision), "--namespace", OPERATOR_NS, "--wait", "--timeout", "120s")


def _operator_watches(cl: ClusterLike, namespaces: str) -> bool:
    pod = support.operator_pod(cl)
    return pod is not None and pod.status.phase == "Running" and any(
        e.name == "RTJ_NAMESPACES" and (e.value or "") == namespaces for e in pod.spec.containers[0].env)


@pytest.fixture
def namespaced_install(cluster: ClusterLike, namespace: str) -> Iterator[None]:
    """The session's release upgraded to watch only this test's namespace (a new operator pod: Recreate);
    back to every namespace afterwards."""
    with release_with(cluster, f"watchNamespaces={{{namespace}}}"):
        wait_for(lambda: _operator_watches(cluster, namespace), 120, "the namespaced operator running")
        support.wait_operator_ready(cluster)
        yield
    wait_for(lambda: _operator_watches(cluster, ""), 120, "the cluster-wide operator back")
    support.wait_operator_ready(cluster)


def _can(cl: ClusterLike, verb: str, resource: str, *where: str) -> bool:
    sa = f"system:serviceaccount:{OPERATOR_NS}:{_role_name(cl)}"  # the chart names both after the release
    return cl.kubectl("auth", "can-i", verb, resource, *where, "--as", sa, check=False).stdout.strip() == "yes"


@pytest.mark.timeout(600)
def test_namespaced_install_runs_jobs_with_roles_and_nothing_more(cluster: ClusterLike, namespace: str,
                                                                   namespaced_install: None) -> None:  # fmt: skip
    """watchNamespaces=[ns]: the ClusterRole keeps nodes (read-only); node Leases are readable in
    kube-node-lease only (issue 25); jobs in ns run under the Role; the operator may not touch pods
    elsewhere. (The chart's kube-node-lease Role for jobs and pods was needed while kopf watched jobs and
    pods in every watched namespace; the operator's own informers no longer do, so it is left to remove.)"""
    assert sorted(_rule_id(r) for r in _rules(cluster)) == ["core/nodes"]
    assert _can(cluster, "list", "leases.coordination.k8s.io", "-n", "kube-node-lease")
    assert not _can(cluster, "list", "leases.coordination.k8s.io", "-n", "default")
    assert not _can(cluster, "get", "leases.coordination.k8s.io", "-n", "kube-node-lease")
    assert _can(cluster, "create", "pods", "-n", namespace) and _can(cluster, "list", "nodes")
    assert not _can(cluster, "create", "pods", "-n", "default")
    assert not _can(cluster, "list", "pods", "--all-namespaces")
    assert not _can(cluster, "patch", "resilienttrainingjobs.training.resilient.dev/status", "-n", "default")
    support.apply(cluster, support.tiny_job("scoped", namespace))
    wait_for(lambda: _healthy(cluster, namespace, "scoped"), 60, "the job running under the Role")

