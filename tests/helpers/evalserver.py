"""A real local HTTP server speaking the three wire formats the benchmark targets, minimally.

It is a stand-in for a decision server (not the project's server: the lead's end-to-end test covers
that). Answers come from a per-task logits table so tests can compute the expected metrics
independently; it answers semif requests with options in *reverse* order to prove the client aligns
by id, and can answer 503 to the first attempt of chosen tasks (slowly) to prove retry accounting.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from semif_adapter.eval.tasks import Task

DEVSET = Path(__file__).resolve().parents[1] / "data" / "decision-devset.jsonl"


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


@dataclass
class ServerState:
    logits: dict[str, list[float]]  # task id -> logits in label order
    chat_replies: dict[str, str] = field(default_factory=dict)  # task id -> reply text
    tasks: dict[str, Task] = field(default_factory=dict)
    busy_first: set[str] = field(default_factory=set)
    always_busy: set[str] = field(default_factory=set)
    busy_delay_s: float = 0.0
    ok_delay_s: float = 0.0
    attempts: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(state: ServerState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep test output quiet
            return

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _busy(self, task_id: str) -> bool:
            with state.lock:
                state.attempts[task_id] += 1
                first = state.attempts[task_id] == 1
            if (first and task_id in state.busy_first) or task_id in state.always_busy:
                time.sleep(state.busy_delay_s)
                self._send(
                    503, {"error": "busy", "type": "model_busy", "retryable": True}, {"Retry-After": "0"}
                )
                return True
            time.sleep(state.ok_delay_s)
            return False

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/invocations":
                self._invocations(body)
            elif self.path == "/v1/systemone":
                self._systemone(body)
            elif self.path == "/v1/chat/completions":
                self._chat(body)
            else:
                self._send(404, {"error": "not found", "type": "not_found"})

        def _invocations(self, body: dict[str, Any]) -> None:
            decision = body["decision"]
            if decision["id"] not in state.logits:
                self._send(400, {"error": "unknown decision", "type": "invalid_request"})
                return
            if self._busy(decision["id"]):
                return
            ids = [o["id"] for o in decision["options"]]
            task = state.tasks[decision["id"]]
            by_label = dict(zip(task.labels, state.logits[decision["id"]], strict=True))
            logits = np.asarray([by_label[i] for i in ids])
            probs = softmax(logits)
            order = list(reversed(range(len(ids))))
            self._send(
                200,
                {
                    "result": {
                        "id": decision["id"],
                        "option_ids": [ids[i] for i in order],
                        "probabilities": [float(probs[i]) for i in order],
                        "option_logits": [float(logits[i]) for i in order],
                        "calibration": None,
                        "prompt_version": "test-v1",
                        "model": {"sha256": "ab" * 32},
                    }
                },
            )

        def _systemone(self, body: dict[str, Any]) -> None:
            answers = {}
            for qid, question in body["questions"].items():
                if self._busy(qid):
                    return
                logits = np.asarray(state.logits[qid])
                probs = softmax(logits)
                qtype = question["type"]
                if qtype == "noul":
                    answers[qid] = {
                        "type": "noul",
                        "noul": float(probs[1]),
                        "x_option_logits": {"false": float(logits[0]), "true": float(logits[1])},
                    }
                    continue
                names = (
                    list(question["criteria"])
                    if qtype == "choice"
                    else [str(i) for i in range(len(question["criteria"]))]
                )
                table = {n: float(p) for n, p in zip(names, probs, strict=True)}
                answer = {
                    "type": qtype,
                    "probabilities": table,
                    "confidence": float(probs.max()),
                    "x_option_logits": {n: float(v) for n, v in zip(names, logits, strict=True)},
                }
                if qtype == "choice":
                    answer["choice"] = names[int(np.argmax(probs))]
                else:
                    answer["score"] = float(np.dot(np.arange(len(names)), probs))
                    answer["legend"] = {str(i): level for i, level in enumerate(question["criteria"])}
                answers[qid] = answer
            self._send(200, {"model": body["model"], "answers": answers, "usage": {"input_tokens": 1}})

        def _chat(self, body: dict[str, Any]) -> None:
            content = body["messages"][-1]["content"]
            matches = [
                tid
                for tid, task in state.tasks.items()
                if tid in state.chat_replies
                and f"State:\n{task.state}\n" in content
                and f"Question: {task.question.instructions}\n" in content
            ]
            if len(matches) != 1:
                self._send(400, {"error": f"cannot tell the task ({len(matches)} matches)"})
                return
            if self._busy(matches[0]):
                return
            reply = state.chat_replies[matches[0]]
            self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]})

    return Handler


@dataclass
class LocalServer:
    url: str
    state: ServerState


def oracle_logits(tasks: list[Task], seed: int = 7, skill: float = 2.0) -> dict[str, list[float]]:
    """Noisy logits that favour the right answer: a deterministic mix of right and wrong argmaxes."""
    rng = np.random.default_rng(seed)
    table = {}
    for task in tasks:
        z = rng.normal(size=len(task.labels))
        z[task.expected_index] += skill
        table[task.id] = [float(v) for v in z]
    return table


@contextmanager
def serve(state: ServerState) -> Iterator[LocalServer]:
    """Run the stand-in server on a free port for the duration of the block."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield LocalServer(f"http://127.0.0.1:{httpd.server_address[1]}", state)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
