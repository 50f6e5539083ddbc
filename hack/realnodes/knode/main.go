// Command knode is a multi-call binary holding kubelet and kube-proxy: the two
// node components linked once, as hack/k8s/kube does for the control plane, so
// a cold build on a 2-core machine pays for one link. It dispatches on the
// basename of argv[0] (symlinks) or on its first argument.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	name := filepath.Base(os.Args[0])
	if name != "kubelet" && name != "kube-proxy" && len(os.Args) > 1 {
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	switch name {
	case "kubelet":
		os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
	case "kube-proxy":
		os.Exit(cli.Run(proxy.NewProxyCommand()))
	default:
		fmt.Fprintf(os.Stderr, "knode: unknown component %q; call as kubelet or kube-proxy\n", name)
		os.Exit(2)
	}
}
