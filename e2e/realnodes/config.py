"""The configuration files of a real node and the cluster add-ons, as pure functions of their inputs.

Every path a file names lives under the cluster's directory, every address inside the cluster's network
namespace (e2e/controlplane/network.py): node i has InternalIP `10.100.<i>.1` on the cluster bridge and
pod CIDR `10.244.<i>.0/24` on a bridge `cni<i>` of its own, both in that namespace, so routes between
the nodes' pods are the namespace's connected routes and nothing reaches the host's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

POD_SUPERNET = "10.244.0.0/16"
CLUSTER_DOMAIN = "cluster.local"
COREDNS_HEALTH_PORT, COREDNS_READY_PORT = 8089, 8181
KUBE_PROXY_HEALTH_PORT, KUBE_PROXY_METRICS_PORT = 10256, 10249
KUBELET_PORT, KUBELET_HEALTHZ_PORT = 10250, 10248
# What the kubelet wants these global sysctls to be (pkg/kubelet/cm setupKernelTunables); a node's mount
# namespace shows it files with these values over /proc/sys, so it never writes the host's.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10", "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000", "kernel/keys/root_maxbytes": "25000000",
}


def pod_cidr(index: int) -> str:
    """Node `index`'s pods: a /24 of the pod supernet."""
    if not 1 <= index <= 250:
        raise ValueError(f"node index {index} outside 1..250")
    return f"10.244.{index}.0/24"


def cni_bridge(index: int) -> str:
    """Node `index`'s CNI bridge (in the cluster namespace, beside the control plane's bridge)."""
    return f"cni{index}"


def containerd_config(node_dir: Path, sandbox_image: str, cni_conf_dir: Path, cni_bin_dir: str = "/usr/lib/cni",
                      runc: str = "/usr/sbin/runc", snapshotter: str = "overlayfs") -> str:
    """containerd 1.6 config (version 2): its own root, state and socket; runc with cgroupfs.

    `restrict_oom_score_adj`: without CAP_SYS_RESOURCE runc fails to lower a container's oom_score_adj.
    """
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{node_dir / 'containerd' / 'root'}"
state = "{node_dir / 'containerd' / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{node_dir / 'containerd.sock'}"

[ttrpc]
  address = "{node_dir / 'containerd.ttrpc.sock'}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{node_dir / 'containerd' / 'opt'}"

[{cri}]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.containerd]
  snapshotter = "{snapshotter}"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{cni_bin_dir}"
  conf_dir = "{cni_conf_dir}"
  max_conf_num = 1
"""


def cni_conflist(index: int, ipam_dir: Path) -> dict[str, Any]:
    """bridge + host-local on node `index`'s pod CIDR (containerd adds loopback itself).

    `isGateway` turns on ip_forward in the namespace the plugin runs in: the cluster's, never the host's.
    No masquerade: there is nowhere outside to masquerade to.
    """
    cidr = pod_cidr(index)
    return {"cniVersion": "1.0.0", "name": "rtj", "plugins": [{
        "type": "bridge", "bridge": cni_bridge(index), "isGateway": True, "ipMasq": False, "hairpinMode": True,
        "ipam": {"type": "host-local", "dataDir": str(ipam_dir),
                 "ranges": [[{"subnet": cidr, "gateway": cidr.replace(".0/24", ".1")}]],
                 "routes": [{"dst": "0.0.0.0/0"}]},
    }]}


def kubelet_config(*, address: str, cgroup_root: str, runtime_socket: Path, ca_crt: Path, serving_crt: Path,
                   serving_key: Path, cluster_dns: str, max_pods: int,
                   taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """KubeletConfiguration for a node that shares a host (and its kernel) with others.

    cgroupfs under a cgroup root of its own, cgroup v1 allowed (this host is v1 hybrid), no iptables
    chains and no global sysctls touched (see KUBELET_SYSCTLS); a 4 s lease (renewed each second) so a
    dead kubelet is noticed within the controller-manager's grace period; thresholds that never evict
    because a shared CI disk happens to be fuller than a real node's.
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": address, "port": KUBELET_PORT, "readOnlyPort": 0,
        "healthzBindAddress": address, "healthzPort": KUBELET_HEALTHZ_PORT,
        "tlsCertFile": str(serving_crt), "tlsPrivateKeyFile": str(serving_key),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca_crt)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "cgroupDriver": "cgroupfs", "cgroupRoot": cgroup_root, "cgroupsPerQOS": True,
        "failCgroupV1": False, "failSwapOn": False, "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False,
        "nodeLeaseDurationSeconds": 4, "nodeStatusUpdateFrequency": "1s", "nodeStatusReportFrequency": "10s",
        "clusterDNS": [cluster_dns], "clusterDomain": CLUSTER_DOMAIN, "resolvConf": "",
        "maxPods": max_pods, "serializeImagePulls": False,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "registerWithTaints": taints or [],
        "syncFrequency": "5s", "fileCheckFrequency": "5s",
    }


def corefile(bind: str, kubeconfig: Path) -> str:
    """Cluster DNS for `cluster.local` only (nothing to forward to); health and ready on the namespace's lo."""
    return f""".:53 {{
    bind {bind}
    errors
    health 127.0.0.1:{COREDNS_HEALTH_PORT}
    ready 127.0.0.1:{COREDNS_READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
"""


def kube_proxy_config(kubeconfig: Path, bind: str, node: str) -> dict[str, Any]:
    """iptables mode inside the cluster namespace; conntrack and the global sysctls left as they are.

    One kube-proxy serves every node (they share the namespace); it is named after `node` (an existing
    Node: kube-proxy waits 30 s at start for its Node), which only matters for node-local traffic policies.

    `masqueradeAll`: a pod reaching a ClusterIP backed by a pod on its own bridge gets the reply back
    through the proxy's NAT without br_netfilter (a host-wide module setting we must not change).
    """
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables", "bindAddress": bind, "clusterCIDR": POD_SUPERNET,
        "hostnameOverride": node,
        "healthzBindAddress": f"127.0.0.1:{KUBE_PROXY_HEALTH_PORT}",
        "metricsBindAddress": f"127.0.0.1:{KUBE_PROXY_METRICS_PORT}",
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
                      "udpTimeout": "0s", "udpStreamTimeout": "0s"},
        "iptables": {"masqueradeAll": True, "syncPeriod": "30s", "minSyncPeriod": "0s"},
        "oomScoreAdj": 0,
    }


def to_json(obj: dict[str, Any]) -> str:
    """YAML is a superset of JSON: the components read these as their config files."""
    return json.dumps(obj, indent=2)
