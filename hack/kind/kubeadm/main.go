// Command kubeadm is Kubernetes' own cmd/kubeadm main, built in a wrapper module (hack/lib.sh's
// rtj_k8s_wrapper_module) because `go install k8s.io/kubernetes/...` refuses its replace directives.
package main

import (
	"k8s.io/kubernetes/cmd/kubeadm/app"
	utilerrors "k8s.io/kubernetes/cmd/kubeadm/app/util/errors"
)

func main() {
	utilerrors.HandleError(app.Run())
}
