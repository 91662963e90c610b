"""Command line: `semif-adapter serve` (SageMaker runs images with the argument `serve`), plus tools."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from semif_adapter.errors import SemifError
from semif_adapter.settings import Settings

log = logging.getLogger("semif_adapter")
# After the grace period, time for an aborted request to stop (within one decode call) and be answered.
ABORT_MARGIN_S = 5.0


def _settings_or_exit() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"SEMIF_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors()
        )
        print(f"semif-adapter: invalid settings: {problems}", file=sys.stderr)
        raise SystemExit(2) from exc


def _graceful_server(config: Any, service: Any = None, grace_s: float = 0.0) -> Any:
    """A uvicorn server that answers every request it accepted, then exits 0.

    On SIGTERM it stops listening and refuses new requests (``/ping`` 503); requests already running get
    ``grace_s`` to finish, then are aborted through their deadline token and answered with a retryable JSON
    503 ``shutting_down`` — before uvicorn's own graceful timeout (``grace_s`` + 5 s) would cut them off
    with a plain-text 500. uvicorn re-raises the captured SIGTERM once it has drained, so the process would
    die "by signal" (exit 143 under Docker) although every request was answered: that is swallowed.
    """
    import asyncio

    import uvicorn

    class GracefulServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                yield
                getattr(self, "_captured_signals", []).clear()

        async def shutdown(self, sockets: Any = None) -> None:
            timer = None
            if service is not None:
                service.begin_shutdown()
                timer = asyncio.get_running_loop().call_later(grace_s, service.abort_in_flight)
            try:
                await super().shutdown(sockets)
            finally:
                if timer is not None:
                    timer.cancel()

    return GracefulServer(config)


def serve(_: argparse.Namespace) -> int:
    import uvicorn

    from semif_adapter.app import create_app
    from semif_adapter.batch_transform import BatchTransformMismatch, fit_to_batch_transform
    from semif_adapter.engine import DecisionEngine
    from semif_adapter.http.auth import on_sagemaker
    from semif_adapter.http.connections import default_max_connections, guarded_protocol, raise_fd_limit
    from semif_adapter.logs import configure_logging
    from semif_adapter.model.discovery import discover_gguf

    try:
        settings, fitted = fit_to_batch_transform(_settings_or_exit())
    except BatchTransformMismatch as exc:
        print(f"semif-adapter: batch transform: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    for line in fitted:
        log.info(line)
    try:
        gguf = discover_gguf(settings)
    except SemifError as exc:
        log.error("model load failed: %s", exc)
        return 1
    fatal: list[str] = []
    server: uvicorn.Server | None = None

    def on_fatal(reason: str) -> None:
        fatal.append(reason)
        if server is not None:
            server.should_exit = True  # SageMaker surfaces a non-zero exit as the failure reason

    if settings.api_key and on_sagemaker():
        log.warning(
            "SEMIF_API_KEY is set on SageMaker: InvokeEndpoint cannot send an Authorization header, so every "
            "invocation will get 401; IAM already guards InvokeEndpoint, unset the key there"
        )
    app = create_app(settings, lambda: DecisionEngine.load(settings.for_engine(), gguf), on_fatal=on_fatal)
    fd_limit = raise_fd_limit()
    max_connections = settings.max_connections or default_max_connections(fd_limit)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=guarded_protocol(settings.header_timeout_s, max_connections, settings.retry_after_s),
        log_config=None,
        access_log=False,
        timeout_keep_alive=75,  # longer than SageMaker's 60 s invocation timeout
        timeout_graceful_shutdown=settings.shutdown_grace_s + ABORT_MARGIN_S,  # type: ignore[arg-type]  # a float works; the hint says int
        lifespan="on",
    )
    server = _graceful_server(config, app.state.service, settings.shutdown_grace_s)
    log.info("starting", extra={"host": settings.host, "port": settings.port, "gguf": str(gguf)})
    server.run()
    return 1 if fatal else 0


def score(args: argparse.Namespace) -> int:
    """One-shot scoring without a server: read a request JSON, print the response JSON."""
    from semif_adapter.engine import DecisionEngine
    from semif_adapter.model.discovery import discover_gguf
    from semif_adapter.protocol import InvocationRequest

    settings = _settings_or_exit()
    logging.basicConfig(level=logging.WARNING)
    text = sys.stdin.read() if args.request == "-" else Path(args.request).read_text()
    try:
        request = InvocationRequest.model_validate_json(text)
        engine = DecisionEngine.load(settings.for_engine(), discover_gguf(settings))
        batch = engine.score(request.all_decisions)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        print(f"semif-adapter: {where}: {first['msg']}", file=sys.stderr)
        return 1
    except SemifError as exc:
        print(f"semif-adapter: {exc}", file=sys.stderr)
        return 1
    if request.decision is not None:
        out = {"result": batch.results[0].model_dump(mode="json")}
    else:
        out = batch.model_dump(mode="json")
    json.dump(out, sys.stdout, indent=2, ensure_ascii=False)
    print()
    return 0


def demo_models(args: argparse.Namespace) -> int:
    from semif_adapter.model.demo_models import main as demo_main

    return demo_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="semif-adapter", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="run the HTTP server (settings from SEMIF_* environment)")
    p_serve.set_defaults(func=serve)
    p_score = sub.add_parser("score", help="score one request file without a server")
    p_score.add_argument("request", help="request JSON file ({'decision': …} or {'decisions': […]}), or -")
    p_score.set_defaults(func=score)
    p_models = sub.add_parser("demo-models", help="assemble the embedded demo/test GGUFs")
    p_models.add_argument("rest", nargs=argparse.REMAINDER)
    p_models.set_defaults(func=demo_models)
    from semif_adapter.eval.cli import add_parser as add_eval_subcommands  # stdlib at import; the rest lazily

    add_eval_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
