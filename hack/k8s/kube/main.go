// Command kube is a multi-call binary holding etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and kubectl. Linking the control
// plane once (instead of five ~100 MB links) is what makes a cold build fit
// on a 2-core CI machine. It dispatches on the basename of argv[0]
// (symlinks), or on its first argument: `kube kube-apiserver --help`.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	_ "time/tzdata" // for CronJob time zone support, as upstream mains do

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl auth plugins, as upstream
)

var names = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

func main() {
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
	if !known(name) && len(os.Args) > 1 && known(os.Args[1]) {
		// `kube <component> args...`: shift so the component sees its own argv.
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	switch name {
	case "etcd":
		etcdmain.Main(os.Args)
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubectl":
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) //nolint:errcheck
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
	default:
		fmt.Fprintf(os.Stderr, "kube: unknown component %q; call as one of %v (symlink or first argument)\n", name, names)
		os.Exit(2)
	}
}

func known(n string) bool {
	for _, k := range names {
		if k == n {
			return true
		}
	}
	return false
}
