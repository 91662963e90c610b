"""In-process app tests: bearer auth and OpenAPI on the real engine; busy/loading with a stand-in engine.

The stand-in engine exists only to hold the engine (busy) or the load (not ready) at a chosen moment,
states a real model passes through too quickly to hit reliably.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from semif_adapter.app import create_app
from semif_adapter.engine import DecisionEngine
from semif_adapter.protocol import BatchResult, Decision
from semif_adapter.settings import Settings
from tests.helpers.support import stand_in_batch as uniform_batch
from tests.helpers.support import stand_in_result as result
from tests.helpers.systemone import NOUL, STATE

KEY = "s3cret-key"
BODY = {"model": "jev-latest", "state": STATE, "questions": {"b": NOUL}}


@pytest.fixture(scope="module")
def auth_client(gemma_gguf: Path) -> Iterator[TestClient]:
    settings = Settings(
        gguf_path=gemma_gguf, api_key=KEY, n_ctx=2048, n_threads=1, warmup=False, verify_manifest=False
    )
    with TestClient(create_app(settings, lambda: DecisionEngine.load(settings))) as client:
        for _ in range(600):
            if client.get("/ping").status_code == 200:
                break
            threading.Event().wait(0.1)
        yield client


def test_bearer_key_required_when_configured(auth_client):
    for path, method in (("/v1/systemone", "post"), ("/v1/models", "get")):
        kwargs = {"json": BODY} if method == "post" else {}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            response = getattr(auth_client, method)(path, headers=headers, **kwargs)
            assert response.status_code == 401, (path, headers)
            assert response.json()["detail"]["error_type"] == "authentication_error"
            assert response.headers["www-authenticate"] == "Bearer"
        ok = getattr(auth_client, method)(path, headers={"Authorization": f"Bearer {KEY}"}, **kwargs)
        assert ok.status_code == 200, ok.text
    # Checked before the body is read: an unauthenticated caller learns nothing about its body.
    junk = auth_client.post("/v1/systemone", content=b"{not json")
    assert junk.status_code == 401


def test_openapi_documents_request_and_responses(auth_client):
    spec = auth_client.get("/openapi.json").json()
    post = spec["paths"]["/v1/systemone"]["post"]
    schema = post["requestBody"]["content"]["application/json"]["schema"]
    assert {"model", "state", "questions"} <= set(schema["properties"]) and "$defs" not in str(schema)
    branches = schema["properties"]["questions"]["additionalProperties"]["oneOf"]
    assert [b["properties"]["type"]["const"] for b in branches] == ["noul", "choice", "score", "box"]
    assert post["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "SystemOneResponse"
    )
    assert post["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "HTTPValidationError"
    )
    assert "/v1/models" in spec["paths"]
    assert {"NoulAnswer", "ChoiceAnswer", "ScoreAnswer", "ModelList"} <= set(spec["components"]["schemas"])


class HeldEngine:
    """Scores uniformly, but only once released: keeps the single engine slot occupied."""

    max_options = 255

    def __init__(self, model_info) -> None:
        self.model_info = model_info
        self.entered = threading.Event()
        self.release = threading.Event()

    def score(self, decisions: list[Decision], cancel: object = None) -> BatchResult:
        self.entered.set()
        self.release.wait(30)
        return uniform_batch(decisions)

    def reset_prefix_cache(self) -> None: ...

    def close(self) -> None: ...


def run(coro):
    return asyncio.run(coro)


def test_busy_is_503_with_retry_after_on_both_routes():
    engine = HeldEngine(result(["no", "yes"], [0.5, 0.5]).model)
    settings = Settings(max_queue=0, retry_after_s=3, warmup=False, served_model_name="held")
    app = create_app(settings, lambda: engine)

    async def scenario():
        await app.state.service.start()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            first = asyncio.create_task(client.post("/v1/systemone", json=BODY))
            while not engine.entered.is_set():
                await asyncio.sleep(0.01)
            busy = [await client.post(path, json=BODY) for path in ("/v1/systemone", "/invocations")]
            engine.release.set()
            return await first, busy

    first, busy = run(scenario())
    assert first.status_code == 200 and first.json()["model"] == "held"
    for response in busy:
        assert response.status_code == 503 and response.headers["retry-after"] == "3"
        assert response.json()["detail"]["error_type"] == "model_busy"


def test_loading_is_503_not_a_model_error():
    loaded = threading.Event()

    def slow_factory():
        loaded.wait(30)
        raise RuntimeError("never finishes loading in this test")

    app = create_app(Settings(retry_after_s=2, warmup=False), slow_factory)

    async def scenario():
        start = asyncio.create_task(app.state.service.start())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            responses = [
                await client.post("/v1/systemone", json={**BODY, "model": "anything"}),
                await client.get("/v1/models"),
            ]
        loaded.set()
        await start
        return responses

    for response in run(scenario()):
        assert response.status_code == 503 and response.headers["retry-after"] == "2"
        assert response.json()["detail"]["error_type"] == "not_ready"


def _ready_app(**settings: object):
    engine = HeldEngine(result(["no", "yes"], [0.5, 0.5]).model)
    engine.release.set()
    return create_app(Settings(warmup=False, served_model_name="held", **settings), lambda: engine)  # type: ignore[arg-type]


def test_a_body_that_stops_coming_gets_a_408_that_closes_the_connection_on_both_apis():
    """One error path: the 408 (the rest of a trickled body must not be read as a next request) closes
    its connection on /v1/systemone as on /invocations, each in its own API's shape."""
    app = _ready_app(body_timeout_s=0.2)

    async def stalled():
        yield b'{"model": "held", '
        await asyncio.sleep(1.0)
        yield b"}"

    async def scenario():
        await app.state.service.start()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return [await client.post(path, content=stalled()) for path in ("/v1/systemone", "/invocations")]

    systemone, invocations = run(scenario())
    for response in (systemone, invocations):
        assert response.status_code == 408 and response.headers["connection"] == "close"
    assert systemone.json()["detail"]["error_type"] == "request_timeout"
    assert invocations.json()["type"] == "request_timeout"


def test_a_system_one_body_on_invocations_fails_in_the_system_one_shape():
    app = _ready_app()

    async def scenario():
        await app.state.service.start()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return [
                await client.post(p, json={**BODY, "model": "nope"})
                for p in ("/v1/systemone", "/invocations")
            ]

    responses = run(scenario())
    assert [r.status_code for r in responses] == [422, 422]
    assert responses[0].json() == responses[1].json() and responses[0].json()["detail"][0]["loc"] == [
        "body",
        "model",
    ]


def test_the_key_is_checked_in_one_place_only():
    from semif_adapter.systemone import routes

    source = Path(routes.__file__).read_text()
    assert "check_bearer" not in source and "systemone_error_response" not in source
