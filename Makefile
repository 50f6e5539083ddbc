# resilient-training: every target sets up what it needs (venv, binaries) itself.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)
PYTEST_ARGS ?=
SCALE_ARGS ?= --nodes 100 --jobs 100 --workers 8 --kill 10

.PHONY: demo help venv binaries lint test test-unit test-cluster test-kind chart bench bench-scale clean

# The demo builds only what its substrate needs: the control plane (and helm) here, beside the venv's install
# (CPU-bound Go build next to a network-bound pip download); e2e.demo builds what --real-nodes adds itself.
demo: ## The demo: a training job survives a node loss on a local cluster (DEMO_ARGS=--keep|--kind|--real-nodes)
	@mkdir -p .test-logs; echo ">> building (or reusing) the control plane beside the venv (log: .test-logs/demo-build.log)"
	@bash hack/k8s/build.sh >.test-logs/demo-build.log 2>&1 & build=$$!; \
	  $(MAKE) --no-print-directory venv || { kill $$build; exit 1; }; \
	  wait $$build || { tail -20 .test-logs/demo-build.log; exit 1; }
	$(PY) -m e2e.demo $(DEMO_ARGS)

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

venv: $(STAMP) ## Create .venv and install the project with its dev extras (torch, kopf, pytest, ruff)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo ">> installing the project and its dev extras into $(VENV) (torch is a few GB on a cold machine)"
	$(VENV)/bin/pip install --progress-bar off -q --upgrade pip
	$(VENV)/bin/pip install --progress-bar off -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

binaries: ## Build (or reuse from ~/.cache) etcd, kube-apiserver/-controller-manager/-scheduler, kubectl, helm, kwok, kueue, seaweedfs, kubelet/kube-proxy/CoreDNS
	bash hack/k8s/build.sh
	bash hack/realnodes/build.sh
	bash hack/kwok/build.sh
	bash hack/kueue/build.sh
	bash hack/seaweedfs/build.sh

lint: venv ## ruff, the layer contracts (import-linter, .importlinter) and mypy (strict on the core and the contracts)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

test-unit: venv ## The tests that need no cluster: decision core, CRD, contracts, trainer
	$(PY) -m pytest -m "not cluster" $(PYTEST_ARGS)

test-cluster: venv binaries ## The tests against the local Kubernetes control plane
	$(PY) -m pytest -m cluster $(PYTEST_ARGS)

test: ## Everything CI runs: the venv, the Go builds, the images and lint side by side, then every test in two lanes
	bash hack/test_lanes.sh $(PY) $(PYTEST_ARGS)

test-kind: venv binaries ## The kind lane alone (also in make test): dockerd (docker.io) in a netns, a node image from our binaries (root)
	$(PY) -m pytest e2e/tests/test_kind_lane.py -p no:cacheprovider $(PYTEST_ARGS)

chart: venv binaries ## Render, lint and validate the Helm chart (kubernetes-validate, helm lint)
	$(PY) -m pytest tests/chart $(PYTEST_ARGS)

bench: venv ## Print the benchmark tables (checkpoint discovery, checkpoint save/load)
	$(PY) bench/discovery_bench.py
	$(PY) bench/checkpoint_bench.py

bench-scale: venv binaries ## The KWOK scale benchmark (SCALE_ARGS="--nodes 1000 --jobs 2000 --workers 8 --kill 100 --timeout 2700")
	$(PY) bench/scale_bench.py --substrate kwok $(SCALE_ARGS)

clean: ## Remove the venv and caches in the tree (the binary cache in ~/.cache stays)
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
