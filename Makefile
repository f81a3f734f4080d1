# The two commands a newcomer needs: `make replay` (the main job) and `make test`.
# Everything else is set up on the way: a virtualenv in .venv, and the pinned
# Kubernetes binaries built from source into ~/.cache/gpushare-hub/k8s (once).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)

.PHONY: setup replay test test-unit k8s-binaries hub-proxy lint bench proto clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is needed, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,plot,dev,demo]'
	rm -f $(VENV)/.installed-* && touch $@

## The main job: replay the Alibaba GPU-sharing trace with each policy; writes out/replay.png.
replay: setup
	@mkdir -p out
	$(BIN)/gpushare-replay --policy binpack --plot out/replay.png
	$(BIN)/gpushare-replay --policy spread
	$(BIN)/gpushare-replay --policy fgd
	$(BIN)/gpushare-replay --mode static --policy binpack --plot out/replay-static.png

k8s-binaries: setup
	$(BIN)/gpushare-localcluster build

## configurable-http-proxy for the hub tier, from npm at a pinned version into ~/.cache/gpushare-hub/npm (once).
hub-proxy: setup
	$(BIN)/gpushare-localcluster proxy

## Every test tier that can run here (unit, cluster, kubelet, hub, bench), after building what they need.
test: setup k8s-binaries hub-proxy
	$(BIN)/ruff check gpushare_hub extender plugin tests
	$(BIN)/mypy
	$(BIN)/pytest -p no:cacheprovider

test-unit: setup
	$(BIN)/pytest -m unit

lint: setup
	$(BIN)/ruff check gpushare_hub extender plugin tests
	$(BIN)/ruff format --check gpushare_hub extender plugin tests
	$(BIN)/mypy

bench: setup
	$(BIN)/gpushare-bench replay

## Regenerate plugin/api from the kubelet's proto at the pinned Kubernetes version.
proto: setup
	cp "$$(cd gpushare_hub/localcluster && GOFLAGS=-mod=mod go env GOMODCACHE)/k8s.io/kubelet@v0.$$(sed -n 's/^version = "v1\.\(.*\)"/\1/p' gpushare_hub/localcluster/versions.toml | head -1)/pkg/apis/deviceplugin/v1beta1/api.proto" plugin/api/deviceplugin_v1beta1.proto
	chmod 644 plugin/api/deviceplugin_v1beta1.proto
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. plugin/api/deviceplugin_v1beta1.proto

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache .hypothesis
