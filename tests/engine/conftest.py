"""Engine-test fixtures: both real models forced into the fixed split (the numerics fallback)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from semif_adapter.engine import DecisionEngine
from tests.helpers.support import engine_settings


@pytest.fixture(scope="session", params=["gemma", "qwen"])
def fixed_engine(request: pytest.FixtureRequest) -> Iterator[DecisionEngine]:
    gguf = request.getfixturevalue(f"{request.param}_gguf")
    engine = DecisionEngine.load(engine_settings(numerics="fixed-split"), gguf)
    yield engine
    engine.close()
