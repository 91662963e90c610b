"""Jev-compatible System One API (``/v1/systemone``, ``/v1/models``) on top of the decision engine.

The lead's ``/invocations`` handler serves System One bodies through one call::

    if is_systemone_payload(payload):
        return await answer_systemone_invocation(request, service, payload)

``answer_systemone`` (a dict, or raises) and ``systemone_error_response`` are the two halves of it.
"""

from semif_adapter.systemone.errors import SystemOneValidationError, systemone_error_response
from semif_adapter.systemone.routes import respond as answer_systemone_invocation
from semif_adapter.systemone.routes import router as systemone_router
from semif_adapter.systemone.service import answer_systemone, is_systemone_payload

__all__ = [
    "SystemOneValidationError",
    "answer_systemone",
    "answer_systemone_invocation",
    "is_systemone_payload",
    "systemone_error_response",
    "systemone_router",
]
