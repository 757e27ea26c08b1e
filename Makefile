# kube-icl: the two commands of the README, and their helpers.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

## demo: set up and run the main job on built-in defaults
demo: $(STAMP)
	$(BIN)/icl demo

## test: set up and run every check: ruff, mypy --strict, pytest (unit, property, e2e)
test: lint typecheck unit floors

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) e2e-bins e2e-controllers node-runtime browser protoc-tools image torch-venv
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/placement.py

clean:
	rm -rf $(VENV) .venv-protoc .mypy_cache .pytest_cache .ruff_cache .hypothesis

## protoc-tools: the pinned stub generator (grpcio-tools 1.60.0) in .venv-protoc, for the stale-stub test
.PHONY: protoc-tools
protoc-tools: $(STAMP)
	@$(BIN)/python -m deviceplugin.protogen --tools

## floors: the plugin's gRPC tests in a throwaway venv at exactly pyproject's dependency floors
.PHONY: floors
floors:
	$(PYTHON) tests/floors.py

## manifests: render charts/kube-icl's defaults into manifests/ (builds the pinned helm once)
.PHONY: manifests
manifests:
	@$(PYTHON) tests/e2e/build.py --tools
	$(PYTHON) charts/render_manifests.py

## e2e-bins: build the real control plane of the e2e tests once (Go), and helm, cached outside the repository
.PHONY: e2e-bins
e2e-bins:
	@$(PYTHON) tests/e2e/build.py

## test-matrix: the chart, plugin, extender, gang and DRA e2e subsets on each older maintained minor
## (tests/e2e/matrix/<minor>/), building each control plane once (about 25 min cold), cached by hash
.PHONY: test-matrix
test-matrix: $(STAMP) e2e-bins
	$(PYTHON) tests/e2e/matrix.py --build --record

## e2e-controllers: build the pinned job controllers of the platform-stack e2e tests (Kueue, training-operator,
## JobSet, LWS, Trainer; tests/e2e/controllers.env) once, with their CRDs, cached outside the repository
.PHONY: e2e-controllers
e2e-controllers:
	@$(PYTHON) tests/e2e/ctlbuild.py

## node-runtime: runc for the real node of the e2e tests (tests/e2e/realnode.py: kubelet + containerd, built by
## e2e-bins), from the distribution's packages when it is missing (as root)
.PHONY: node-runtime
node-runtime:
	@command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "node-runtime: apt-get install runc"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends runc; \
	  else \
	    echo "node-runtime: runc not installed and no apt-get as root: the real-node e2e tests will skip"; \
	  fi; }

## browser: Chromium for the tests that look at kube-icl's pages as a person would (kubectl icl nodes --html),
## from the distribution's packages when it is missing (as root)
.PHONY: browser
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "browser: apt-get install chromium"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; \
	  else \
	    echo "browser: chromium not installed and no apt-get as root: the page screenshot test will skip"; \
	  fi; }

## torch-venv: PyTorch from PyPI (CUDA wheel, used on CPU with gloo) in its own virtualenv outside the repository,
## built once, for tests/e2e/test_torchrun_elastic.py (a real torchrun elastic job; docs/scheduler.md)
TORCH_VERSION := 2.15.0
TORCH_VENV ?= $(HOME)/.cache/kube-icl/torch-venv
.PHONY: torch-venv
torch-venv: $(TORCH_VENV)/.installed
$(TORCH_VENV)/.installed:
	$(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install -q 'torch==$(TORCH_VERSION)'
	touch $@

## image: build the container image from the Dockerfile without a Docker daemon (as root: debootstrap + chroot,
## then crane), cached outside the repository; tests/e2e/test_image.py smoke-tests it (docs/image.md)
.PHONY: image
image:
	@$(PYTHON) hack/image/build.py

## lock: regenerate the image's hashed lock files (hack/image/*.lock) from pyproject.toml with the pinned uv
UV_VERSION := 0.13.9
.PHONY: lock
lock: $(STAMP)
	$(BIN)/python -m pip install -q 'uv==$(UV_VERSION)'
	$(BIN)/python hack/image/lock.py
