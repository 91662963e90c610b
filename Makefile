# Two set-up commands on a fresh machine:
#   make serve   venv + runtime install + embedded demo model, then the server on :8080
#   make test    venv + test install + both test models, then lint and the whole suite
#   make test-fast  the unit layer alone (no model loaded, no server started): the inner loop
#   make test-image  (root) podman + DLC stand-in bases, Dockerfile.cpu built and its container tested
#
# llama-cpp-python compiles from source the first time (several minutes); pip caches the wheel.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)
DEMO_MODEL ?= qwen

.PHONY: serve test test-fast golden reference-kernels test-image lint install install-test models bench bench-peer clean image-context sdists gpu-bundle

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# llama-cpp-python is compiled once per set of flags into a wheel of our own (pip's cache would reuse a
# wheel built with other flags). LLAMA_KERNELS=native (default) compiles for the CPU it is built on
# (-march=native: AVX-512 where the machine has it), so the cache key includes the CPU's feature flags;
# LLAMA_KERNELS=avx2 compiles the portable x86-64 AVX2 level the stand-in images run. LLAMA_CMAKE_ARGS
# overrides both. Native builds compile ggml's AMX kernels on CPUs that advertise AMX; the engine keeps
# its AMX buffer type off there (SEMIF_CPU_EXTRA_BUFFERS, docs/configuration.md).
LLAMA_CPP_PYTHON := $(shell sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)
LLAMA_KERNELS ?= native
AVX2_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
LLAMA_CMAKE_ARGS ?= $(if $(filter avx2,$(LLAMA_KERNELS)),$(AVX2_CMAKE_ARGS),-DGGML_NATIVE=ON)
CPU_KEY := $(shell grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null | sha256sum | cut -c1-16)
CACHE_HOME := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)
WHEEL_DIR := $(CACHE_HOME)/semif-adapter/wheels/$(shell echo '$(LLAMA_CPP_PYTHON) $(LLAMA_CMAKE_ARGS) $(CPU_KEY)' | sha256sum | cut -c1-16)
FIND_WHEEL := --find-links $(WHEEL_DIR)

$(WHEEL_DIR)/.built: | $(PY)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) wheel --quiet --no-deps --no-cache-dir -w $(WHEEL_DIR) \
	  llama-cpp-python==$(LLAMA_CPP_PYTHON)
	touch $@

$(VENV)/.runtime-installed: pyproject.toml $(WHEEL_DIR)/.built | $(PY)
	$(PIP) install --quiet --no-deps --force-reinstall --no-index $(FIND_WHEEL) llama-cpp-python==$(LLAMA_CPP_PYTHON)
	$(PIP) install --quiet $(FIND_WHEEL) -e '.[models]'
	touch $@

$(VENV)/.test-installed: pyproject.toml $(WHEEL_DIR)/.built | $(PY)
	$(PIP) install --quiet --no-deps --force-reinstall --no-index $(FIND_WHEEL) llama-cpp-python==$(LLAMA_CPP_PYTHON)
	$(PIP) install --quiet $(FIND_WHEEL) -e '.[test]'
	touch $@ $(VENV)/.runtime-installed

install: $(VENV)/.runtime-installed
install-test: $(VENV)/.test-installed

serve: install
	@gguf=$$($(PY) -m semif_adapter.model.demo_models $(DEMO_MODEL)) && \
	  echo "serving $$gguf on :$${SEMIF_PORT:-8080}" && \
	  SEMIF_GGUF_PATH="$${SEMIF_GGUF_PATH:-$$gguf}" exec $(PY) -m semif_adapter serve

models: install-test
	$(PY) -m semif_adapter.model.demo_models gemma qwen

lint: install-test
	$(PY) -m ruff check semif_adapter semif_client semif_ops scripts tests benchmarks
	$(PY) -m ruff format --check semif_adapter semif_client semif_ops scripts tests benchmarks
	$(PY) -m mypy
	$(PY) -m semif_ops image check --hadolint

test: models reference-kernels lint
	$(PY) -m pytest -q

# The reference kernels the golden answers are checked on everywhere: llama.cpp built as the DLC builds
# it, with the portable x64 and AVX2 CPU plugins (the stand-in base's libraries; cached, built once).
reference-kernels: install-test
	@$(PY) -c 'from scripts.golden import reference_library; print("reference kernels:", reference_library())'

# Score the fixed decisions of tests/golden/requests.json on both test models and both numerics modes,
# print which answers moved and by how much, and rewrite tests/golden/answers.json (scripts/golden.py).
golden: models reference-kernels
	$(PY) -m scripts.golden

# The unit layer alone: no model loaded, no server started, nothing slow (markers: pyproject.toml).
test-fast: install-test
	$(PY) -m pytest -q -m 'not model and not live and not slow and not image and not gpu_check'

test-image: models
	.ci/setup-podman.sh
	$(PY) -m tests.image.harness

BENCH_REPEATS ?= 5

bench: models
	$(PY) benchmarks/engine_overhead.py --repeats $(BENCH_REPEATS) --json benchmarks/results/engine_overhead-2cpu.json \
	  | tee benchmarks/results/engine_overhead-2cpu.md
	$(PY) -m benchmarks.cpu_kernels --json benchmarks/results/cpu_kernels-2cpu.json \
	  | tee benchmarks/results/cpu_kernels-2cpu.md
	$(PY) -m benchmarks.attention_configs --json benchmarks/results/attention_configs-2cpu.json \
	  | tee benchmarks/results/attention_configs-2cpu.md
	$(PY) -m benchmarks.batching_ceiling --json benchmarks/results/batching_ceiling-2cpu.json \
	  | tee benchmarks/results/batching_ceiling-2cpu.md
	$(PY) -m benchmarks.shared_call_budget --hybrid --cmake-args="$(LLAMA_CMAKE_ARGS)" \
	  --json benchmarks/results/shared_call_budget-2cpu.json | tee benchmarks/results/shared_call_budget-2cpu.md
	$(PY) -m benchmarks.tile_aligned_flash --json benchmarks/results/tile_aligned_flash-2cpu.json \
	  | tee benchmarks/results/tile_aligned_flash-2cpu.md

# Ours against the stock llama-server (built once from the binding's vendored llama.cpp with the same
# flags as the wheel, cached beside it; LLAMA_SERVER=/path/to/llama-server uses one you have).
LLAMA_SERVER ?=
bench-peer: models
	$(PY) benchmarks/peer_llama_server.py --cmake-args="$(LLAMA_CMAKE_ARGS)" --hybrid \
	  $(if $(LLAMA_SERVER),--llama-server $(LLAMA_SERVER)) --json benchmarks/results/peer_llama_server-2cpu.json

# Build context for Dockerfile.cpu/.gpu (wheelhouse + llama.cpp headers; see docs/deployment.md).
IMAGE_PYTHON ?= 3.12
IMAGE_ARCH ?= $(shell uname -m)
LLAMA_SOURCE ?=
LLAMA_VERSION ?=
LLAMA_COMMIT ?=
image-context: $(PY)
	$(PY) -m semif_ops image context --python $(IMAGE_PYTHON) --arch $(IMAGE_ARCH) \
	  $(if $(LLAMA_SOURCE),--llama-source $(LLAMA_SOURCE)) $(if $(LLAMA_VERSION),--llama-version $(LLAMA_VERSION)) \
	  $(if $(LLAMA_COMMIT),--llama-commit $(LLAMA_COMMIT))

# What the GPU machine lacks for scripts/gpu_check.sh (llama.cpp source, 3.12 wheels, tokenizer): an ignored
# folder of at most 60 MiB to carry there (docs/gpu-check.md).
gpu-bundle: models
	$(PY) scripts/gpu_bundle.py

# llama-cpp-python sdists (binding + headers only) for the layout tests, cached outside git.
sdists: $(PY)
	$(PY) -m tests.helpers.sdists 0.3.30 0.3.35 0.3.36

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
