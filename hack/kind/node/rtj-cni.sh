#!/bin/bash
# rtj-cni: what kindnetd does for kind's default CNI, as a node service of the locally built node image
# (kindnetd's image cannot be pulled here): once the control plane gives this node a podCIDR, write a bridge
# CNI config for it; then keep a route to every other node's podCIDR via that node's address.
set -u
KC=/etc/kubernetes/kubelet.conf
NODE="$(hostname)"
kc() { kubectl --kubeconfig="$KC" --request-timeout=5s "$@"; }
cidr=""
until [[ -n "$cidr" ]]; do
  sleep 1
  [[ -s "$KC" ]] && cidr="$(kc get node "$NODE" -o jsonpath='{.spec.podCIDR}' 2>/dev/null)"
done
mkdir -p /etc/cni/net.d
cat > /etc/cni/net.d/.10-rtj.conflist <<CONF
{"cniVersion": "0.4.0", "name": "rtj", "plugins": [
  {"type": "bridge", "bridge": "rtj0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
CONF
mv /etc/cni/net.d/.10-rtj.conflist /etc/cni/net.d/10-rtj.conflist
echo "rtj-cni: $NODE has $cidr"
# Nodes join in the first minute: look often then, rarely after.
for i in $(seq 1 100000); do
  kc get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}' \
    2>/dev/null | while read -r name podcidr ip; do
      [[ "$name" == "$NODE" || -z "$podcidr" || -z "$ip" ]] || ip route replace "$podcidr" via "$ip"
    done
  if ((i < 60)); then sleep 2; else sleep 20; fi
done
