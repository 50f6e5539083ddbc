"""A real Kueue on the local cluster: its controller manager (built by hack/kueue/build.sh, pinned),
its CRDs and webhooks from the module's own config/ manifests, and the queues the tests use.

The manager runs like the control plane, inside the cluster's network namespace, so the API server
reaches its webhook server at https://127.0.0.1:9443 (a URL clientConfig instead of a Service: there
is no kube-proxy here). Its serving certificate comes from the cluster's throwaway CA (pki.py), whose
bundle goes into every webhook configuration and CRD conversion stanza; Kueue's own cert rotation is
off. The manager authenticates with a client certificate in system:masters: it is test infrastructure,
and Kueue's RBAC is not what these tests examine.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import wait_for
from e2e.controlplane import ControlPlane
from e2e.controlplane.binaries import REPO_ROOT
from resilient_operator import constants as c

BUILD_SCRIPT = REPO_ROOT / "hack" / "kueue" / "build.sh"
NAMESPACE = "kueue-system"
WEBHOOK_PORT, HEALTH_PORT = 9443, 8081
# CRDs served in v1beta1 and v1beta2 (config/components/crd/kustomization.yaml enables these patches)
CONVERTED = {"localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"}
FLAVOR, CLUSTER_QUEUE = "train-pool", "rtj-gpus"
QUEUES = ("team-a", "team-b")
PRIORITIES = {"low": 100, "high": 1000}


def kueue_dir(timeout: float = 3600) -> Path:
    """Build (or reuse) the pinned manager and manifests; returns their directory."""
    out = subprocess.run([str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True, timeout=timeout)
    return Path(out.stdout.strip().splitlines()[-1])


def _url(path: str) -> str:
    return f"https://127.0.0.1:{WEBHOOK_PORT}{path}"


def _manifests(d: Path, ca: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The CRDs (conversion via our URL) and Kueue's own webhook configurations, rewritten to our URL and
    kept to Kueue's API group (the job-framework webhooks would intercept every batch Job and Pod)."""
    crds = []
    for f in sorted((d / "config" / "crd").glob("*.yaml")):
        crd = yaml.safe_load(f.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": _url("/convert"), "caBundle": ca}, "conversionReviewVersions": ["v1"]}}
        crds.append(crd)
    hooks = []
    for doc in yaml.safe_load_all((d / "config" / "webhooks.yaml").read_text()):
        if not doc:
            continue
        doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
        kept = []
        for hook in doc["webhooks"]:
            if all(c.KUEUE_GROUP in (rule.get("apiGroups") or []) for rule in hook.get("rules") or []):
                hook["clientConfig"] = {"url": _url(hook["clientConfig"]["service"]["path"]), "caBundle": ca}
                kept.append(hook)
        doc["webhooks"] = kept
        hooks.append(doc)
    return crds, hooks


def _config(cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{HEALTH_PORT}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": WEBHOOK_PORT, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["batch/job"],
                         "externalFrameworks": [f"{c.KIND}.{c.VERSION}.{c.GROUP}"]},
    }


def install(cluster: ControlPlane, timeout: float = 120) -> None:
    """CRDs, the manager (waits for its /readyz), then its webhooks; idempotent per cluster."""
    d = kueue_dir()
    pki = cluster.pki
    ca = base64.b64encode(pki.ca_crt.read_bytes()).decode()
    crds, hooks = _manifests(d, ca)
    for crd in crds:  # too large for client-side apply's annotation
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd))
    names = [f"crd/{crd['metadata']['name']}" for crd in crds]
    # (kubectl wait fails outright on a CRD whose status has no conditions yet: retry it)
    wait_for(lambda: cluster.kubectl("wait", "--for=condition=Established", "--timeout=10s", *names,
                                     check=False, timeout=30).returncode == 0, 90, "Kueue's CRDs established")
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    cert_dir = cluster.dir / "kueue"
    cert_dir.mkdir(exist_ok=True)
    crt, key = pki.issue("kueue-webhook", "kueue-webhook", server=True, client=False, dns=("localhost",),
                         ips=("127.0.0.1",))
    (cert_dir / "tls.crt").write_bytes(crt.read_bytes())
    (cert_dir / "tls.key").write_bytes(key.read_bytes())
    client_crt, client_key = pki.issue("kueue", "kueue-controller-manager", ("system:masters",))
    kubeconfig = cert_dir / "kubeconfig"
    cluster.write_kubeconfig(kubeconfig, "kueue", client_crt, client_key)
    config = cert_dir / "config.yaml"
    config.write_text(yaml.safe_dump(_config(cert_dir)))
    # Without its own cert management the manager reads a metrics certificate from the fixed path
    # /etc/kueue/metrics/certs: give it one in a private mount namespace (an overlay on /etc whose upper
    # layer holds it), so the host's /etc is left untouched.
    upper, work = cert_dir / "etc-upper", cert_dir / "etc-work"
    certs = upper / "kueue" / "metrics" / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    (certs / "tls.crt").write_bytes(crt.read_bytes())
    (certs / "tls.key").write_bytes(key.read_bytes())
    script = (f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc && "
              f'exec {d / "kueue"} "$@"')
    cluster.start_component("kueue", Path("/usr/bin/unshare"), [
        "--mount", "--propagation", "private", "sh", "-c", script, "kueue",
        f"--config={config}", f"--kubeconfig={kubeconfig}", "--zap-log-level=2",
        "--feature-gates=VisibilityOnDemand=false"])  # its API server wants certs at /visibility; unused

    def ready() -> bool:
        cluster.check_alive()
        try:
            get = lambda: urllib.request.urlopen(f"http://127.0.0.1:{HEALTH_PORT}/readyz", timeout=2).status  # noqa: E731
            return bool(cluster.in_netns(get) == 200)
        except OSError:
            return False

    wait_for(ready, timeout, "kueue /readyz")
    for hook in hooks:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(hook))


def stop(cluster: ControlPlane) -> None:
    """Stop the manager (its CRDs and objects stay; nothing else in the cluster depends on it)."""
    for name in ("kueue-mutating-webhook-configuration", "kueue-validating-webhook-configuration"):
        kind = "mutatingwebhookconfiguration" if "mutating" in name else "validatingwebhookconfiguration"
        cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
    comp = cluster.components.pop("kueue", None)
    if comp is not None and comp.proc.poll() is None:
        comp.proc.terminate()
        comp.proc.wait(timeout=30)


def queues(cluster: ControlPlane, namespace: str, gpus: int = 4) -> None:
    """A flavor for the training pool, a ClusterQueue with `gpus` nvidia.com/gpu (preempting lower
    priority within it), the priority classes and two LocalQueues in `namespace`."""
    objects: list[dict[str, Any]] = [
        {"apiVersion": c.KUEUE_API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR},
         "spec": {"nodeLabels": {"pool": "train"}}},
        {"apiVersion": c.KUEUE_API_VERSION, "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["cpu", "memory", c.GPU_RESOURCE], "flavors": [
                      {"name": FLAVOR, "resources": [{"name": "cpu", "nominalQuota": "64"},
                                                     {"name": "memory", "nominalQuota": "256Gi"},
                                                     {"name": c.GPU_RESOURCE, "nominalQuota": gpus}]}]}]}},
        *({"apiVersion": c.KUEUE_API_VERSION, "kind": "WorkloadPriorityClass", "metadata": {"name": name},
           "value": value} for name, value in PRIORITIES.items()),
        *({"apiVersion": c.KUEUE_API_VERSION, "kind": "LocalQueue", "metadata": {"name": q, "namespace": namespace},
           "spec": {"clusterQueue": CLUSTER_QUEUE}} for q in QUEUES),
    ]
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    # the webhook server may take a moment after /readyz to serve every path
    wait_for(lambda: cluster.kubectl("apply", "-f", "-", input=body, check=False).returncode == 0, 60,
             "Kueue's queues applied (webhooks answering)")


def workloads(cluster: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "json")
    return list(json.loads(out.stdout)["items"])
