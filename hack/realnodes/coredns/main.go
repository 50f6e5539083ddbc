// Command coredns is CoreDNS with only the plugins cluster DNS needs here
// (no cloud backends, no upstream forwarding: nothing outside the cluster's
// network namespace is reachable anyway), which keeps the cold build small.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// keep lists the plugins linked above; the Corefile may name no others.
var keep = map[string]bool{
	"bind": true, "cache": true, "errors": true, "health": true,
	"kubernetes": true, "log": true, "ready": true,
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
