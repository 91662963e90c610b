# Two set-up commands on a fresh machine:
#   make serve   venv + runtime install + embedded demo model, then the server on :8080
#   make test    venv + test install + both test models, then lint and the whole suite
#   make test-image  (root) podman + DLC stand-in bases, Dockerfile.cpu built and its container tested
#
# llama-cpp-python compiles from source the first time (several minutes); pip caches the wheel.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)
DEMO_MODEL ?= qwen

.PHONY: serve test test-image lint install install-test models bench clean image-context sdists gpu-bundle

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.runtime-installed: pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[models]'
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[test]'
	touch $@ $(VENV)/.runtime-installed

install: $(VENV)/.runtime-installed
install-test: $(VENV)/.test-installed

serve: install
	@gguf=$$($(PY) -m semif_adapter.demo_models $(DEMO_MODEL)) && \
	  echo "serving $$gguf on :$${SEMIF_PORT:-8080}" && \
	  SEMIF_GGUF_PATH="$${SEMIF_GGUF_PATH:-$$gguf}" exec $(PY) -m semif_adapter serve

models: install-test
	$(PY) -m semif_adapter.demo_models gemma qwen

lint: install-test
	$(PY) -m ruff check semif_adapter scripts tests benchmarks
	$(PY) scripts/check_dockerfiles.py --hadolint

test: models lint
	$(PY) -m pytest -q

test-image: models
	.ci/setup-podman.sh
	$(PY) scripts/test_image.py

bench: models
	$(PY) benchmarks/engine_overhead.py

# Build context for Dockerfile.cpu/.gpu (wheelhouse + llama.cpp headers; see docs/deployment.md).
IMAGE_PYTHON ?= 3.12
IMAGE_ARCH ?= $(shell uname -m)
LLAMA_SOURCE ?=
LLAMA_VERSION ?=
LLAMA_COMMIT ?=
image-context: $(PY)
	$(PY) scripts/prepare_image_context.py --python $(IMAGE_PYTHON) --arch $(IMAGE_ARCH) \
	  $(if $(LLAMA_SOURCE),--llama-source $(LLAMA_SOURCE)) $(if $(LLAMA_VERSION),--llama-version $(LLAMA_VERSION)) \
	  $(if $(LLAMA_COMMIT),--llama-commit $(LLAMA_COMMIT))

# What the GPU machine lacks for scripts/gpu_check.sh (llama.cpp source, 3.12 wheels, tokenizer): an ignored
# folder of at most 60 MiB to carry there (docs/gpu-check.md).
gpu-bundle: models
	$(PY) scripts/gpu_bundle.py

# llama-cpp-python sdists (binding + headers only) for the layout tests, cached outside git.
sdists: $(PY)
	$(PY) tests/deploy/sdists.py 0.3.30 0.3.35 0.3.36

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
