# The commands a newcomer needs: `make demo` (the whole stack on this machine), `make replay`
# (capacity planning on a real trace) and `make test`. Everything else is set up on the way: a
# virtualenv in .venv (its packages installed by uv, from PyPI, about five times faster than pip),
# configurable-http-proxy from npm into ~/.cache/gpushare-hub/npm, and the
# pinned Kubernetes binaries built from source into ~/.cache/gpushare-hub/k8s (once).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)

.PHONY: setup labextension demo system-deps replay test test-steps test-setup test-main newest-chain test-between k8s-also-binaries lint-checks version release-images release-manifest release-chart release-python test-node test-newest test-k8s-also test-unit test-chart k8s-binaries hub-proxy lint bench proto chart wheelhouse images clean

setup: $(STAMP) labextension

## The JupyterLab status-bar extension (labextension/) built into gpushare_hub/notebook/labextension and
## linked into the venv; npm ci once into ~/.cache/gpushare-hub/labextension; skipped while unchanged.
labextension: $(STAMP)
	$(BIN)/python -m gpushare_hub.notebook.build

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is needed, found " + sys.version'
	@echo "installing gpushare-hub and its Python packages into $(VENV) (under a minute the first time) ..."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[test,plot,dev,demo]'
	rm -f $(VENV)/.installed-* && touch $@

## The first thing to try: GPU slices for JupyterHub, all of it on this machine, until Ctrl-C.
## Options: make demo DEMO_ARGS='--nodes 3 --cards "1x Tesla T4" --port 8010 --headless'
DEMO_ARGS ?=
demo:
	@echo "gpushare-demo: the first run installs Python packages, configurable-http-proxy and builds the"
	@echo "  Kubernetes binaries from source: about 11 min on 2 cores; later runs start in about 20 s."
	@$(MAKE) --no-print-directory setup
	$(BIN)/gpushare-demo $(DEMO_ARGS)

## The second thing to try, capacity planning: replay the Alibaba GPU-sharing trace with each policy; writes out/replay.png.
replay: setup
	@mkdir -p out
	$(BIN)/gpushare-replay --policy binpack --plot out/replay.png
	$(BIN)/gpushare-replay --policy spread
	$(BIN)/gpushare-replay --policy fgd
	$(BIN)/gpushare-replay --mode static --policy binpack --plot out/replay-static.png

# Kubernetes versions pinned beside the first one (versions.toml's [also."vX.Y.Z"] tables), and the newest.
K8S_ALSO = $(shell $(BIN)/python -c 'from gpushare_hub.localcluster.build import Versions; print(*[v.kubernetes for v in Versions.all()[1:]])')
K8S_NEWEST = $(shell $(BIN)/python -c 'from gpushare_hub.localcluster.build import Versions; print(Versions.all()[-1].kubernetes)')

## Every pinned Kubernetes version, each into its own cache entry.
k8s-binaries: setup
	$(BIN)/gpushare-localcluster build
	set -e; for v in $(K8S_ALSO); do GPUSHARE_K8S_VERSION=$$v $(BIN)/gpushare-localcluster build; done

## Debian packages installed once (as root) when missing: the chart tier's image builds need
## buildah and debootstrap; the browser tier drives chromium headless with Playwright; the node
## tier's real nodes run runc (containerd and the NVIDIA toolkit are built from their Go modules, the
## toolkit with cgo: gcc), with the CNI plugins and iptables (kube-proxy).
SYSTEM_PACKAGES := buildah debootstrap chromium runc containernetworking-plugins iptables gcc
system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "make test needs the Debian packages$$missing: sudo apt-get install$$missing" >&2; exit 1; fi; \
	fi

## configurable-http-proxy for the hub tier, from npm at a pinned version into ~/.cache/gpushare-hub/npm (once).
hub-proxy: setup
	$(BIN)/gpushare-localcluster proxy

# `make test`'s timing: each step appends a line to TIMING_FILE (gpushare_hub/localcluster/timing.py:
# the Makefile's steps through STEP, the builders and the pytest plugin tests/support/timing.py
# themselves), and the run ends with their table, also when a step failed.
TIMING      := $(PYTHON) gpushare_hub/localcluster/timing.py
TIMING_FILE := $(CURDIR)/out/make-test-timing.tsv
STEP        := $(TIMING) step
LABEXTENSION_BUILT := $(BIN)/python -m gpushare_hub.notebook.build --check

## Every test tier (unit, cluster, kubelet, hub, browser, chart, bench, fuzz, then node on its own), after
## building what they need; then the cluster and kubelet tiers again against each further pinned
## Kubernetes version. Ends with a table of each build's and each tier's wall time.
test:
	@mkdir -p out && rm -f $(TIMING_FILE)
	@GPUSHARE_TIMING=$(TIMING_FILE) $(MAKE) --no-print-directory test-steps; rc=$$?; \
	  $(TIMING) table $(TIMING_FILE); exit $$rc

# The first version's control plane and kubectl build (Go, both cores) from the start, with the
# system Python (the builder is standard library only), while the venv, the labextension, Debian's
# packages and the proxy are set up (mostly waits on the network). Then three things side by side:
# the checks, the main sessions and the newest version's chain (below).
FIRST_LOG  := $(CURDIR)/out/k8s-first-build.log
NEWEST_LOG := $(CURDIR)/out/newest-chain.log
CHECK_LOG  := $(CURDIR)/out/checks.log
test-steps:
	@echo "building the first Kubernetes version's control plane and kubectl in the background: $(FIRST_LOG)"
	@$(PYTHON) -m gpushare_hub.localcluster.build --only control-plane kubectl >$(FIRST_LOG) 2>&1 & first=$$!; \
	  $(MAKE) --no-print-directory test-setup; rc=$$?; \
	  wait $$first; frc=$$?; cat $(FIRST_LOG); \
	  if [ $$rc != 0 ]; then exit $$rc; fi; exit $$frc
	@echo "the newest version's chain (helm, its binaries, CoreDNS, containerd, the toolkit; then its node,"
	@echo "  kubelet and cluster tiers) runs beside the main sessions; its log: $(NEWEST_LOG)"
	@$(MAKE) --no-print-directory newest-chain >$(NEWEST_LOG) 2>&1 & chain=$$!; \
	  $(MAKE) --no-print-directory test-main; rc=$$?; \
	  echo "waiting for the newest version's chain ($(NEWEST_LOG)):"; wait $$chain; crc=$$?; cat $(NEWEST_LOG); \
	  if [ $$crc != 0 ]; then echo "the newest version's chain failed (exit $$crc): $(NEWEST_LOG)"; fi; \
	  if [ $$rc != 0 ]; then exit $$rc; fi; exit $$crc
	$(MAKE) --no-print-directory test-between

test-setup:
	$(STEP) "Debian packages" --cached-if 'dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1' -- \
	  $(MAKE) --no-print-directory system-deps
	$(STEP) venv --cached-if 'test -f $(STAMP)' -- $(MAKE) --no-print-directory $(STAMP)
	$(STEP) labextension --cached-if '$(LABEXTENSION_BUILT)' -- $(BIN)/python -m gpushare_hub.notebook.build
	$(MAKE) --no-print-directory hub-proxy

# The checks, in the background, and every tier but node (first version) as two pytest sessions side
# by side (gpushare_hub/localcluster/sidebyside.py), each with its own cluster and hub: most tiers
# wait on processes they started. The groups hold about equal time.
MAIN_GROUPS := fuzz=tests/fuzz,tests/kubelet,tests/unit,tests/bench,tests/cluster hub=tests/hub,tests/browser,tests/chart
test-main:
	@$(STEP) "ruff, mypy, lint-imports" --kind check -- $(MAKE) --no-print-directory lint-checks >$(CHECK_LOG) 2>&1 & checks=$$!; \
	  $(BIN)/python -m gpushare_hub.localcluster.sidebyside $(MAIN_GROUPS); rc=$$?; \
	  wait $$checks; crc=$$?; echo "== ruff, mypy, lint-imports ($(CHECK_LOG)):"; cat $(CHECK_LOG); \
	  if [ $$rc != 0 ]; then exit $$rc; fi; exit $$crc

# Beside the main sessions: what the chart tier (helm: it runs last in its session, and waits on the
# build lock if helm is not built yet), the node tier and the newest version's tiers need, built
# once; then the node tier, then the kubelet and cluster tiers at the newest version (one after the
# other here: three sessions at once keep both cores busy, a fourth only adds contention, and the
# chain still ends before the main sessions on a warm machine). No `setup`: `make test` runs this
# once the venv is in place.
newest-chain:
	$(MAKE) --no-print-directory k8s-also-binaries
	@GPUSHARE_K8S_VERSION=$(K8S_NEWEST) $(BIN)/python -m gpushare_hub.localcluster.sidebyside node=tests/node; rc=$$?; \
	  GPUSHARE_K8S_VERSION=$(K8S_NEWEST) $(BIN)/python -m gpushare_hub.localcluster.sidebyside \
	    newest=tests/kubelet,tests/cluster || exit $$?; exit $$rc

# What the chart tier, the node tier and test-k8s-also need beyond the first version's control plane.
k8s-also-binaries:
	$(BIN)/gpushare-localcluster build --only clients
	GPUSHARE_K8S_VERSION=$(K8S_NEWEST) $(BIN)/gpushare-localcluster build --coredns --runtime
	set -e; for v in $(K8S_ALSO); do GPUSHARE_K8S_VERSION=$$v $(BIN)/gpushare-localcluster build --only control-plane; done

## The node tier alone: real kubelets (containerd 2 with CDI and the NVIDIA container toolkit's runtime,
## built from their Go modules; Debian's runc) at the newest pinned Kubernetes, our chart and Zero to
## JupyterHub as containers on them (root; see tests/node/). About 10 min.
test-node: setup system-deps hub-proxy
	GPUSHARE_K8S_VERSION=$(K8S_NEWEST) $(BIN)/gpushare-localcluster build --coredns --runtime
	$(BIN)/pytest -p no:cacheprovider tests/node

## `make test`'s last step: the node tier and the cluster and kubelet tiers at the newest pinned
## version, side by side (two sessions: the node tier mostly waits on its kubelets and containers);
## then the cluster and kubelet tiers at any other further version.
test-newest: setup system-deps hub-proxy
	GPUSHARE_K8S_VERSION=$(K8S_NEWEST) $(BIN)/gpushare-localcluster build --coredns --runtime
	$(NEWEST_SESSIONS)
	$(MAKE) --no-print-directory test-between

# The newest version's sessions: the node tier (real nodes: it mostly waits on its kubelets and
# containers) beside the kubelet and cluster tiers at that version.
NEWEST_SESSIONS = GPUSHARE_K8S_VERSION=$(K8S_NEWEST) $(BIN)/python -m gpushare_hub.localcluster.sidebyside \
	node=tests/node newest=tests/kubelet,tests/cluster

# The cluster and kubelet tiers at each version pinned between the first and the newest (none today).
test-between:
	set -e; for v in $(filter-out $(K8S_NEWEST),$(K8S_ALSO)); do echo "== Kubernetes $$v"; \
	  GPUSHARE_K8S_VERSION=$$v $(BIN)/gpushare-localcluster build --only control-plane; \
	  GPUSHARE_K8S_VERSION=$$v $(BIN)/pytest -p no:cacheprovider tests/cluster tests/kubelet; done

## The cluster and kubelet tiers against each Kubernetes version pinned beside the first.
test-k8s-also: setup
	set -e; for v in $(K8S_ALSO); do GPUSHARE_K8S_VERSION=$$v $(BIN)/gpushare-localcluster build --only control-plane; done
	set -e; for v in $(K8S_ALSO); do echo "== Kubernetes $$v"; GPUSHARE_K8S_VERSION=$$v $(BIN)/pytest -p no:cacheprovider tests/cluster tests/kubelet; done

test-unit: setup
	$(BIN)/pytest -m unit

## The chart tier alone: helm lint/template, schema, dry run, install into its own local cluster.
test-chart: setup
	$(BIN)/gpushare-localcluster build --only control-plane clients
	$(BIN)/pytest -p no:cacheprovider tests/chart

lint: setup
	$(BIN)/ruff format --check gpushare_hub tests helm images release
	$(MAKE) --no-print-directory lint-checks

# What `make test` checks before its tiers (and `make lint` besides the format).
lint-checks:
	$(BIN)/ruff check gpushare_hub tests helm images release
	$(BIN)/mypy
	$(BIN)/mypy helm/generate.py
	$(BIN)/mypy images/build.py
	$(BIN)/mypy release/version.py release/publish.py
	$(BIN)/lint-imports --no-cache

bench: setup
	$(BIN)/gpushare-bench replay

## Regenerate gpushare_hub/plugin/api from the kubelet's protos (device plugin, DRA, plugin registration) at the
## pinned Kubernetes version.
proto: setup
	cp "$$(cd gpushare_hub/localcluster && GOFLAGS=-mod=mod go env GOMODCACHE)/k8s.io/kubelet@v0.$$(sed -n 's/^version = "v1\.\(.*\)"/\1/p' gpushare_hub/localcluster/versions.toml | head -1)/pkg/apis/deviceplugin/v1beta1/api.proto" gpushare_hub/plugin/api/deviceplugin_v1beta1.proto
	cp "$$(cd gpushare_hub/localcluster && GOFLAGS=-mod=mod go env GOMODCACHE)/k8s.io/kubelet@v0.$$(sed -n 's/^version = "v1\.\(.*\)"/\1/p' gpushare_hub/localcluster/versions.toml | head -1)/pkg/apis/dra/v1/api.proto" gpushare_hub/plugin/api/dra_v1.proto
	cp "$$(cd gpushare_hub/localcluster && GOFLAGS=-mod=mod go env GOMODCACHE)/k8s.io/kubelet@v0.$$(sed -n 's/^version = "v1\.\(.*\)"/\1/p' gpushare_hub/localcluster/versions.toml | head -1)/pkg/apis/pluginregistration/v1/api.proto" gpushare_hub/plugin/api/pluginregistration_v1.proto
	chmod 644 gpushare_hub/plugin/api/*.proto
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. gpushare_hub/plugin/api/deviceplugin_v1beta1.proto gpushare_hub/plugin/api/dra_v1.proto gpushare_hub/plugin/api/pluginregistration_v1.proto

## The package's version (pyproject.toml) into every file that repeats it; with VERSION=X.Y.Z,
## change it first (release/version.py).
version: setup
	$(BIN)/python release/version.py $(if $(VERSION),--set $(VERSION))

## Regenerate the chart's generated files (values.schema.json, RBAC rules, admission policy template).
chart: setup
	$(BIN)/python helm/generate.py

## Wheels of the package and its dependencies, with the `hub` and `singleuser` extras, for the images
## (images/*/Dockerfile), built on the host for the image's Python (IMAGE_PYTHON; the hub image: its
## own Python, e.g. 3.14). Each image installs only what it names (the extender: no extra).
IMAGE_PYTHON   ?= 3.12
IMAGE_PLATFORM ?= x86_64
wheelhouse: setup
	rm -rf wheelhouse build
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir wheelhouse .
	$(BIN)/pip download --quiet --dest wheelhouse --only-binary=:all: --python-version $(IMAGE_PYTHON) \
	    --platform manylinux_2_28_$(IMAGE_PLATFORM) --platform manylinux_2_17_$(IMAGE_PLATFORM) \
	    --platform manylinux2014_$(IMAGE_PLATFORM) --platform any "$$(ls wheelhouse/gpushare_hub-*.whl)[hub,hub-image,singleuser]" "jupyterlab>=4.2,<5"

## The images, built here with buildah (chroot, vfs) on a debootstrap base, cached under
## ~/.cache/gpushare-hub/images; each is checked with `buildah run`. Needs buildah, debootstrap.
images: setup
	$(BIN)/python images/build.py --check

## The release's steps (release/publish.py), as .github/workflows/release.yaml runs them and the
## chart tier runs them against a registry on 127.0.0.1: our images pushed to REGISTRY at the
## package's version (SUFFIX=-amd64 per architecture), their multi-architecture lists (ARCHES),
## the chart as an OCI artifact, the sdist and the wheel in dist/. PLAIN_HTTP=1: an HTTP registry.
REGISTRY ?= ghcr.io/gpushare-hub
ARCHES   ?= amd64 arm64
HELM     ?= helm
RELEASE_FLAGS = --registry $(REGISTRY) $(if $(PLAIN_HTTP),--plain-http)
release-images: setup
	$(BIN)/python release/publish.py images $(RELEASE_FLAGS) $(if $(SUFFIX),--suffix=$(SUFFIX))
release-manifest: setup
	$(BIN)/python release/publish.py manifest $(RELEASE_FLAGS) $(foreach a,$(ARCHES),--arch $(a))
release-chart: setup
	$(BIN)/python release/publish.py chart $(RELEASE_FLAGS) --helm $(HELM)
release-python: setup labextension
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python release/publish.py python

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache .hypothesis
