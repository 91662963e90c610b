"""The FastAPI app: wires the service, the middleware, the error handlers and both APIs' routers.

Request flow: read the whole body (bounded) → parse and validate → admit to the engine (or 503) →
render. Every error is JSON with a stable ``type``; a caller's mistake is always a 4xx.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI

from semif_adapter import __version__
from semif_adapter.decisions.routes import openapi_schema
from semif_adapter.decisions.routes import router as decision_router
from semif_adapter.http.error_handlers import install_error_handlers, renderer_for
from semif_adapter.http.framing import AmbiguousFramingGuard
from semif_adapter.http.middleware import observe
from semif_adapter.metrics import Metrics
from semif_adapter.serving import DecisionService, Engine
from semif_adapter.settings import Settings
from semif_adapter.systemone.routes import router as systemone_router


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Load the model in the background (``/ping`` says 503 meanwhile); on exit, stop the engine."""
    service: DecisionService = app.state.service
    loader = asyncio.create_task(service.start())
    app.state.loader = loader
    try:
        yield
    finally:
        if not loader.done():
            await loader
        await service.shutdown()


def create_app(
    settings: Settings,
    engine_factory: Callable[[], Engine],
    *,
    on_fatal: Callable[[str], None] | None = None,
) -> FastAPI:
    metrics = Metrics()
    app = FastAPI(
        title="semif-adapter",
        version=__version__,
        description="Probabilities over declared options, read from a GGUF model's last-position logits.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.service = DecisionService(settings, engine_factory, metrics, on_fatal=on_fatal)
    app.state.metrics = metrics
    # Starlette runs the last added middleware first: observe wraps the framing guard's answers too.
    app.add_middleware(AmbiguousFramingGuard, renderer_for=renderer_for)
    app.middleware("http")(observe)
    install_error_handlers(app)
    app.include_router(decision_router)
    app.include_router(systemone_router)
    app.openapi = partial(openapi_schema, app)  # type: ignore[method-assign]
    return app
