"""Where benchmark requests go: a semif/System One URL, a SageMaker endpoint, or a chat-completions server.

A target does exactly one attempt per :meth:`request` call and raises :class:`Retryable` on a 503, so
the runner owns retries, backoff and timing for every target alike. :meth:`parse` turns the decoded
payload into a :class:`~semif_adapter.eval.mapping.Prediction` aligned with the task's labels.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Literal, Protocol

import httpx

from semif_adapter.eval.chat import build_chat_request, parse_chat_reply
from semif_adapter.eval.mapping import (
    DEFAULT_SYSTEMONE_MODEL,
    Prediction,
    parse_semif_response,
    parse_systemone_response,
    task_to_invocation,
    task_to_systemone_request,
)
from semif_adapter.eval.tasks import Task

Protocol_ = Literal["semif", "systemone"]
PROTOCOLS: tuple[str, ...] = ("semif", "systemone")
_ERROR_BODY_CHARS = 300


class Retryable(Exception):
    """The target said 503 (busy / not ready); the runner backs off and tries again."""

    def __init__(self, message: str, *, status: int = 503, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class TargetError(Exception):
    """A failed request that retrying will not fix (4xx, 5xx other than 503, transport error)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Target(Protocol):
    name: str

    def describe(self) -> dict[str, Any]: ...

    def request(self, task: Task) -> Any: ...

    def parse(self, task: Task, payload: Any) -> Prediction: ...

    def close(self) -> None: ...


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP-date Retry-After: fall back to our own backoff


def _body_for(task: Task, protocol: str, systemone_model: str) -> dict[str, Any]:
    if protocol == "semif":
        return task_to_invocation(task)
    return task_to_systemone_request(task, systemone_model)


def _parse_for(task: Task, protocol: str, payload: Any) -> Prediction:
    if protocol == "semif":
        return parse_semif_response(task, payload)
    return parse_systemone_response(task, payload)


class _HttpBase:
    """Thread-local httpx clients so concurrent workers keep their own keep-alive connections."""

    def __init__(self, timeout_s: float, api_key: str | None) -> None:
        self.timeout_s = timeout_s
        self.api_key = api_key
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()

    def _client(self) -> httpx.Client:
        client = getattr(self._local, "client", None)
        if client is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            client = httpx.Client(timeout=self.timeout_s, headers=headers)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def _post(self, url: str, body: dict[str, Any]) -> Any:
        try:
            response = self._client().post(url, json=body)
        except httpx.HTTPError as exc:
            raise TargetError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code == 503:
            raise Retryable(
                f"503 from {url}", retry_after_s=_retry_after(response.headers.get("retry-after"))
            )
        if response.status_code != 200:
            raise TargetError(
                f"HTTP {response.status_code}: {response.text[:_ERROR_BODY_CHARS]}",
                status=response.status_code,
            )
        try:
            return response.json()
        except ValueError as exc:
            raise TargetError("response is not JSON", status=response.status_code) from exc

    def close(self) -> None:
        with self._lock:
            for client in self._clients:
                client.close()
            self._clients.clear()


class HttpTarget(_HttpBase):
    """``POST {url}/invocations`` (semif) or ``POST {url}/v1/systemone`` (System One)."""

    def __init__(
        self,
        url: str,
        protocol: str = "semif",
        *,
        name: str | None = None,
        timeout_s: float = 120.0,
        api_key: str | None = None,
        systemone_model: str = DEFAULT_SYSTEMONE_MODEL,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        super().__init__(timeout_s, api_key)
        self.url = url.rstrip("/")
        self.protocol = protocol
        self.systemone_model = systemone_model
        self.endpoint = f"{self.url}/invocations" if protocol == "semif" else f"{self.url}/v1/systemone"
        self.name = name or f"{self.url} ({protocol})"

    def describe(self) -> dict[str, Any]:
        return {"kind": "http", "url": self.url, "protocol": self.protocol, "endpoint": self.endpoint}

    def request(self, task: Task) -> Any:
        return self._post(self.endpoint, _body_for(task, self.protocol, self.systemone_model))

    def parse(self, task: Task, payload: Any) -> Prediction:
        return _parse_for(task, self.protocol, payload)


class ChatTarget(_HttpBase):
    """An OpenAI-compatible chat-completions server: decision by generation, parsed from the reply."""

    def __init__(
        self,
        chat_url: str,
        *,
        model: str = "default",
        name: str | None = None,
        timeout_s: float = 120.0,
        api_key: str | None = None,
        max_tokens: int = 8,
    ) -> None:
        super().__init__(timeout_s, api_key)
        url = chat_url.rstrip("/")
        if not url.endswith("/chat/completions"):
            url = url + ("/chat/completions" if url.endswith("/v1") else "/v1/chat/completions")
        self.endpoint = url
        self.model = model
        self.max_tokens = max_tokens
        self.name = name or f"{url} (generation)"

    def describe(self) -> dict[str, Any]:
        return {"kind": "chat", "endpoint": self.endpoint, "model": self.model, "max_tokens": self.max_tokens}

    def request(self, task: Task) -> Any:
        return self._post(self.endpoint, build_chat_request(task, self.model, self.max_tokens))

    def parse(self, task: Task, payload: Any) -> Prediction:
        return parse_chat_reply(task, payload)


def _status_of_client_error(exc: Any) -> int | None:
    response = getattr(exc, "response", None) or {}
    original = response.get("OriginalStatusCode")
    if isinstance(original, int):
        return original  # ModelError: the container's own status
    code = (response.get("Error") or {}).get("Code", "")
    if code in ("ServiceUnavailable", "ServiceUnavailableException"):
        return 503
    return (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")


class SageMakerTarget:
    """``sagemaker-runtime`` InvokeEndpoint with either protocol's body.

    botocore's own retries are switched off so every 503 reaches the runner and is counted once.
    """

    def __init__(
        self,
        endpoint_name: str,
        *,
        region: str | None = None,
        protocol: str = "semif",
        client: Any = None,
        name: str | None = None,
        systemone_model: str = DEFAULT_SYSTEMONE_MODEL,
        timeout_s: float = 120.0,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        if client is None:
            import boto3
            from botocore.config import Config

            client = boto3.client(
                "sagemaker-runtime",
                region_name=region,
                config=Config(retries={"total_max_attempts": 1}, read_timeout=timeout_s),
            )
        self.client = client
        self.endpoint_name = endpoint_name
        self.region = region or getattr(getattr(client, "meta", None), "region_name", None)
        self.protocol = protocol
        self.systemone_model = systemone_model
        self.name = name or f"sagemaker:{endpoint_name} ({protocol})"

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "sagemaker",
            "endpoint_name": self.endpoint_name,
            "region": self.region,
            "protocol": self.protocol,
        }

    def request(self, task: Task) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        body = json.dumps(_body_for(task, self.protocol, self.systemone_model)).encode("utf-8")
        try:
            response = self.client.invoke_endpoint(
                EndpointName=self.endpoint_name,
                ContentType="application/json",
                Accept="application/json",
                Body=body,
            )
        except ClientError as exc:
            status = _status_of_client_error(exc)
            if status == 503:
                raise Retryable(f"503 from endpoint {self.endpoint_name}: {exc}") from exc
            raise TargetError(f"{exc}", status=status) from exc
        except BotoCoreError as exc:
            raise TargetError(f"{type(exc).__name__}: {exc}") from exc
        raw = response["Body"].read()
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise TargetError("endpoint response is not JSON", status=200) from exc

    def parse(self, task: Task, payload: Any) -> Prediction:
        return _parse_for(task, self.protocol, payload)

    def close(self) -> None:
        return None


_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def slug(name: str) -> str:
    """A file-name-safe form of a target name (for report file names)."""
    return _SAFE_NAME.sub("-", name).strip("-") or "run"
