"""Peer benchmark: our server against the stock llama-server, side by side, per item, same GGUF.

llama-server is what a user of the llama.cpp DLC would run instead: one process, its prompt cache on
(default), a host-memory cache (``--cache-ram``, default), 4 slots. It is built from the llama.cpp that
llama-cpp-python vendors, with the same portable CPU flags as the binding (``make bench-peer`` passes
the Makefile's ``LLAMA_CMAKE_ARGS``), and cached under ``$XDG_CACHE_HOME/semif-adapter/llama-server``;
``--llama-server PATH`` (or ``SEMIF_PEER_LLAMA_SERVER``) uses a binary you already have.

Both servers get the same prompt text: our engine's prompt (the GGUF's template around state, question and
labelled options) is sent to llama-server's ``/completion`` with ``n_predict: 1`` and ``n_probs``
(pre-sampling probabilities of the last position: a softmax over the whole vocabulary), and each option's
probability is its label token's probability renormalised over the labels — the readout our engine does.
Workloads, each item sent to both servers back to back (the side that goes first alternates):

* cold singles: 6 single decisions, each on a new ~1.2k-token state;
* 8 on one state: 8 decisions about one new state — one request to us, 8 requests to llama-server;
* agent loop: 4 agents × 6 turns, round robin; each turn the agent's state gains one tool event and asks two
  decisions (one request to us, two to llama-server). ``--agent-state json`` (default) sends the state as a
  JSON array of events, ``text`` as lines of text. Its first turns (each agent's cold prompt, where flash
  attention tells) and its warm turns are also reported apart.

* cold singles, flash attention apart: ``--attention-singles`` more cold singles (states of their own),
  each sent to us, to llama-server as above and to a second llama-server with ``-fa off`` (the order
  rotates). llama-server's default (``-fa auto``) turns flash attention on on CPU; our invariant numerics
  keep it off (``docs/design.md``: its kernel changes with the number of query rows in a call). The
  ratio against ``-fa off`` is the cold-path gap with attention computed the same way on both sides.

* 4 agents at once: 4 other agents × ``--turns`` turns, each turn all four send their request together
  (2 decisions each): ours batched (the 4 requests in flight at once, decoded in shared calls; a layout
  that decodes one request per call, ``SEMIF_KV_LAYOUT=tiled``, queues the rest), ours one
  at a time (a second server of ours, ``SEMIF_MAX_BATCH_REQUESTS=1``, the same requests one after another)
  and llama-server (4 clients at once, its 4 slots); wall time of the warm turns (all but the first), and
  the largest |Δp| between our two servers (bit-identical answers give 0).

``--hybrid`` adds a Qwen3.5-shaped model (``tests/helpers/random_models.py`` ``QWEN35_08B``: random
weights, the production architecture at 0.8B-class shapes, quantized to Q4_K_M by the vendored
``llama-quantize``; compute does not depend on the weights' values), with ``--hybrid-turns`` and
``--hybrid-singles`` to keep its row short.

Then every single decision and every agent's first turn is asked again (drift: the largest change of any
probability between the first and the second answer, per side). Ratios are ours ÷ llama-server wall time
over HTTP on one machine; the load average is recorded beside them.

    python benchmarks/peer_llama_server.py [--models gemma qwen] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import math
import os
import platform
import random
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version as package_version
from pathlib import Path

from engine_overhead import QUESTIONS  # the 8 questions of the sharing benchmark (run as a script)

from semif_adapter.engine import DecisionEngine, kernels
from semif_adapter.engine.prompt import decision_text
from semif_adapter.model.demo_models import MODELS, ensure_model
from semif_adapter.protocol import state_to_text
from semif_adapter.settings import Settings
from semif_ops.cache import cache_home

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers.random_models import SHAPES, build_shaped

REPO = Path(__file__).resolve().parent.parent
N_PROBS = 64  # labels outside llama-server's top list are counted as missing, never guessed
WORDS = (
    "invoice refund order queue worker latency database replica deploy rollback customer partner webhook "
    "retry timeout cache region shard ticket escalation dashboard alert billing contract schema index"
).split()
TOOLS = ["http_get", "sql", "search", "read_file", "shell", "calendar"]
ACTIONS = ["reply", "search", "run tool", "ask human", "wait", "stop"]


# --- llama-server: find or build -------------------------------------------------------------------
def find_sdist(version: str) -> Path:
    """The llama-cpp-python sdist (it vendors llama.cpp): a cached copy, else ``pip download``."""
    name = f"llama_cpp_python-{version}.tar.gz"
    for candidate in sorted(cache_home().rglob(name)):
        if tarfile.is_tarfile(candidate):
            return candidate
    target = cache_home() / "sdists" / version
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(target),
            f"llama-cpp-python=={version}",
        ],
        check=True,
    )
    return target / name


def build_llama_server(cmake_args: str) -> Path:
    """Build llama-server (static, no web UI, no network features) once per binding version and flags."""
    return build_llama_tool("llama-server", cmake_args)


def build_llama_tool(target: str, cmake_args: str) -> Path:
    """Build one llama.cpp tool (``llama-server``, ``llama-quantize``) from the vendored sources, once per
    binding version, flags and CPU."""
    version = package_version("llama-cpp-python")
    machine = " ".join(sorted(kernels.read_cpu_flags()))  # native flags compile for this CPU only
    salt = "" if target == "llama-server" else f" {target}"  # llama-server keeps its cache key
    key = hashlib.sha256(f"{version} {cmake_args} {machine}{salt}".encode()).hexdigest()[:16]
    binary = cache_home() / target / key / target
    if binary.is_file():
        return binary
    sdist = find_sdist(version)
    print(f"building {target} from {sdist} ({cmake_args or 'default flags'})", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="llama-server-") as tmp:
        prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
            archive.extractall(tmp, members=members, filter="data")
        source = Path(tmp) / prefix
        if not (source / "tools" / "server" / "CMakeLists.txt").is_file():
            raise SystemExit(f"{sdist} has no tools/server: pass --llama-server PATH")
        build = Path(tmp) / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(
            [
                "cmake",
                "-S",
                str(source),
                "-B",
                str(build),
                *generator,
                "-DCMAKE_BUILD_TYPE=Release",
                *shlex.split(cmake_args),
                "-DBUILD_SHARED_LIBS=OFF",
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_TOOLS=ON",
                "-DLLAMA_BUILD_SERVER=ON",
                "-DLLAMA_BUILD_APP=OFF",
                "-DLLAMA_CURL=OFF",
                "-DLLAMA_OPENSSL=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF",
                "-DLLAMA_BUILD_UI=OFF",
            ],
            check=True,
        )
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(build), "--target", target, "-j", jobs], check=True)
        binary.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(build / "bin" / target, binary)
    return binary


#: The CPU flags a native build would compile for, as ggml's options (an x86 build without -march=native).
GGML_X86_OPTIONS = {
    "sse4_2": "GGML_SSE42",
    "avx": "GGML_AVX",
    "avx_vnni": "GGML_AVX_VNNI",
    "avx2": "GGML_AVX2",
    "bmi2": "GGML_BMI2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}


def server_cmake_args(cmake_args: str) -> str:
    """llama-server's flags: the wheel's, except that on a CPU that advertises AMX a native build is
    spelled out feature by feature without AMX. ggml's AMX buffer type crashed llama-server's first
    decode on an Intel VM (a general protection fault, as it crashed our engine before
    ``kernels.extra_buffers`` kept it off), and -march=native compiles it in whatever ``GGML_AMX_*``
    say; repacking stays on, as llama-server defaults."""
    flags = kernels.read_cpu_flags()
    if not (kernels.AMX_FLAGS & flags and "-DGGML_NATIVE=ON" in shlex.split(cmake_args)):
        return cmake_args
    options = [f"-D{option}=ON" for flag, option in GGML_X86_OPTIONS.items() if flag in flags]
    kept = [a for a in shlex.split(cmake_args) if a != "-DGGML_NATIVE=ON"]
    return shlex.join([*kept, "-DGGML_NATIVE=OFF", *options])


def llama_server_binary(args: argparse.Namespace) -> Path:
    given = args.llama_server or os.environ.get("SEMIF_PEER_LLAMA_SERVER")
    if given:
        return Path(given)
    return build_llama_server(server_cmake_args(args.cmake_args))


# --- two servers ------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Client:
    """HTTP to a local server, a new connection per request (servers close idle keep-alive ones)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def post(self, path: str, body: dict) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=900)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        if response.status != 200:
            raise RuntimeError(f"POST {path} on :{self.port}: {response.status} {data[:300]!r}")
        return json.loads(data)

    def ready(self, path: str) -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            conn.request("GET", path)
            return conn.getresponse().status == 200
        except OSError:
            return False


@contextlib.contextmanager
def running(
    command: list[str], env: dict[str, str], port: int, ready_path: str, log: Path
) -> Iterator[Client]:
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    client = Client(port)
    try:
        deadline = time.monotonic() + 300
        while not client.ready(ready_path):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} did not come up; see {log}")
            time.sleep(0.5)
        yield client
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def ours_command(
    gguf: Path, threads: int, port: int, extra: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    env = {
        **os.environ,
        "SEMIF_GGUF_PATH": str(gguf),
        "SEMIF_N_THREADS": str(threads),
        "SEMIF_HOST": "127.0.0.1",
        "SEMIF_PORT": str(port),
        "SEMIF_LOG_LEVEL": "warning",
        "SEMIF_VERIFY_MANIFEST": "false",
        # as llama-server runs: the engine at the same CPU priority, no per-request deadline
        "SEMIF_ENGINE_NICE": "0",
        "SEMIF_REQUEST_TIMEOUT_S": "0",
        **(extra or {}),
    }
    return [sys.executable, "-m", "semif_adapter", "serve"], env


def theirs_command(binary: Path, gguf: Path, threads: int, port: int, slots: int, n_ctx: int) -> list[str]:
    return [
        str(binary),
        "-m",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-np",
        str(slots),
        "-c",
        str(n_ctx * slots),
        "--no-webui",
    ]


# --- workloads --------------------------------------------------------------------------------------
def sentence(rng: random.Random) -> str:
    words = rng.sample(WORDS, 7)
    tail = f"({rng.randint(1, 999)} ms, id {rng.randint(1000, 9999)})"
    return f"{words[0].capitalize()} {' '.join(words[1:])} {tail}."


def text_state(engine: DecisionEngine, rng: random.Random, target: int) -> str:
    lines: list[str] = []
    while len(engine.runtime.tokenize("\n".join(lines), False)) < target:
        lines.extend(f"[{len(lines):03d}] {sentence(rng)}" for _ in range(8))
    return "\n".join(lines)


def tool_event(rng: random.Random, step: int) -> dict:
    tool = rng.choice(TOOLS)
    return {"step": step, "role": "tool", "name": tool, "content": sentence(rng)}


def decision(id_: str, state: object, question: str, options: list[str]) -> dict:
    return {"id": id_, "state": state, "question": question, "options": [{"id": o} for o in options]}


@dataclass
class Agent:
    index: int
    json_state: bool
    rng: random.Random
    events: list[dict] = field(default_factory=list)

    def state(self) -> object:
        if self.json_state:
            return list(self.events)
        return "\n".join(f"[{e['step']:03d}] {e['role']} {e['name']}: {e['content']}" for e in self.events)

    def grow(self) -> None:
        self.events.append(tool_event(self.rng, len(self.events)))

    def turn(self, turn: int) -> list[dict]:
        state = self.state()
        return [
            decision(f"a{self.index}t{turn}-next", state, "What should the agent do next?", ACTIONS),
            decision(f"a{self.index}t{turn}-done", state, "Is the ticket resolved?", ["yes", "no"]),
        ]


def make_agent(engine: DecisionEngine, index: int, json_state: bool, start_tokens: int) -> Agent:
    agent = Agent(index, json_state, random.Random(1000 + index))
    agent.events.append(
        {
            "step": 0,
            "role": "user",
            "name": "customer",
            "content": f"Resolve ticket #{4000 + index} end to end.",
        }
    )
    while True:
        text = json.dumps(agent.state()) if json_state else str(agent.state())
        if len(engine.runtime.tokenize(text, False)) >= start_tokens:
            return agent
        agent.grow()


# --- asking both sides ---------------------------------------------------------------------------------
@dataclass
class Side:
    name: str
    seconds: float = 0.0
    #: of ``seconds``, the agent loop's first turns (each agent's cold prompt)
    first_turn_seconds: float = 0.0
    requests: int = 0
    answers: dict[str, list[float]] = field(default_factory=dict)
    drift: float = 0.0
    missing_labels: int = 0


def ask_ours(client: Client, decisions: list[dict]) -> dict[str, list[float]]:
    reply = client.post("/invocations", {"decisions": decisions})
    return {r["id"]: r["probabilities"] for r in reply["results"]}


def prompt_text(engine: DecisionEngine, item: dict) -> str:
    """Our engine's prompt for one decision as text: template head, state, question, options, tail."""
    labels = engine.labels.take(len(item["options"]))[0]
    state = item["state"] if isinstance(item["state"], str) else state_to_text(item["state"])
    options = [(label, option["id"]) for label, option in zip(labels, item["options"], strict=True)]
    text = decision_text(engine.scaffold, state, item["question"], options)
    return engine.scaffold.head + text.prefix_user + text.suffix_user + engine.scaffold.tail


def ask_theirs(
    client: Client, engine: DecisionEngine, decisions: list[dict], side: Side
) -> dict[str, list[float]]:
    """One /completion per decision on our prompt text (llama-server tokenizes it, as a user's would)."""
    out: dict[str, list[float]] = {}
    for item in decisions:
        reply = client.post(
            "/completion",
            {
                "prompt": prompt_text(engine, item),
                "n_predict": 1,
                "n_probs": N_PROBS,
                "cache_prompt": True,
                "temperature": 0.0,
            },
        )
        first = reply["completion_probabilities"][0]["top_logprobs"]  # pre-sampling: whole-vocabulary softmax
        top = {p["id"]: math.exp(p["logprob"]) for p in first}
        label_ids = engine.label_token_ids(len(item["options"]))
        raw = [top.get(t, 0.0) for t in label_ids]
        side.missing_labels += sum(t not in top for t in label_ids)
        total = sum(raw) or 1.0
        out[item["id"]] = [p / total for p in raw]
    return out


class Duel:
    """Sends each item to both servers back to back, alternating who goes first."""

    def __init__(self, ours: Client, theirs: Client, engine: DecisionEngine) -> None:
        self.ours, self.theirs, self.engine = ours, theirs, engine
        self.items = 0
        self.agree = 0.0

    def run(
        self, decisions: list[dict], sides: tuple[Side, Side], reask: bool = False, first_turn: bool = False
    ) -> None:
        us, them = sides
        order = [(us, self._ours), (them, self._theirs)]
        if self.items % 2:
            order.reverse()
        self.items += 1
        got: dict[str, dict[str, list[float]]] = {}
        for side, ask in order:
            t0 = time.perf_counter()
            answers = ask(decisions, side)
            if not reask:
                elapsed = time.perf_counter() - t0
                side.seconds += elapsed
                if first_turn:
                    side.first_turn_seconds += elapsed
                side.requests += 1 if side is us else len(decisions)
            got[side.name] = answers
            for key, probs in answers.items():
                first = side.answers.setdefault(key, probs)
                side.drift = max(side.drift, *(abs(a - b) for a, b in zip(first, probs, strict=True)))
        for key, probs in got[us.name].items():
            self.agree = max(
                self.agree, *(abs(a - b) for a, b in zip(probs, got[them.name][key], strict=True))
            )

    def _ours(self, decisions: list[dict], side: Side) -> dict[str, list[float]]:
        return ask_ours(self.ours, decisions)

    def _theirs(self, decisions: list[dict], side: Side) -> dict[str, list[float]]:
        return ask_theirs(self.theirs, self.engine, decisions, side)


def workloads(engine: DecisionEngine, args: argparse.Namespace) -> dict[str, list[list[dict]]]:
    rng = random.Random(7)
    singles = []
    for i in range(args.singles):
        q, opts = QUESTIONS[i % len(QUESTIONS)]
        singles.append([decision(f"single{i}", text_state(engine, rng, args.state_tokens), q, opts)])
    shared_state = text_state(engine, rng, args.state_tokens)
    shared = [[decision(f"shared{i}", shared_state, q, opts) for i, (q, opts) in enumerate(QUESTIONS)]]
    agents = [
        make_agent(engine, a, args.agent_state == "json", args.state_tokens) for a in range(args.agents)
    ]
    loop = []
    for turn in range(args.turns):
        for agent in agents:
            if turn:
                agent.grow()
            loop.append(agent.turn(turn))
    return {"cold_singles": singles, "eight_on_one_state": shared, "agent_loop": loop}


def four_agents(engine: DecisionEngine, args: argparse.Namespace) -> list[list[list[dict]]]:
    """Per turn, the 4 agents' requests (2 decisions each); agents of their own (no state shared with
    the agent loop's)."""
    agents = [make_agent(engine, 10 + a, args.agent_state == "json", args.state_tokens) for a in range(4)]
    turns = []
    for turn in range(args.turns):
        for agent in agents:
            if turn:
                agent.grow()
        turns.append([agent.turn(turn) for agent in agents])
    return turns


def attention_singles(engine: DecisionEngine, args: argparse.Namespace) -> list[dict]:
    """Cold singles of their own (another seed), so that none of them is cached on any side."""
    rng = random.Random(8)
    out = []
    for i in range(args.attention_singles):
        q, opts = QUESTIONS[(i + 3) % len(QUESTIONS)]
        out.append(decision(f"fa{i}", text_state(engine, rng, args.state_tokens), q, opts))
    return out


def run_attention_reference(
    items: list[dict], ours: Client, theirs: Client, theirs_fa_off: Client, engine: DecisionEngine
) -> dict:
    """Each cold single on the three servers (who goes first rotates); per side its total wall time."""
    them, them_fa_off = Side("llama-server"), Side("llama-server -fa off")
    sides = {
        "ours": lambda d: ask_ours(ours, [d]),
        "llama_server": lambda d: ask_theirs(theirs, engine, [d], them),
        "llama_server_fa_off": lambda d: ask_theirs(theirs_fa_off, engine, [d], them_fa_off),
    }
    seconds = dict.fromkeys(sides, 0.0)
    gap = 0.0
    for n, item in enumerate(items):
        names = list(sides)
        names = names[n % 3 :] + names[: n % 3]
        answers = {}
        for name in names:
            t0 = time.perf_counter()
            answers[name] = sides[name](item)[item["id"]]
            seconds[name] += time.perf_counter() - t0
        # the two llama-servers on the same tokens: how far flash attention alone moves an answer
        gap = max(
            gap,
            *(
                abs(a - b)
                for a, b in zip(answers["llama_server"], answers["llama_server_fa_off"], strict=True)
            ),
        )
        so_far = ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items())
        print(f"flash attention apart {n + 1}/{len(items)}: {so_far}", file=sys.stderr, flush=True)
    return {
        "items": len(items),
        **{f"{k}_s": round(v, 3) for k, v in seconds.items()},
        "ratio": round(seconds["ours"] / seconds["llama_server"], 3),
        "ratio_fa_off": round(seconds["ours"] / seconds["llama_server_fa_off"], 3),
        "llama_server_fa_off_speedup": round(seconds["llama_server_fa_off"] / seconds["llama_server"], 3),
        "llama_server_fa_on_vs_off_max_dp": gap,
        # labels outside llama-server's top list read as 0 on both of its sides: the Δp above ignores them
        "llama_server_missing_labels": them.missing_labels + them_fa_off.missing_labels,
    }


def run_four_agents(
    turns: list[list[list[dict]]], ours: Client, ours_alone: Client, theirs: Client, engine: DecisionEngine
) -> dict:
    """Each turn on the three sides (who goes first rotates); the warm turns' wall time per side."""
    seconds = {"ours_batched": 0.0, "ours_one_at_a_time": 0.0, "llama_server": 0.0}
    answers: dict[str, dict[str, list[float]]] = {name: {} for name in seconds}
    them = Side("llama-server")

    def batched(requests: list[list[dict]]) -> dict[str, list[float]]:
        with ThreadPoolExecutor(len(requests)) as pool:
            parts = list(pool.map(lambda r: ask_ours(ours, r), requests))
        return {k: v for part in parts for k, v in part.items()}

    def one_at_a_time(requests: list[list[dict]]) -> dict[str, list[float]]:
        return {k: v for r in requests for k, v in ask_ours(ours_alone, r).items()}

    def slots(requests: list[list[dict]]) -> dict[str, list[float]]:
        with ThreadPoolExecutor(len(requests)) as pool:
            parts = list(pool.map(lambda r: ask_theirs(theirs, engine, r, them), requests))
        return {k: v for part in parts for k, v in part.items()}

    sides = [("ours_batched", batched), ("ours_one_at_a_time", one_at_a_time), ("llama_server", slots)]
    for t, requests in enumerate(turns):
        order = sides[t % 3 :] + sides[: t % 3]
        for name, ask in order:
            t0 = time.perf_counter()
            answers[name].update(ask(requests))
            if t:  # the first turn is cold on every side
                seconds[name] += time.perf_counter() - t0
        so_far = ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items())
        print(f"4 agents turn {t + 1}/{len(turns)}: {so_far}", file=sys.stderr, flush=True)
    gap = max(
        abs(a - b)
        for key, probs in answers["ours_batched"].items()
        for a, b in zip(probs, answers["ours_one_at_a_time"][key], strict=True)
    )
    return {
        "turns": len(turns),
        "warm_turns": len(turns) - 1,
        **{f"{k}_s": round(v, 3) for k, v in seconds.items()},
        "ratio": round(seconds["ours_batched"] / seconds["llama_server"], 3),
        "batched_speedup": round(seconds["ours_one_at_a_time"] / seconds["ours_batched"], 3),
        "batched_vs_one_at_a_time_max_dp": gap,
        "llama_server_missing_labels": them.missing_labels,
    }


def _turns_apart(us: Side, them: Side) -> dict[str, float]:
    """The agent loop's time split into its first turns (cold prompts, where flash attention tells) and
    its warm turns (an event and two decisions' suffixes on a cached prefix), each side's and the ratios."""
    ours_warm, theirs_warm = us.seconds - us.first_turn_seconds, them.seconds - them.first_turn_seconds
    return {
        "ours_first_turns_s": round(us.first_turn_seconds, 3),
        "llama_server_first_turns_s": round(them.first_turn_seconds, 3),
        "first_turns_ratio": round(us.first_turn_seconds / them.first_turn_seconds, 3),
        "ours_warm_turns_s": round(ours_warm, 3),
        "llama_server_warm_turns_s": round(theirs_warm, 3),
        "warm_turns_ratio": round(ours_warm / theirs_warm, 3),
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def bench_model(key: str, gguf: Path, binary: Path, args: argparse.Namespace, logs: Path) -> dict:
    engine = DecisionEngine.load(
        Settings(n_threads=1, n_ctx=args.n_ctx, verify_manifest=False, prefix_cache_tokens=0), gguf
    )
    plan = workloads(engine, args)
    agents_at_once = four_agents(engine, args)
    fa_items = attention_singles(engine, args)
    ours_port, theirs_port, alone_port, fa_off_port = free_port(), free_port(), free_port(), free_port()
    # the 4 agents' requests arrive together: where the engine decodes fewer at once (the tiled layout's
    # turns of 64 rows or more run alone), the rest wait in the queue instead of getting 503
    command, env = ours_command(gguf, args.threads, ours_port, {"SEMIF_MAX_QUEUE": "4"})
    alone_command, alone_env = ours_command(gguf, args.threads, alone_port, {"SEMIF_MAX_BATCH_REQUESTS": "1"})
    theirs = theirs_command(binary, gguf, args.threads, theirs_port, args.slots, args.n_ctx)
    result: dict = {"model": gguf.name, "load_average_before": load_average(), "workloads": {}}
    result["llama_server_kernels"] = their_kernels(binary, gguf, args.threads, logs / f"kernels-{key}.log")
    with (
        running(command, env, ours_port, "/ping", logs / f"ours-{key}.log") as ours_client,
        running(
            theirs, dict(os.environ), theirs_port, "/health", logs / f"llama-server-{key}.log"
        ) as their_client,
    ):
        duel = Duel(ours_client, their_client, engine)
        # which numerics our server's probe chose (a tiny state of its own, so no workload item is warmed)
        meta = decision("meta", "Numerics check.", "Ready?", ["yes", "no"])
        served = ours_client.post("/invocations", {"decisions": [meta]})["results"][0]["model"]
        keys = (
            "numerics", "numerics_reason", "numerics_min_piece", "kv_layout", "batch_sequences",
            "max_batch_requests",
        )  # fmt: skip
        result["ours_numerics"] = {k: served.get(k) for k in keys}
        result["ours_scoring"] = served.get("scoring")
        result["ours_kernels"] = served.get("kernels")
        for name, items in plan.items():
            us, them = Side("ours"), Side("llama-server")
            load_before = load_average()
            started = time.perf_counter()
            for n, decisions in enumerate(items):
                # the agent loop goes round robin: its first ``agents`` items are every agent's first turn
                duel.run(decisions, (us, them), first_turn=name == "agent_loop" and n < args.agents)
                print(
                    f"{key} {name} {n + 1}/{len(items)}: ours {us.seconds:.2f} s, "
                    f"llama-server {them.seconds:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
            if name == "cold_singles":
                again = items
            elif name == "agent_loop":
                again = items[: args.agents]  # every agent's first turn, after all the others
            else:
                again = items
            for decisions in again:
                duel.run(decisions, (us, them), reask=True)
            result["workloads"][name] = {
                "items": len(items),
                "ours_s": round(us.seconds, 3),
                "llama_server_s": round(them.seconds, 3),
                "ratio": round(us.seconds / them.seconds, 3),
                "ours_requests": us.requests,
                "llama_server_requests": them.requests,
                "ours_reask_drift": us.drift,
                "llama_server_reask_drift": them.drift,
                "llama_server_missing_labels": them.missing_labels,
                "wall_s": round(time.perf_counter() - started, 1),
                **(_turns_apart(us, them) if name == "agent_loop" else {}),
                "load_average_before": load_before,
                "load_average_after": load_average(),
            }
            print(json.dumps({key: {name: result["workloads"][name]}}), file=sys.stderr, flush=True)
        result["max_abs_dp_ours_vs_llama_server"] = duel.agree
        if fa_items:
            fa_off = [
                *theirs_command(binary, gguf, args.threads, fa_off_port, args.slots, args.n_ctx),
                "-fa",
                "off",
            ]
            log = logs / f"llama-server-fa-off-{key}.log"
            with running(fa_off, dict(os.environ), fa_off_port, "/health", log) as fa_off_client:
                load_before = load_average()
                reference = run_attention_reference(
                    fa_items, ours_client, their_client, fa_off_client, engine
                )
                reference["load_average_before"] = load_before
                reference["load_average_after"] = load_average()
                result["cold_singles_flash_attention_apart"] = reference
                print(
                    json.dumps({key: {"cold_singles_flash_attention_apart": reference}}),
                    file=sys.stderr,
                    flush=True,
                )
        with running(alone_command, alone_env, alone_port, "/ping", logs / f"ours-alone-{key}.log") as alone:
            load_before = load_average()
            four = run_four_agents(agents_at_once, ours_client, alone, their_client, engine)
            four["load_average_before"] = load_before
            four["load_average_after"] = load_average()
            result["four_agents_at_once"] = four
            print(json.dumps({key: {"four_agents_at_once": four}}), file=sys.stderr, flush=True)
    engine.close()
    result["load_average_after"] = load_average()
    return result


def shaped_model(shape: str, cmake_args: str) -> Path:
    """The random Qwen3.5-shaped model (``random_models.SHAPES[shape]``) in Q4_K_M, built once and cached:
    written in f16, then quantized by the vendored ``llama-quantize``."""
    folder = cache_home() / "shaped-models"
    q4 = folder / f"qwen35-{shape}-shaped-Q4_K_M.gguf"
    if q4.is_file():
        return q4
    folder.mkdir(parents=True, exist_ok=True)
    f16 = folder / f"qwen35-{shape}-shaped-f16.gguf"
    print(f"writing the {shape}-shaped random qwen35 model (f16)", file=sys.stderr, flush=True)
    build_shaped(SHAPES[shape], ensure_model("qwen"), f16)
    quantize = build_llama_tool("llama-quantize", cmake_args)
    tmp = q4.with_suffix(".tmp")
    subprocess.run([str(quantize), str(f16), str(tmp), "Q4_K_M", str(os.cpu_count() or 2)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    tmp.replace(q4)
    f16.unlink()
    return q4


def their_kernels(binary: Path, gguf: Path, threads: int, log: Path) -> dict[str, object]:
    """The CPU kernels llama-server runs: its ``system_info`` line, which it prints at start-up only at
    trace verbosity, so a short run of its own (never the one timed) is started and stopped for it."""
    command = [*theirs_command(binary, gguf, threads, free_port(), 1, 512), "-lv", "4"]
    line = ""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not line and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
                text = log.read_text(errors="replace")
                line = next((x for x in text.splitlines() if "system_info" in x), "")
        finally:
            process.terminate()
            process.wait(timeout=30)
    features = kernels.cpu_features(line)
    return {"variant": kernels.cpu_variant(features) if line else None, "features": features}


def section(report: dict, key: str, title: str, header: str, cells: Callable[[dict], str]) -> list[str]:
    """A titled table with one row per model that has ``key`` in its report row."""
    rule = "|---" * header.count(" | ") + "|---|"
    lines = ["", title, "", header, rule]
    for row in report["models"]:
        if row.get(key):
            lines.append(f"| {row['model']} | {cells(row[key])} |")
    return lines


def markdown(report: dict) -> str:
    lines = [
        f"machine: {report['machine']}, {report['threads']} threads each; load average "
        f"{report['load_average_before']} before, {report['load_average_after']} after; agent state: "
        f"{report['agent_state']}; llama-server: {report['llama_server']}",
        "",
        "| model | workload | ours s | llama-server s | ours ÷ llama-server | re-ask max |Δp| ours | "
        "llama-server | load avg (1/5/15 min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["models"]:
        for name, w in row["workloads"].items():
            lines.append(
                f"| {row['model']} | {name} ({w['items']} items) "
                f"| {w['ours_s']:.2f} | {w['llama_server_s']:.2f} "
                f"| {w['ratio']:.2f} | {w['ours_reask_drift']:.2e} | {w['llama_server_reask_drift']:.2e} "
                f"| {w['load_average_before']} |"
            )
    lines += [
        "",
        "Agent loop, first turns (each agent's cold prompt) and warm turns apart: ours | llama-server",
        "",
        "| model | first turns ours s | llama-server s | ours ÷ llama-server | warm turns ours s "
        "| llama-server s | ours ÷ llama-server |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["models"]:
        loop = row["workloads"].get("agent_loop") or {}
        if "warm_turns_ratio" in loop:
            lines.append(
                f"| {row['model']} | {loop['ours_first_turns_s']:.2f} "
                f"| {loop['llama_server_first_turns_s']:.2f} | {loop['first_turns_ratio']:.2f} "
                f"| {loop['ours_warm_turns_s']:.2f} "
                f"| {loop['llama_server_warm_turns_s']:.2f} | {loop['warm_turns_ratio']:.2f} |"
            )
    lines += section(
        report,
        "four_agents_at_once",
        "4 agents at once (warm turns' wall time): ours batched | ours one at a time | llama-server 4 slots",
        "| model | warm turns | ours batched s | ours one at a time s | llama-server s "
        "| batched ÷ llama-server | one at a time ÷ batched | max |Δp| batched vs one at a time |",
        lambda f: (
            f"{f['warm_turns']} | {f['ours_batched_s']:.2f} | {f['ours_one_at_a_time_s']:.2f} "
            f"| {f['llama_server_s']:.2f} | {f['ratio']:.2f} | {f['batched_speedup']:.2f} "
            f"| {f['batched_vs_one_at_a_time_max_dp']:.2e}"
        ),
    )
    lines += section(
        report,
        "cold_singles_flash_attention_apart",
        "Cold singles, flash attention apart: ours | llama-server as run (-fa auto: on) "
        "| llama-server -fa off (attention computed as ours)",
        "| model | items | ours s | llama-server s | llama-server -fa off s | ours ÷ llama-server "
        "| ours ÷ llama-server -fa off | llama-server: -fa off ÷ on | max |Δp| llama-server on vs off |",
        lambda a: (
            f"{a['items']} | {a['ours_s']:.2f} | {a['llama_server_s']:.2f} "
            f"| {a['llama_server_fa_off_s']:.2f} | {a['ratio']:.2f} | {a['ratio_fa_off']:.2f} "
            f"| {a['llama_server_fa_off_speedup']:.2f} | {a['llama_server_fa_on_vs_off_max_dp']:.2e}"
        ),
    )
    lines.append("")
    for row in report["models"]:
        numerics = row.get("ours_numerics") or {}
        lines.append(
            f"Our numerics on {row['model']}: {numerics.get('numerics')} "
            f"({numerics.get('numerics_reason')}), KV layout {numerics.get('kv_layout')}, "
            f"{numerics.get('batch_sequences')} decisions per call, "
            f"{numerics.get('max_batch_requests')} requests per batch."
        )
        ours, theirs = row.get("ours_kernels") or {}, row.get("llama_server_kernels") or {}
        lines.append(
            f"CPU kernels on {row['model']}: ours {ours.get('variant')}, "
            f"llama-server {theirs.get('variant')}."
        )
    lines.append("")
    lines.append(
        "Largest |Δp| between the two servers on the same tokens: "
        + ", ".join(
            f"{row['model']} {row['max_abs_dp_ours_vs_llama_server']:.2e}" for row in report["models"]
        )
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["qwen", "gemma"], choices=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-ctx", type=int, default=8192, help="our context, and each llama-server slot's")
    parser.add_argument("--slots", type=int, default=4, help="llama-server slots (-np)")
    parser.add_argument("--singles", type=int, default=6)
    parser.add_argument("--state-tokens", type=int, default=1200)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--agent-state", choices=["json", "text"], default="json")
    parser.add_argument("--llama-server", help="an existing llama-server binary (else built and cached)")
    parser.add_argument("--cmake-args", default=os.environ.get("LLAMA_CMAKE_ARGS", ""))
    parser.add_argument(
        "--hybrid", action="store_true", help="add the Qwen3.5-shaped (0.8B-class) model's row"
    )
    parser.add_argument(
        "--attention-singles",
        type=int,
        default=6,
        help="cold singles also sent to a llama-server with -fa off (0: skip; 6: each goes first twice)",
    )
    parser.add_argument("--hybrid-singles", type=int, default=3)
    parser.add_argument("--hybrid-turns", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the report here (and a .md beside it)")
    args = parser.parse_args()
    binary = llama_server_binary(args)
    logs = Path(tempfile.mkdtemp(prefix="peer-bench-"))
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "threads": args.threads,
        "agent_state": args.agent_state,
        "llama_server": f"{binary.name} from llama-cpp-python {package_version('llama-cpp-python')} "
        f"vendor/llama.cpp, -np {args.slots}, prompt cache and --cache-ram at their defaults",
        "llama_server_cmake_args": None if args.llama_server else server_cmake_args(args.cmake_args),
        "load_average_before": load_average(),
        "models": [],
    }
    runs = [(key, ensure_model(key), args) for key in args.models]
    if args.hybrid:
        short = argparse.Namespace(
            **{
                **vars(args),
                "singles": args.hybrid_singles,
                "turns": args.hybrid_turns,
                "attention_singles": min(args.attention_singles, args.hybrid_singles),
            }
        )
        runs.append(("qwen35-0.8b-shaped", shaped_model("0.8b", args.cmake_args), short))
    for key, gguf, run_args in runs:  # the files are rewritten after each model: a long run keeps its rows
        row = bench_model(key, gguf, binary, run_args, logs)
        row["workload_sizes"] = {"singles": run_args.singles, "turns": run_args.turns}
        report["models"].append(row)
        report["load_average_after"] = load_average()
        text = markdown(report)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2) + "\n")
            args.json.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
