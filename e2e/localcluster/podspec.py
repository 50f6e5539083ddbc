"""What a kubelet reads out of a pod spec: environment, command line, volume contents, identity, DNS.

Pure functions of the pod, the node's facts and the objects the pod references (ConfigMaps, Secrets,
ServiceAccount tokens), fetched beforehand by the caller. Nothing here touches the API, the network or
the disk, so the rules (downward API, `$(VAR)` expansion, `command`/`args` against the image, optional
references) are unit-tested without root or a cluster (e2e/tests/test_podspec.py).
"""

from __future__ import annotations

import base64
import ipaddress
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# (resource, name): ("configmaps", "cfg") or ("secrets", "creds"); the value None means "not found".
ObjectRef = tuple[str, str]
Objects = Mapping[ObjectRef, "dict[str, Any] | None"]
# (audience, expirationSeconds) of a projected ServiceAccount token; the value is the token.
TokenKey = tuple["str | None", int]

DEFAULT_TOKEN_SECONDS = 3607  # what admission writes into the kube-api-access volume
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class MissingReference(RuntimeError):
    """A ConfigMap, Secret or key the container needs does not exist (CreateContainerConfigError)."""


class NoEntrypoint(RuntimeError):
    """Neither `command` nor a mapped image says what to run (ErrImagePull: images do not exist here)."""


@dataclass(frozen=True)
class PodContext:
    """The pod and the node-side facts a kubelet fills in (downward API, service environment)."""

    pod: dict[str, Any]
    node: str
    pod_ip: str
    host_ip: str
    api_host: str
    api_port: int
    python_bin_dir: str
    image_entrypoints: Mapping[str, Any]

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def hostname(self) -> str:
        """spec.hostname or the pod's name, at most 63 characters."""
        return str(self.pod["spec"].get("hostname") or self.name)[:63]


# ------------------------------------------------------------------ references
def _ref_name(ref: Mapping[str, Any]) -> str:
    return str(ref.get("name") or ref.get("secretName"))


def _source_ref(src: Mapping[str, Any]) -> ObjectRef | None:
    """The object a configMap/secret volume (or projected) source names."""
    if "configMap" in src:
        return "configmaps", _ref_name(src["configMap"])
    if "secret" in src:
        return "secrets", _ref_name(src["secret"])
    return None


def container_references(c: Mapping[str, Any]) -> set[ObjectRef]:
    """ConfigMaps and Secrets a container's env/envFrom read."""
    refs: set[ObjectRef] = set()
    for src in c.get("envFrom") or []:
        if "configMapRef" in src:
            refs.add(("configmaps", src["configMapRef"]["name"]))
        elif "secretRef" in src:
            refs.add(("secrets", src["secretRef"]["name"]))
    for e in c.get("env") or []:
        vf = e.get("valueFrom") or {}
        if "configMapKeyRef" in vf:
            refs.add(("configmaps", vf["configMapKeyRef"]["name"]))
        elif "secretKeyRef" in vf:
            refs.add(("secrets", vf["secretKeyRef"]["name"]))
    return refs


def volume_references(vol: Mapping[str, Any]) -> set[ObjectRef]:
    """ConfigMaps and Secrets a volume (directly or projected) reads."""
    sources = (vol["projected"].get("sources") or []) if "projected" in vol else [vol]
    return {ref for src in sources if (ref := _source_ref(src)) is not None}


def token_requests(vol: Mapping[str, Any]) -> set[TokenKey]:
    """The bound ServiceAccount tokens a projected volume asks for."""
    out: set[TokenKey] = set()
    for src in (vol.get("projected") or {}).get("sources") or []:
        if "serviceAccountToken" in src:
            sat = src["serviceAccountToken"]
            out.add((sat.get("audience"), int(sat.get("expirationSeconds", DEFAULT_TOKEN_SECONDS))))
    return out


def source_data(src: Mapping[str, Any], objects: Objects) -> dict[str, bytes | str]:
    """Files of a configMap/secret source (Secret values decoded), honouring `items` and `optional`."""
    kind = "configMap" if "configMap" in src else "secret"
    ref = src[kind]
    key = _source_ref(src)
    assert key is not None
    obj = objects.get(key)
    if obj is None:
        if ref.get("optional"):
            return {}
        raise MissingReference(f'{key[0]} "{key[1]}" not found')
    data: dict[str, bytes | str] = dict(obj.get("data") or {})
    if kind == "secret":
        data = {k: base64.b64decode(v) for k, v in data.items()}
    if ref.get("items"):
        return {i["path"]: data[i["key"]] for i in ref["items"] if i["key"] in data}
    return data


# ------------------------------------------------------------------ downward API and environment
def field_value(ctx: PodContext, path: str) -> str:
    """A downward-API fieldRef value."""
    meta, spec = ctx.pod["metadata"], ctx.pod["spec"]
    simple = {
        "metadata.name": ctx.name, "metadata.namespace": ctx.namespace, "metadata.uid": meta["uid"],
        "spec.nodeName": ctx.node, "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": ctx.pod_ip, "status.podIPs": ctx.pod_ip, "status.hostIP": ctx.host_ip,
        "status.hostIPs": ctx.host_ip,
    }
    if path in simple:
        return str(simple[path])
    for prefix, key in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path == prefix:
            return "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get(key) or {}).items()))
        if path.startswith(prefix + "['"):
            return str((meta.get(key) or {}).get(path[len(prefix) + 2:-2], ""))
    raise RuntimeError(f"unsupported fieldRef {path}")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: unknown names stay as written, `$$` escapes."""
    out, i = [], 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
        elif value.startswith("$(", i) and ")" in value[i:]:
            j = value.index(")", i)
            out.append(env.get(value[i + 2:j], value[i:j + 1]))
            i = j + 1
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def container_env(ctx: PodContext, c: Mapping[str, Any], objects: Objects) -> dict[str, str]:
    """The container's environment as the runtime and kubelet build it: the image's ENV, service variables,
    envFrom, then env in order (PATH is always the project venv's: it stands in for the image's filesystem)."""
    img = image_defaults(c.get("image", ""), ctx.image_entrypoints) or {}
    env = {
        **img.get("env", {}),
        "PATH": f"{ctx.python_bin_dir}:{PATH}", "HOME": "/root", "HOSTNAME": ctx.hostname,
        "KUBERNETES_SERVICE_HOST": ctx.api_host, "KUBERNETES_SERVICE_PORT": str(ctx.api_port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(ctx.api_port),
        "KUBERNETES_PORT": f"tcp://{ctx.api_host}:{ctx.api_port}",
    }
    for src in c.get("envFrom") or []:
        prefix = src.get("prefix", "")
        source = ({"configMap": src["configMapRef"]} if "configMapRef" in src
                  else {"secret": {"secretName": src["secretRef"]["name"],
                                   "optional": src["secretRef"].get("optional")}})
        for key, data in source_data(source, objects).items():
            env[prefix + key] = data.decode() if isinstance(data, bytes) else data
    for e in c.get("env") or []:
        if "value" in e or "valueFrom" not in e:
            env[e["name"]] = expand(e.get("value", ""), env)
            continue
        vf = e["valueFrom"]
        if "fieldRef" in vf:
            env[e["name"]] = field_value(ctx, vf["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in vf:
            kind, _, rname = vf["resourceFieldRef"]["resource"].partition(".")
            env[e["name"]] = str((c.get("resources") or {}).get(kind, {}).get(rname, "0"))
        else:
            key_ref = "configMapKeyRef" if "configMapKeyRef" in vf else "secretKeyRef"
            ref = vf[key_ref]
            res = "configmaps" if key_ref == "configMapKeyRef" else "secrets"
            obj = objects.get((res, ref["name"]))
            val = ((obj or {}).get("data") or {}).get(ref["key"])
            if val is None:
                if not ref.get("optional"):
                    raise MissingReference(f'{res} "{ref["name"]}": key {ref["key"]!r} not found')
                continue
            env[e["name"]] = base64.b64decode(val).decode() if res == "secrets" else val
    return env


# ------------------------------------------------------------------ image and command line
def image_defaults(image: str, table: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the image would supply (the longest image-name substring in `table` wins), or None."""
    matches = [k for k in table if k in image]
    if not matches:
        return None
    value = table[max(matches, key=len)]
    return {"command": value} if isinstance(value, list) else dict(value)


def container_argv(c: Mapping[str, Any], env: Mapping[str, str], table: Mapping[str, Any]) -> list[str]:
    """Kubernetes' rule: `command` replaces ENTRYPOINT (and drops CMD); `args` replaces CMD."""
    command, args = c.get("command"), c.get("args")
    if command:
        argv = [*command, *(args or [])]
    else:
        img = image_defaults(c.get("image", ""), table)
        if not img or not img.get("command"):
            raise NoEntrypoint(f"image {c.get('image')!r} has no local entrypoint mapping and no command")
        argv = [*img["command"], *(args if args is not None else img.get("args") or [])]
    return [expand(a, env) for a in argv]


def security_context(pod: Mapping[str, Any], c: Mapping[str, Any], table: Mapping[str, Any], *,
                     keep: Iterable[str], expose: Iterable[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The launcher's user/groups and read-only root, and the env it implies (HOME for a bare uid).

    `keep`: paths a volume mounted over an ancestor must not hide (the project and venv stand in for
    the image's filesystem); `expose`: what a non-root user needs to see under /root (the interpreter).
    """
    psc = pod["spec"].get("securityContext") or {}
    csc = c.get("securityContext") or {}
    out: dict[str, Any] = {"readOnlyRootFilesystem": bool(csc.get("readOnlyRootFilesystem")),
                           "keep": sorted(set(keep))}
    env: dict[str, str] = {}
    img = image_defaults(c.get("image", ""), table) or {}
    # Unset means the image's USER (from the image map; root for unmapped images).
    uid = csc.get("runAsUser", psc.get("runAsUser", img.get("user", 0)))
    if uid:
        groups = [*(psc.get("supplementalGroups") or []), *([psc["fsGroup"]] if "fsGroup" in psc else [])]
        gid = csc.get("runAsGroup", psc.get("runAsGroup", img.get("group", 0)))
        out["user"] = {"uid": int(uid), "gid": int(gid), "groups": sorted({int(g) for g in groups})}
        out["expose"] = list(expose)
        if "HOME" not in {e["name"] for e in c.get("env") or []}:
            env["HOME"] = "/"  # what runtimes set for a uid without a passwd entry
    return out, env


# ------------------------------------------------------------------ volumes
def volume_kind(vol: Mapping[str, Any]) -> str:
    """emptyDir, hostPath, persistentVolumeClaim, or files (configMap/secret/downwardAPI/projected)."""
    for kind in ("emptyDir", "hostPath", "persistentVolumeClaim"):
        if kind in vol:
            return kind
    if any(k in vol for k in ("configMap", "secret", "downwardAPI", "projected")):
        return "files"
    raise RuntimeError(f"volume {vol['name']}: unsupported source {sorted(vol)}")


def pv_host_path(pv: Mapping[str, Any]) -> str:
    """The directory a hostPath or local PersistentVolume stands for."""
    path = (pv["spec"].get("hostPath") or pv["spec"].get("local") or {}).get("path")
    if not path:
        raise RuntimeError(f"PV {pv['metadata']['name']} has no hostPath/local path")
    return str(path)


def volume_files(ctx: PodContext, vol: Mapping[str, Any], objects: Objects,
                 tokens: Mapping[TokenKey, str]) -> dict[str, bytes]:
    """The files of a configMap, secret, downwardAPI or projected volume, by relative path."""
    files: dict[str, bytes | str] = {}
    if "configMap" in vol or "secret" in vol:
        files = source_data(vol, objects)
    elif "downwardAPI" in vol:
        for item in vol["downwardAPI"].get("items") or []:
            files[item["path"]] = field_value(ctx, item.get("fieldRef", {}).get("fieldPath", ""))
    else:
        for src in vol["projected"].get("sources") or []:
            if "serviceAccountToken" in src:
                sat = src["serviceAccountToken"]
                key = (sat.get("audience"), int(sat.get("expirationSeconds", DEFAULT_TOKEN_SECONDS)))
                files[sat["path"]] = tokens[key]
            elif "downwardAPI" in src:
                for item in src["downwardAPI"].get("items") or []:
                    files[item["path"]] = field_value(ctx, item.get("fieldRef", {}).get("fieldPath", ""))
            else:
                files.update(source_data(src, objects))
    return {rel: data if isinstance(data, bytes) else data.encode() for rel, data in files.items()}


# ------------------------------------------------------------------ names and addresses
def hosts_file(ctx: PodContext, records: Iterable[str]) -> str:
    """The pod's /etc/hosts: itself, the API server's service names, then headless-Service records."""
    names = [ctx.hostname]
    if ctx.pod["spec"].get("subdomain"):
        names.insert(0, f"{ctx.hostname}.{ctx.pod['spec']['subdomain']}.{ctx.namespace}.svc.cluster.local")
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             f"{ctx.pod_ip}\t{' '.join(names)}",
             f"{ctx.api_host}\tkubernetes kubernetes.default kubernetes.default.svc "
             "kubernetes.default.svc.cluster.local", *records]
    return "\n".join(lines) + "\n"


def resolv_conf(namespace: str) -> str:
    """No DNS server: names resolve from /etc/hosts; other lookups fail fast on the pod's lo."""
    search = f"{namespace}.svc.cluster.local svc.cluster.local cluster.local"
    return f"search {search}\nnameserver 127.0.0.1\noptions ndots:5 timeout:1 attempts:1\n"


def dns_records(pods: Iterable[Mapping[str, Any]], services: Iterable[Mapping[str, Any]], ns: str) -> list[str]:
    """/etc/hosts lines for headless-Service pod names (`<hostname>.<subdomain>...`), as CoreDNS serves them
    to a pod in namespace `ns`: only pods with an IP that are Ready (or `publishNotReadyAddresses`)."""
    headless = {}
    for svc in services:
        spec = svc.get("spec") or {}
        if spec.get("clusterIP") == "None":
            headless[(svc["metadata"]["namespace"], svc["metadata"]["name"])] = spec
    lines = []
    for pod in pods:
        pns, name, sub, hostname, ip, ready, deleting = dns_fields(pod)
        if not sub or not ip or (pns, sub) not in headless:
            continue
        svc = headless[(pns, sub)]
        if deleting or not (ready or svc.get("publishNotReadyAddresses")):
            continue
        host = hostname or name
        names = [f"{host}.{sub}.{pns}.svc.cluster.local", f"{host}.{sub}.{pns}.svc", f"{host}.{sub}.{pns}"]
        if pns == ns:
            names.append(f"{host}.{sub}")
        lines.append(f"{ip}\t{' '.join(names)}")
    return lines


def dns_fields(pod: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """All of a pod that `dns_records` reads: a change to anything else (labels, annotations, most of the
    status) changes no pod's /etc/hosts, so the node agents need not rewrite them for it."""
    if pod is None:
        return ()
    meta, spec, st = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
    return (meta["namespace"], meta["name"], spec.get("subdomain"), spec.get("hostname"), st.get("podIP"), ready,
            bool(meta.get("deletionTimestamp")))


def node_pod_ips(subnet: int, index: int) -> list[str]:
    """Pod addresses node `index` may hand out: `10.<subnet>.<index>.2..254` (.1 is the node)."""
    net = ipaddress.ip_network(f"10.{subnet}.{index}.0/24")
    return [str(h) for h in net.hosts()][1:]


def pick_pod_ip(pod: Mapping[str, Any], mine: list[str], used: set[str | None]) -> str:
    """The pod's reported IP after a reboot (if it is this node's), else a free one starting at a place its uid
    picks. Not the first free one: every pod on one flat /16, a new pod given a just-freed address keeps it
    unreachable from any namespace whose neighbour entry still names the old pod's MAC (5 s of DELAY and 3 s of
    probes, ~8 s, as measured), and real IPAM (host-local) does not hand an address straight back either."""
    prev = (pod.get("status") or {}).get("podIP")
    if prev in mine:
        return str(prev)
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    start = zlib.crc32(uid.encode()) % len(mine) if mine else 0
    for candidate in mine[start:] + mine[:start]:
        if candidate not in used:
            return candidate
    raise RuntimeError("node out of pod IPs")


# ------------------------------------------------------------------ lifecycle rules
def should_restart(policy: str, code: int) -> bool:
    """restartPolicy decision for an exited regular container."""
    return policy == "Always" or (policy == "OnFailure" and code != 0)


def exit_code(returncode: int) -> int:
    """Killed by signal N -> 128+N, as container runtimes report it."""
    return 128 - returncode if returncode < 0 else returncode


def probe_port(probe: Mapping[str, Any], c: Mapping[str, Any]) -> int:
    """An httpGet/tcpSocket probe's port; a name resolves through the container's ports."""
    port = (probe.get("httpGet") or probe.get("tcpSocket") or {}).get("port")
    if isinstance(port, str):
        port = next((cp["containerPort"] for cp in c.get("ports") or [] if cp.get("name") == port), 0)
    return int(port or 0)
