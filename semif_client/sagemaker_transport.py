"""Point the official ``typesafe_sdk`` client at a SageMaker endpoint.

SageMaker only forwards ``InvokeEndpoint`` to the container's ``/invocations``, which answers System
One bodies exactly like ``/v1/systemone``. This ``httpx2`` transport (the SDK's HTTP stack) turns
the SDK's ``POST /v1/systemone`` into ``InvokeEndpoint`` (IAM-signed by boto3) and hands the
container's answer or error back unchanged, so ``TypeSafeClient(transport=...)`` works as is::

    client = TypeSafeClient(api_key="unused", transport=SageMakerTransport("my-endpoint"))

Needs ``boto3`` (the ``ops`` extra) and ``typesafe-sdk``; the server itself never imports this.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2

from semif_adapter.http.body import decode_content

SAGEMAKER_MAX_PAYLOAD = 6 * 1024 * 1024  # InvokeEndpoint's request limit


def _json_response(status: int, payload: Any, request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(
        status,
        content=json.dumps(payload).encode(),
        headers={"content-type": "application/json"},
        request=request,
    )


class SageMakerTransport(httpx2.BaseTransport):
    """``POST …/v1/systemone`` → ``sagemaker-runtime:InvokeEndpoint``; other paths are 404."""

    def __init__(self, endpoint_name: str, *, client: Any = None, region_name: str | None = None) -> None:
        if client is None:
            import boto3

            client = boto3.client("sagemaker-runtime", region_name=region_name)
        self.endpoint_name = endpoint_name
        self.client = client

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method != "POST" or not request.url.path.endswith("/v1/systemone"):
            message = (
                f"{request.method} {request.url.path} has no SageMaker equivalent; only POST /v1/systemone"
            )
            return _json_response(404, {"detail": {"error_type": "not_found", "message": message}}, request)
        # SageMaker does not forward Content-Encoding, so a compressed SDK body is decoded here.
        body = decode_content(request.read(), request.headers.get("content-encoding"), SAGEMAKER_MAX_PAYLOAD)
        from botocore.exceptions import ClientError

        try:
            result = self.client.invoke_endpoint(
                EndpointName=self.endpoint_name,
                Body=body,
                ContentType="application/json",
                Accept="application/json",
            )
        except ClientError as error:
            return self._error(error, request)
        return httpx2.Response(
            200,
            content=result["Body"].read(),
            headers={"content-type": result.get("ContentType", "application/json")},
            request=request,
        )

    def _error(self, error: Any, request: httpx2.Request) -> httpx2.Response:
        """A container error (``ModelError``) comes back as sent; AWS errors keep their own status."""
        info = error.response.get("Error", {})
        if info.get("Code") == "ModelError" and error.response.get("OriginalStatusCode"):
            return httpx2.Response(
                int(error.response["OriginalStatusCode"]),
                content=str(error.response.get("OriginalMessage", "")).encode(),
                headers={"content-type": "application/json"},
                request=request,
            )
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 502))
        detail = {
            "error_type": info.get("Code", "sagemaker_error"),
            "message": info.get("Message", str(error)),
        }
        return _json_response(status, {"detail": detail}, request)
