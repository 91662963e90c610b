"""Slow clients against ``python -m semif_adapter serve``: does the front door hold?

Opens N slow-header connections (a request line and one header byte every ``--trickle`` seconds, the header
section never completed) and M slow-body connections (complete headers announcing a body that arrives one byte
every ``--trickle`` seconds), re-opening each one the server closes, for ``--duration`` seconds. Meanwhile it
probes ``GET /ping`` every 0.1 s and scores one decision every 2 s on fresh connections. Then one 6 MB state
that cannot fit is sent while ``/ping`` is probed.

Reports: ``/ping`` p50/p99/max and failures, decision statuses, how long the server took to close slow
connections (header timeout, 408 + close), the server's open descriptors at start, peak and after, and how
long the oversized request took from first byte to its 413. Loopback only; every loop is bounded by
``--duration``.

    python benchmarks/slow_clients.py [--slow-headers 2000] [--slow-bodies 200] [--duration 60] \
        [--json benchmarks/results/slow_clients-2cpu.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import DECISION, server_stats, start_server

from semif_adapter.model.demo_models import ensure_model

RESULTS = Path(__file__).resolve().parent / "results"
JSON_BODY = {"Content-Type": "application/json"}


class Tally:
    def __init__(self) -> None:
        self.opened = 0
        self.closed_by_server: list[float] = []  # seconds from the last complete byte sequence to close
        self.statuses: dict[str, int] = {}
        self.errors = 0


async def trickle(host: str, port: int, head: bytes, args: argparse.Namespace, stop_at: float,
                  tally: Tally) -> None:  # fmt: skip
    """One slow client, again and again until ``stop_at``: send ``head``, then one byte every
    ``args.trickle`` seconds; note each response status and each close by the server."""
    while time.monotonic() < stop_at:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            tally.errors += 1
            await asyncio.sleep(0.5)
            continue
        tally.opened += 1
        writer.write(head)
        opened = time.monotonic()
        try:
            while time.monotonic() < stop_at:
                try:
                    data = await asyncio.wait_for(reader.read(4096), timeout=args.trickle)
                except TimeoutError:
                    writer.write(b"a")
                    await writer.drain()
                    continue
                if not data:
                    tally.closed_by_server.append(time.monotonic() - opened)
                    break
                if data.startswith(b"HTTP/"):
                    status = data.split(b" ", 2)[1].decode(errors="replace")
                    tally.statuses[status] = tally.statuses.get(status, 0) + 1
        except (ConnectionError, OSError):
            tally.closed_by_server.append(time.monotonic() - opened)
        finally:
            writer.close()


# A header section that never ends; a body announced and never completed.
SLOW_HEADER = b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Slow: "
SLOW_BODY = (
    b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100000\r\n\r\n{"
)


def probe_loop(
    url: str, stop: threading.Event, pings: list[tuple[int, float]], decisions: list[Any] | None
) -> None:
    """``/ping`` every 0.1 s; with ``decisions``, one decision every 2 s as well."""
    last_decision = 0.0
    while not stop.is_set():
        started = time.perf_counter()
        try:
            status = httpx.get(url + "/ping", timeout=10).status_code
        except httpx.HTTPError:
            status = 0
        pings.append((status, time.perf_counter() - started))
        if decisions is not None and time.monotonic() - last_decision >= 2:
            last_decision = time.monotonic()
            t0 = time.perf_counter()
            try:
                response = httpx.post(url + "/invocations", json={"decision": DECISION}, timeout=60)
                decisions.append((response.status_code, time.perf_counter() - t0))
            except httpx.HTTPError as exc:
                decisions.append((type(exc).__name__, time.perf_counter() - t0))
        time.sleep(0.1)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def oversized(url: str, count: int = 10) -> dict[str, Any]:
    """``count`` 6 MB bodies (a 5.3 MB JSON state of 120,000 records that cannot fit) back to back, while
    /ping is probed every 0.1 s."""
    state = [{"id": i, "name": f"item-{i}", "v": i * 3} for i in range(120_000)]
    body = json.dumps({"decision": {**DECISION, "id": "huge", "state": state}}).encode()
    stop = threading.Event()
    pings: list[tuple[int, float]] = []
    prober = threading.Thread(target=probe_loop, args=(url, stop, pings, None), daemon=True)
    prober.start()
    seconds, answers = [], []
    with httpx.Client(timeout=120) as client:
        for _ in range(count):
            started = time.perf_counter()
            response = client.post(url + "/invocations", content=body, headers=JSON_BODY)
            seconds.append(time.perf_counter() - started)
            answers.append(response)
    time.sleep(0.5)
    stop.set()
    prober.join()
    ping_s = [s for _, s in pings]
    return {
        "bodies": count,
        "body_bytes": len(body),
        "statuses": sorted({r.status_code for r in answers}),
        "type": answers[-1].json().get("type"),
        "error": answers[-1].json().get("error"),
        "request_seconds_median": round(statistics.median(seconds), 3),  # upload, parse, validate, refuse
        "ping_count": len(pings),
        "ping_p99_ms": _ms(percentile(ping_s, 0.99)),
        "ping_max_ms": _ms(max(ping_s) if ping_s else None),
    }


async def hold(host: str, port: int, args: argparse.Namespace, headers: Tally, bodies: Tally) -> None:
    stop_at = time.monotonic() + args.duration
    tasks = [trickle(host, port, SLOW_HEADER, args, stop_at, headers) for _ in range(args.slow_headers)]
    tasks += [trickle(host, port, SLOW_BODY, args, stop_at, bodies) for _ in range(args.slow_bodies)]
    await asyncio.gather(*tasks)


def run(args: argparse.Namespace) -> dict[str, Any]:
    log_path = Path(args.log)
    process, url = start_server(ensure_model(args.model), log_path, args.threads)
    host, port = url.removeprefix("http://").split(":")
    try:
        start = server_stats(process.pid)
        stop = threading.Event()
        pings: list[tuple[int, float]] = []
        decisions: list[Any] = []
        peak = {"fds": start["fds"]}

        def watch() -> None:
            while not stop.is_set():
                peak["fds"] = max(peak["fds"], server_stats(process.pid)["fds"])
                time.sleep(0.5)

        threads = [threading.Thread(target=probe_loop, args=(url, stop, pings, decisions), daemon=True),
                   threading.Thread(target=watch, daemon=True)]  # fmt: skip
        for thread in threads:
            thread.start()
        headers, bodies = Tally(), Tally()
        asyncio.run(hold(host, int(port), args, headers, bodies))
        stop.set()
        for thread in threads:
            thread.join()
        time.sleep(2)
        end = server_stats(process.pid)
        huge = oversized(url)
    finally:
        process.terminate()
        process.wait(60)
    ping_s = [s for status, s in pings if status == 200]
    return {
        "slow_headers": args.slow_headers,
        "slow_bodies": args.slow_bodies,
        "duration_s": args.duration,
        "trickle_s": args.trickle,
        "model": args.model,
        "ping": {
            "count": len(pings),
            "failed": sum(1 for status, _ in pings if status != 200),
            "p50_ms": _ms(percentile(ping_s, 0.5)),
            "p99_ms": _ms(percentile(ping_s, 0.99)),
            "max_ms": _ms(max(ping_s) if ping_s else None),
        },
        "decisions": {
            "statuses": {str(k): sum(1 for s, _ in decisions if s == k) for k in {s for s, _ in decisions}},
            "p50_s": round(statistics.median(t for _, t in decisions), 3) if decisions else None,
        },
        "slow_header_connections": _tally(headers),
        "slow_body_connections": _tally(bodies),
        "server_fds": {"start": start["fds"], "peak": peak["fds"], "after": end["fds"]},
        "oversized_state": huge,
    }


def _tally(tally: Tally) -> dict[str, Any]:
    closes = tally.closed_by_server
    return {
        "opened": tally.opened,
        "closed_by_server": len(closes),
        "close_after_s_median": round(statistics.median(closes), 2) if closes else None,
        "close_after_s_max": round(max(closes), 2) if closes else None,
        "responses": tally.statuses,
        "connect_errors": tally.errors,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slow-headers", type=int, default=2000)
    parser.add_argument("--slow-bodies", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--trickle", type=float, default=2.0, help="seconds between two slow bytes")
    parser.add_argument("--model", default="gemma")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--log", default="/tmp/slow-clients-server.log")
    parser.add_argument("--json", help="write the figures here as JSON")
    args = parser.parse_args(argv)
    figures = run(args)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    ping = figures["ping"]
    refused = figures["oversized_state"]["statuses"] == [413]
    held = ping["failed"] == 0 and (ping["p99_ms"] or 1e9) < 100 and refused
    fds = figures["server_fds"]
    settled = fds["after"] <= fds["start"] + 2
    print(f"goals: /ping p99 < 100 ms, no failure, 413 fast: {held}; fds back to baseline: {settled}",
          file=sys.stderr)  # fmt: skip
    return 0 if os.environ.get("SLOW_CLIENTS_NO_ENFORCE") or held else 1


if __name__ == "__main__":
    raise SystemExit(main())
