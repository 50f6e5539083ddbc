"""End-to-end test substrate: a real Kubernetes control plane with simulated nodes (see e2e/README.md)."""
