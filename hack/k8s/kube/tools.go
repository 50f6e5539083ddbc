//go:build tools

// Package main records helm as a dependency of this module so that
// `go build helm.sh/helm/v3/cmd/helm` builds it from the same module graph
// (and the same compiled packages) as the control plane.
package main

import _ "helm.sh/helm/v3/cmd/helm"
