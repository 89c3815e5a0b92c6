# gpushare developer entry points. Each target creates .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CLUSTER_DIR ?= .cluster
# The one version source: pyproject.toml. The chart's version and appVersion must equal it
# (`make release` refuses otherwise).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
DIST ?= dist/$(VERSION)
# The image's OCI archive; ARCH=amd64,arm64 for both (default: this machine's architecture).
IMAGE_ARCHIVE ?= $(DIST)/gpushare-image-$(VERSION).oci.tar
ARCH ?=

.PHONY: demo test unit native e2e e2e-oldest soak lint typecheck controlplane autoscalers cluster cluster-down bench sizing replay plugin-requests image image-in-docker image-archive release release-dryrun clean

$(STAMP): pyproject.toml constraints.txt packaging/gpushare_build.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip==26.3
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpushare demo

lint: $(STAMP)
	$(BIN)/ruff check src tests harness benchmarks packaging
	$(BIN)/ruff format --check src tests harness benchmarks packaging
	$(BIN)/lint-imports --no-cache
	$$(bash packaging/tools.sh actionlint) .github/workflows/*.yml

typecheck: $(STAMP)
	$(BIN)/mypy

# Build (once; cached under ~/.cache/gpushare by version) etcd, the Kubernetes control plane,
# kubectl, kwok, helm and the real node's containerd 2 from the Go module proxy.
# Also installs, as root, the real node's Debian packages (runc, CNI plugins, containerd 1.6).
controlplane:
	bash harness/controlplane/build.sh > /dev/null
	bash harness/node/setup.sh

# Build (once; cached under ~/.cache/gpushare like the control plane) the node autoscalers the
# autoscaling e2e tests run: cluster-autoscaler 1.36.1's kwok provider from ../shared/vendor
# (skipped, and its tests with it, without ../shared) and Karpenter v1.15.0's kwok provider from
# the Go module proxy (harness/controlplane/autoscalers.sh; cold times in docs/testing.md).
autoscalers:
	bash harness/controlplane/autoscalers.sh > /dev/null

# The native interposer (src/gpushare/isolation/native/libgpushare-cuda.so; needs gcc only).
native: $(STAMP)
	$(BIN)/python -m gpushare.isolation.build

# Unit and integration tests only (no control plane), with the interposer's CPU-side proofs.
unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit tests/integration tests/isolation

# End-to-end tests on the real control plane.
e2e: $(STAMP) controlplane autoscalers
	GPUSHARE_E2E=1 $(BIN)/python -m pytest -q tests/e2e

# The soak (docs/testing.md, "The soak"): 10,000 containers of churn on the real node with
# kubelet, containerd, device plugin and extender restarts at seeded random moments. Not part
# of `make test` or `make e2e` (the test skips without GPUSHARE_SOAK=1); 30 minutes or more.
soak: $(STAMP) controlplane
	GPUSHARE_E2E=1 GPUSHARE_SOAK=1 $(BIN)/python -m pytest -q -s tests/e2e/test_soak.py

# The oldest Kubernetes minor gpushare supports (docs/compatibility.md), built by build.sh the
# same way as the newest (its own pinned module, harness/controlplane/kubernetes-1.30), and
# the end-to-end tests that prove it on that control plane and the real node's kubelet: the
# walkthroughs, the webhook, binding, the real node's seed, cuda-sample (core_mem) and sidecar
# pods, the device plugin's node-bound token, and helm install. Cached like the newest; the
# first build takes about as long (see docs/compatibility.md for the measured times).
OLDEST_K8S ?= v1.30.14
E2E_OLDEST := tests/e2e/test_walkthrough.py tests/e2e/test_webhook.py tests/e2e/test_bind_retry.py \
	tests/e2e/test_real_node.py::test_seed_walkthrough_on_a_real_share_node \
	tests/e2e/test_real_node.py::test_cuda_sample_on_a_real_core_mem_node \
	tests/e2e/test_real_node.py::test_multi_container_init_sidecar_and_multi_gpu_pods \
	tests/e2e/test_real_forgery.py::test_finding_6_the_device_plugins_token_is_held_to_its_own_node \
	tests/e2e/test_helm.py
e2e-oldest: $(STAMP)
	K8S_VERSION=$(OLDEST_K8S) bash harness/controlplane/build.sh > /dev/null
	bash harness/node/setup.sh
	GPUSHARE_E2E=1 GPUSHARE_E2E_K8S_VERSION=$(OLDEST_K8S) $(BIN)/python -m pytest -q $(E2E_OLDEST)

# Everything: lint, types, unit, integration, GPU (skipped without one) and end-to-end, in that
# order, so the busy control plane of the e2e tests runs last. pytest's exit code 5 (no tests)
# is not a failure. The node autoscalers build (cold, about 11 minutes) in the background while
# the unit and integration tests run; the autoscaling e2e tests wait for it (autoscalers.sh
# holds a lock) and its log is autoscalers-build.log. The 30 slowest tests are listed at the end,
# so a CI log shows where its time goes.
test: $(STAMP) lint typecheck controlplane
	bash harness/controlplane/autoscalers.sh > /dev/null 2> autoscalers-build.log & \
	GPUSHARE_E2E=1 $(BIN)/python -m pytest -q --durations=30 tests/unit tests/integration tests/isolation tests/gpu tests/e2e; rc=$$?; wait; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

# A control plane with the gpushare extender and kwok, for a person with kubectl, with the seeds'
# share and core_mem GPU nodes as kwok nodes; UNIT=128MiB sets gpuMemoryUnit (default 1GiB);
# REAL_NODE=1 adds one real node (containerd, kubelet, the device plugin; needs root).
# cluster-down stops every process of CLUSTER_DIR, found by command line, and says which.
cluster: $(STAMP) controlplane
	$(BIN)/python -m harness.clusterctl up --dir $(CLUSTER_DIR) $(if $(UNIT),--unit $(UNIT)) $(if $(REAL_NODE),--real-node)

cluster-down: $(STAMP)
	$(BIN)/python -m harness.clusterctl down --dir $(CLUSTER_DIR)

# Benchmarks (not timed tests): the policy table on the shared openb traces (10 seeds, every
# gpushare variant), the same table on the built-in stress workloads (multi-GPU,
# model-restricted, CPU-heavy and mixed pods; benchmarks/stress_table.py), on multi-GPU-heavy
# mixes of the default trace (policy_table.py --mixes), the churn protocol (pods leave, the
# cluster at 95 % load; benchmarks/churn_table.py), decision speed at
# 1213 and 4852 nodes, the extender's HTTP latency, and its filter + prioritize + bind round
# trips over a real socket for binpack, fgd and gpushare (the server in its own process, served
# as `gpushare extender` serves it; every node name, then kube-scheduler's own sample of names),
# and what one Prometheus scrape of the extender costs at 1,000 and 5,000 nodes.
bench: $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[bench]'
	$(BIN)/python benchmarks/policy_table.py
	$(BIN)/python benchmarks/stress_table.py
	$(BIN)/python benchmarks/policy_table.py --mixes
	$(BIN)/python benchmarks/noise_floor.py
	$(BIN)/python benchmarks/churn_table.py
	$(BIN)/python benchmarks/lp_bound.py
	$(BIN)/python benchmarks/decision_speed.py
	$(BIN)/python benchmarks/extender_latency.py
	$(BIN)/python benchmarks/filter_cpu.py
	$(BIN)/python benchmarks/scrape_cost.py
	$(BIN)/python benchmarks/extender_http_speed.py --names all
	$(BIN)/python benchmarks/extender_http_speed.py --names sample

# The extender's memory and filter latency at 1,000 and 5,000 kwok nodes with 10,000 and
# 50,000 pods, half of them GPU pods, on the real control plane (benchmarks/sizing.py; the
# sizing table of docs/operations.md comes from it). Not in `bench`: 30-60 minutes on 2 cores,
# under the lock other big kwok runs take. SIZING_ARGS="--nodes 1000 --pods 10000" for less.
sizing: $(STAMP)
	bash harness/controlplane/build.sh > /dev/null
	flock /tmp/gpushare-big.lock $(BIN)/python benchmarks/sizing.py $(SIZING_ARGS)

# The openb trace replayed on the real control plane (kwok nodes, kube-scheduler's
# ack-co-scheduler profile, the extender per policy), one pod at a time, beside the memory-mode
# simulator on the same pods (benchmarks/replay.py). A benchmark, not a test: about 11 minutes
# per policy and seed at full size on 2 cores. REPLAY_ARGS="--nodes 40 --pods 400 --policy binpack"
# (or --seeds, --seed, --out) for less; the cluster lives in .cluster-replay on free ports.
replay: $(STAMP)
	bash harness/controlplane/build.sh > /dev/null
	$(BIN)/python benchmarks/replay.py $(REPLAY_ARGS)

# What N device plugins' node loops ask of kube-apiserver, the old one-second poll against the
# watch, in one run on the real control plane with N kwok nodes (PodResources answered by
# harness/podresources_double.py): apiserver_request_total per node per minute by verb and
# resource, and the seconds from a pod bound to it marked served (benchmarks/plugin_api_requests.py).
# About 7 minutes at the default 100 nodes and 60 s per phase on 2 cores;
# PLUGIN_REQUESTS_ARGS="--nodes 300 --seconds 120" (or --pods) for another size.
plugin-requests: $(STAMP)
	bash harness/controlplane/build.sh > /dev/null
	$(BIN)/python benchmarks/plugin_api_requests.py $(PLUGIN_REQUESTS_ARGS)

# The container image for every component, ghcr.io/gpushare/gpushare:$(VERSION), as an OCI
# archive: packaging/image.py is the one recipe, which `make release` ships and the real-node
# Helm test builds and runs (harness/image_archive.py). Two ways to run it:
# - here (Debian/Ubuntu): `make image` needs mmdebstrap (apt-get install -y mmdebstrap; root or
#   user namespaces), Python 3.11 with pip, gcc, Debian's archive and PyPI; no image registry;
# - anywhere with Docker: `make image-in-docker` runs the same recipe in debian:bookworm.
# ARCH=amd64,arm64 makes one image index for both; a foreign architecture needs its cross gcc
# (gcc-aarch64-linux-gnu), arch-test and qemu-user-static in binfmt_misc (docs/helm.md). Then
# load or push the archive:
#   docker load -i $(IMAGE_ARCHIVE)          (or podman load -i ...)
#   skopeo copy --all oci-archive:$(IMAGE_ARCHIVE) docker://ghcr.io/gpushare/gpushare:$(VERSION)
image:
	$(PYTHON) packaging/image.py --out $(IMAGE_ARCHIVE) $(if $(ARCH),--arch $(ARCH))

image-in-docker:
	docker run --rm --privileged -v "$(CURDIR)":/src -w /src \
	  -e SOURCE_DATE_EPOCH=$(shell git log -1 --format=%ct 2>/dev/null) debian:bookworm sh -c '\
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends mmdebstrap \
	    python3 python3-pip python3-venv gcc libc6-dev binutils ca-certificates make \
	    $(if $(findstring arm64,$(ARCH)),gcc-aarch64-linux-gnu libc6-dev-arm64-cross arch-test) >/dev/null && \
	  make image PYTHON=python3 ARCH=$(ARCH) && chown -R $$(stat -c %u:%g Makefile) dist'

# Every artifact of a release under $(DIST) (packaging/release.py): the image (OCI archive), the
# chart (`helm package`; push with `helm push ... oci://ghcr.io/gpushare/charts`), the wheel and
# sdist of the kube-gpushare distribution, kubectl-inspect-cgpu as one file and its krew
# manifest, LICENSE, CHANGELOG.md and SHA256SUMS. It builds the image first (`make image`, with
# ARCH); RELEASE_ARGS=--no-image leaves the image out.
release: $(STAMP) $(if $(filter --no-image,$(RELEASE_ARGS)),,image)
	$(BIN)/python packaging/release.py --out $(DIST) $(if $(filter --no-image,$(RELEASE_ARGS)),,--image $(IMAGE_ARCHIVE)) $(RELEASE_ARGS)

# Publishing a release (.github/workflows/release.yml, on a tag v$(VERSION)) runs one
# `make release-step-<name>` per step of packaging/publish.py's STEPS: check-tag, build (the
# image for amd64 and arm64 with Debian pinned to a snapshot.debian.org moment, then `release`),
# sbom, login, push-image, sign-image (keyless cosign), push-chart, verify, github-release.
# release-dryrun runs the same steps here against `crane registry serve` on 127.0.0.1 and says
# which commands only the forge can run (signing, logging in, the GitHub release); DRYRUN_IMAGE
# reuses an OCI archive of the recipe instead of building one (e.g. harness/image_archive.py's).
release-step-%: $(STAMP)
	$(BIN)/python packaging/publish.py $*

release-dryrun: $(STAMP)
	$(BIN)/python packaging/publish.py --dry-run $(if $(DRYRUN_IMAGE),--image $(DRYRUN_IMAGE))

# The real-node Helm test's images (harness/image_archive.py): the gpushare image by
# the recipe above, plus stand-ins for kube-scheduler and the certificate Job's image, for
# `ctr -n k8s.io images import`. Cached under ~/.cache/gpushare/images by a hash of their inputs.
image-archive: $(STAMP)
	bash harness/controlplane/build.sh > /dev/null
	$(BIN)/python -m harness.image_archive

clean:
	rm -rf $(VENV) build dist bench-out sim-report *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
