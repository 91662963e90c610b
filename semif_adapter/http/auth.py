"""The optional API key: when ``SEMIF_API_KEY`` is set, every route reaching the model or its data needs it.

``/ping`` stays open (an orchestrator's health check carries no key), so does the OpenAPI description;
``/metrics`` too when
``SEMIF_METRICS_OPEN`` says so. The key is compared in constant time. SageMaker's ``InvokeEndpoint`` cannot
send an ``Authorization`` header (IAM guards it instead), so the key is for servers run outside SageMaker.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping

from semif_adapter.errors import SemifError

# The health check, and the API's own description (no model, no data behind them).
OPEN_PATHS = frozenset({"/ping", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


class AuthenticationFailed(SemifError):
    code = "authentication_error"
    status = 401


def requires_key(path: str, api_key: str | None, metrics_open: bool) -> bool:
    if not api_key or path in OPEN_PATHS:
        return False
    return not (metrics_open and path == "/metrics")


def check_bearer(authorization: str | None, api_key: str | None) -> None:
    """Raise :class:`AuthenticationFailed` unless ``authorization`` is ``Bearer <api_key>``."""
    if not api_key:
        return
    scheme, _, token = (authorization or "").partition(" ")
    presented = token.strip().encode("utf-8", "surrogateescape") if scheme.lower() == "bearer" else b""
    if not hmac.compare_digest(presented, api_key.encode("utf-8")):
        message = "missing API key" if not authorization else "invalid API key"
        raise AuthenticationFailed(f"{message}: send 'Authorization: Bearer <key>'")


def on_sagemaker(environ: Mapping[str, str] = os.environ) -> bool:
    """SageMaker hosting sets SAGEMAKER_* variables (e.g. SAGEMAKER_BIND_TO_PORT) in the container."""
    return any(name.startswith("SAGEMAKER_") for name in environ)
