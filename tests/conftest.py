"""Shared fixtures: the real small GGUF models, engines on them, and live servers in subprocesses.

Set ``SEMIF_TEST_URL`` to run the contract tests against an already running server or container
instead of one started here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from semif_adapter.engine import DecisionEngine
from semif_adapter.model.demo_models import ensure_model
from tests.helpers.random_models import ensure_random_model
from tests.helpers.support import (
    LiveServer,
    engine_settings,
    engines_under_test,
    make_model_dir,
    numerics_engines,
    start_server,
    wait_for_ping,
)

# Markers come from what a test uses, not from hand-written decorators: a test that asks for a GGUF or an
# engine loads a model, one that asks for a live server starts one, a folder names the rest. The source
# patterns catch the modules that load a model or start a server without a fixture.
MODEL_FIXTURES = frozenset(
    {"gemma_gguf", "qwen_gguf", "tokenizer_gguf", "hybrid_gguf", "mamba_gguf", "dense_gguf", "engine"}
)
LIVE_FIXTURES = frozenset({"live_server", "server_factory", "s1"})
AWS_FIXTURES = frozenset({"moto_aws", "calls", "use_clients"})
MODEL_SOURCE = ("ensure_model(", "DecisionEngine.load(", "start_server(", "make_model_dir(")
LIVE_SOURCE = ("start_server(", "LiveServer(", "SEMIF_TEST_URL")
AWS_SOURCE = ("mock_aws", "Stubber(")
FOLDER_MARKS = {"image": ("image", "live", "model", "slow"), "gpu_check": ("gpu_check", "model", "slow")}
SLOW_MODULES = frozenset({"test_soak.py"})

# tests/image runs against a built image and its running container; tests/image/harness.py (make test-image)
# builds both and sets SEMIF_TEST_IMAGE. `make test` has no container, so it does not collect them.
collect_ignore = [] if os.environ.get("SEMIF_TEST_IMAGE") else ["image"]


def _marks_for(item: pytest.Item, source: str) -> set[str]:
    fixtures = set(getattr(item, "fixturenames", ()))
    marks: set[str] = set()
    if fixtures & MODEL_FIXTURES or any(f.endswith("_engine") for f in fixtures):
        marks.add("model")
    if fixtures & LIVE_FIXTURES:
        marks |= {"live", "model"}
    if fixtures & AWS_FIXTURES or any(p in source for p in AWS_SOURCE):
        marks.add("aws")
    if any(p in source for p in MODEL_SOURCE):
        marks.add("model")
    if any(p in source for p in LIVE_SOURCE):
        marks.add("live")
    parts = item.path.relative_to(Path(__file__).parent).parts
    marks.update(FOLDER_MARKS.get(parts[0], ()) if len(parts) > 1 else ())
    if item.path.name in SLOW_MODULES:
        marks.add("slow")
    return marks


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    sources: dict[Path, str] = {}
    for item in items:
        if item.path not in sources:
            sources[item.path] = item.path.read_text(encoding="utf-8")
        for name in sorted(_marks_for(item, sources[item.path]) - {m.name for m in item.iter_markers()}):
            item.add_marker(name)


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    return ensure_model("gemma")


@pytest.fixture(scope="session")
def qwen_gguf() -> Path:
    return ensure_model("qwen")


def _random_gguf(request: pytest.FixtureRequest, arch: str, tokenizer_gguf: Path) -> Path:
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    if cache is not None:
        return ensure_random_model(arch, Path(cache.mkdir(f"{arch}-gguf")), tokenizer_gguf)
    return ensure_random_model(arch, request.getfixturevalue("tmp_path_factory").mktemp(arch), tokenizer_gguf)


@pytest.fixture(scope="session")
def tokenizer_gguf(request: pytest.FixtureRequest) -> Path:
    """Where the random models take their tokenizer: ``SEMIF_TEST_TOKENIZER_GGUF`` (the GPU bundle's
    weightless copy, where no model package can travel), else the Qwen2.5 test model."""
    override = os.environ.get("SEMIF_TEST_TOKENIZER_GGUF")
    return Path(override) if override else request.getfixturevalue("qwen_gguf")


@pytest.fixture(scope="session")
def hybrid_gguf(request: pytest.FixtureRequest, tokenizer_gguf: Path) -> Path:
    """A tiny random ``qwen35`` (hybrid recurrent + attention) model, built once and cached."""
    return _random_gguf(request, "qwen35", tokenizer_gguf)


@pytest.fixture(scope="session")
def mamba_gguf(request: pytest.FixtureRequest, tokenizer_gguf: Path) -> Path:
    """A tiny random ``mamba`` (purely recurrent: no KV cells at all) model, built once and cached."""
    return _random_gguf(request, "mamba", tokenizer_gguf)


@pytest.fixture(scope="session")
def dense_gguf(request: pytest.FixtureRequest, tokenizer_gguf: Path) -> Path:
    """A tiny random ``gemma3`` (dense, sliding-window layers) model: the demo gemma's architecture where
    the real one cannot travel (the GPU check)."""
    return _random_gguf(request, "gemma3", tokenizer_gguf)


def _loaded(gguf: Path, **settings: Any) -> Iterator[DecisionEngine]:
    engine = DecisionEngine.load(engine_settings(**settings), gguf)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def gemma_engine(gemma_gguf: Path) -> Iterator[DecisionEngine]:
    yield from _loaded(gemma_gguf)


@pytest.fixture(scope="session")
def qwen_engine(qwen_gguf: Path) -> Iterator[DecisionEngine]:
    yield from _loaded(qwen_gguf)


@pytest.fixture(scope="session")
def gemma_flash_engine(gemma_gguf: Path) -> Iterator[DecisionEngine]:
    yield from _loaded(gemma_gguf, flash_attention=True)


@pytest.fixture(scope="session")
def qwen_flash_engine(qwen_gguf: Path) -> Iterator[DecisionEngine]:
    yield from _loaded(qwen_gguf, flash_attention=True)


@pytest.fixture(scope="session")
def gemma_tiled_engine(gemma_gguf: Path) -> Iterator[DecisionEngine]:
    yield from _loaded(gemma_gguf, kv_layout="tiled")


@pytest.fixture(scope="session")
def qwen_tiled_engine(qwen_gguf: Path) -> Iterator[DecisionEngine]:
    yield from _loaded(qwen_gguf, kv_layout="tiled")


@pytest.fixture(scope="session")
def hybrid_engine(hybrid_gguf: Path) -> Iterator[DecisionEngine]:
    yield from _loaded(hybrid_gguf)


@pytest.fixture(scope="session")
def mamba_engine(mamba_gguf: Path) -> Iterator[DecisionEngine]:
    yield from _loaded(mamba_gguf)


@pytest.fixture(scope="session")
def dense_engine(dense_gguf: Path) -> Iterator[DecisionEngine]:
    yield from _loaded(dense_gguf)


@pytest.fixture(scope="session", params=engines_under_test())
def engine(request: pytest.FixtureRequest) -> DecisionEngine:
    """Each engine test runs on both real models (base/plain prompt and ChatML template) and on the
    tiny random fixtures: hybrid (the production architecture's memory: no partial sequence removal)
    and pure recurrent (no KV cells at all); ``SEMIF_TEST_ENGINES`` changes the list."""
    return request.getfixturevalue(f"{request.param}_engine")


@pytest.fixture(scope="session", params=numerics_engines())
def numerics_engine(request: pytest.FixtureRequest) -> DecisionEngine:
    """The bit-identity tests' engines: those of ``engine`` and the real models with flash attention on
    (pieces padded to its tiled rows, and the tiled layout); ``SEMIF_TEST_ENGINES`` changes the list."""
    return request.getfixturevalue(f"{request.param}_engine")


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory, gemma_gguf: Path) -> Iterator[LiveServer]:
    """The server under contract test: ``SEMIF_TEST_URL``, else ``python -m semif_adapter serve``."""
    external = os.environ.get("SEMIF_TEST_URL")
    if external:
        server = LiveServer(external.rstrip("/"))
        wait_for_ping(server, timeout=600)
        yield server
        return
    root = tmp_path_factory.mktemp("live")
    server = start_server(make_model_dir(root, gemma_gguf), root)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Start extra servers with custom settings; all are stopped at the end of the session."""
    started: list[LiveServer] = []

    def factory(model_dir: Path | None, env: dict[str, str] | None = None, **kwargs: object) -> LiveServer:
        server = start_server(model_dir, tmp_path_factory.mktemp("srv"), env, **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()
