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

unit: $(STAMP) e2e-bins protoc-tools image torch-venv
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
