// Command coredns is CoreDNS with the plugins kubeadm's default Corefile names (errors, health, ready,
// kubernetes, prometheus, forward, cache, loop, reload, loadbalance): kind's CoreDNS Deployment runs it
// unchanged. hack/realnodes/coredns links fewer (its nodes get a Corefile of our own).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

var keep = map[string]bool{
	"cache": true, "errors": true, "forward": true, "health": true, "kubernetes": true, "loadbalance": true,
	"log": true, "loop": true, "prometheus": true, "ready": true, "reload": true,
}

func init() {
	// Upstream's order, restricted to the linked plugins (the order decides the chain).
	var ds []string
	for _, d := range dnsserver.Directives {
		if keep[d] {
			ds = append(ds, d)
		}
	}
	dnsserver.Directives = ds
}

func main() {
	coremain.Run()
}
