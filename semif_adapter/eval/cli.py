"""``benchmark`` and ``calibrate`` command lines (``semif-adapter benchmark``, ``semif-adapter calibrate``).

Hooks for the package CLI: :func:`add_parser` registers both commands on an argparse
``subparsers`` object and sets ``func`` (``ns.func(ns) -> int``); :func:`benchmark_main` and
:func:`calibrate_main` parse ``argv`` themselves for the standalone scripts.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # heavy imports (matplotlib, httpx, boto3) wait until a command runs
    from semif_adapter.eval import calibrate as cal
    from semif_adapter.eval.results import RunResult
    from semif_adapter.eval.targets import Target

DEFAULT_REPORT_DIR = Path("benchmarks/reports")


def _add_target_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("target (exactly one of --url, --endpoint-name, --chat-url)")
    group.add_argument("--url", help="semif server base URL, e.g. http://localhost:8080")
    group.add_argument("--endpoint-name", help="SageMaker endpoint name (sagemaker-runtime InvokeEndpoint)")
    group.add_argument("--region", help="AWS region of the endpoint (default: the boto3 default)")
    group.add_argument(
        "--chat-url",
        help="OpenAI-compatible server (decision by generation), e.g. http://localhost:8000/v1",
    )
    group.add_argument(
        "--protocol",
        choices=("semif", "systemone"),
        default="semif",
        help="body sent to --url/--endpoint-name: POST /invocations {'decision'} or POST /v1/systemone",
    )
    group.add_argument("--chat-model", default="default", help="'model' field for --chat-url")
    group.add_argument(
        "--systemone-model", default="jev-latest", help="'model' field for --protocol systemone"
    )
    group.add_argument(
        "--api-key",
        default=os.environ.get("SEMIF_BENCH_API_KEY"),
        help="Bearer key for HTTP targets (default: $SEMIF_BENCH_API_KEY)",
    )
    group.add_argument("--timeout", type=float, default=120.0, help="per-request timeout in seconds")
    run = parser.add_argument_group("run")
    run.add_argument("--name", help="target name in tables (default: derived from the target)")
    run.add_argument("--concurrency", type=int, default=1, help="requests in flight (default 1, as the seed)")
    run.add_argument("--limit", type=int, help="only the first N tasks (smoke runs)")
    run.add_argument("--max-attempts", type=int, default=8, help="attempts per task on 503 (default 8)")
    run.add_argument("--retry-base", type=float, default=0.25, help="first backoff in seconds")
    run.add_argument("--retry-cap", type=float, default=8.0, help="longest backoff in seconds")
    run.add_argument(
        "--seed", type=int, default=0, help="seed for backoff jitter (and the calibration split)"
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")


def _chosen_targets(ns: argparse.Namespace) -> list[str]:
    return [flag for flag in ("url", "endpoint_name", "chat_url") if getattr(ns, flag, None)]


def build_target(ns: argparse.Namespace) -> Target:
    from semif_adapter.eval.targets import ChatTarget, HttpTarget, SageMakerTarget

    chosen = _chosen_targets(ns)
    if len(chosen) != 1:
        raise SystemExit("error: give exactly one target: --url, --endpoint-name or --chat-url")
    if ns.url:
        return HttpTarget(
            ns.url,
            ns.protocol,
            name=ns.name,
            timeout_s=ns.timeout,
            api_key=ns.api_key,
            systemone_model=ns.systemone_model,
        )
    if ns.endpoint_name:
        return SageMakerTarget(
            ns.endpoint_name,
            region=ns.region,
            protocol=ns.protocol,
            name=ns.name,
            systemone_model=ns.systemone_model,
            timeout_s=ns.timeout,
        )
    return ChatTarget(
        ns.chat_url, model=ns.chat_model, name=ns.name, timeout_s=ns.timeout, api_key=ns.api_key
    )


def _run(ns: argparse.Namespace, task_paths: Sequence[Path]) -> RunResult:
    from semif_adapter.eval.runner import RetryPolicy, run_benchmark
    from semif_adapter.eval.tasks import TaskFileError, load_tasks

    if ns.concurrency < 1 or ns.max_attempts < 1:
        raise SystemExit("error: --concurrency and --max-attempts must be >= 1")
    try:
        tasks = load_tasks(*task_paths)
    except (OSError, TaskFileError) as exc:
        raise SystemExit(f"error: {exc}") from exc
    if ns.limit is not None:
        tasks = tasks[: max(0, ns.limit)]
        if not tasks:
            raise SystemExit("error: --limit leaves no tasks")
    target = build_target(ns)
    try:
        return run_benchmark(
            tasks,
            target,
            concurrency=ns.concurrency,
            retry=RetryPolicy(max_attempts=ns.max_attempts, base_s=ns.retry_base, cap_s=ns.retry_cap),
            seed=ns.seed,
            name=ns.name,
            progress=not ns.no_progress,
            config={"tasks": [str(p) for p in task_paths], "limit": ns.limit},
        )
    finally:
        target.close()


# --- benchmark ---------------------------------------------------------------------------------


def configure_benchmark(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.description = (
        "Send labelled JevBench-format tasks to an endpoint and report accuracy, calibration and "
        "latency; or, with --compare, put earlier runs side by side."
    )
    parser.add_argument("tasks", nargs="*", type=Path, help="task JSONL file(s), sent in file order")
    parser.add_argument("--compare", nargs="+", type=Path, metavar="REPORT", help="report JSONs to compare")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_REPORT_DIR, help="where reports go")
    parser.add_argument("--stem", help="report file name stem (default: from the target name)")
    _add_target_args(parser)
    parser.set_defaults(func=run_benchmark_command)
    return parser


def run_benchmark_command(ns: argparse.Namespace) -> int:
    from semif_adapter.eval.reports import seed_table, write_comparison, write_run_report
    from semif_adapter.eval.results import RunResult
    from semif_adapter.eval.targets import slug

    if ns.compare:
        if ns.tasks or _chosen_targets(ns):
            raise SystemExit("error: --compare takes report files only, no tasks or target")
        if len(ns.compare) < 2:
            raise SystemExit("error: --compare needs at least two reports")
        try:
            runs = [RunResult.load(path) for path in ns.compare]
        except (OSError, ValueError) as exc:
            raise SystemExit(f"error: {exc}") from exc
        paths = write_comparison(runs, ns.out_dir, ns.stem or "compare")
        print(seed_table(runs))
        _print_paths(paths)
        return 0
    if not ns.tasks:
        raise SystemExit("error: give task JSONL file(s) (or --compare REPORT REPORT ...)")
    run = _run(ns, ns.tasks)
    paths = write_run_report(run, ns.out_dir, ns.stem or slug(run.name))
    print(seed_table([run]))
    t = run.totals
    print(
        f"valid {t['valid']}/{t['tasks']}  Brier {_fmt(t['brier'])}  ECE {_fmt(t['ece'])}  "
        f"503 retries {t['retries_503']}  decisions/s {_fmt(t['decisions_per_s'], 2)}"
    )
    _print_paths(paths)
    return 0 if t["valid"] else 1


# --- calibrate ---------------------------------------------------------------------------------


def configure_calibrate(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.description = (
        "Fit one temperature per question type (optionally per option count) on raw option logits "
        "and write calibration.json; a fit is kept only if held-out ECE improves."
    )
    source = parser.add_argument_group("logits source (one of)")
    source.add_argument(
        "tasks", nargs="*", type=Path, help="labelled task JSONL(s): benchmark a target first"
    )
    source.add_argument("--report", type=Path, help="benchmark report JSON with per-task option_logits")
    source.add_argument("--logits", type=Path, help="JSONL rows {id,type,option_logits,expected_index}")
    fit = parser.add_argument_group("fit")
    fit.add_argument("--out", type=Path, default=Path("calibration.json"), help="calibration file to write")
    fit.add_argument("--per-option-count", action="store_true", help="also fit type/n_options keys")
    fit.add_argument("--held-out", type=float, default=0.3, help="held-out share of task ids (default 0.3)")
    fit.add_argument("--min-fit", type=int, default=10, help="fewest fit samples per key")
    fit.add_argument("--min-held-out", type=int, default=5, help="fewest held-out samples per key")
    fit.add_argument("--prompt-version", help="prompt version the logits were read with (default: from rows)")
    fit.add_argument(
        "--scoring-version",
        help="scoring version the logits were read under (default: from rows, if they agree); the server "
        "refuses a calibration fitted under another",
    )
    fit.add_argument("--model-sha256", help="GGUF sha256 (default: from rows, if they agree)")
    fit.add_argument("--report-out", type=Path, help="also save the benchmark run (when tasks are given)")
    _add_target_args(parser)
    parser.set_defaults(func=run_calibrate_command)
    return parser


def _load_samples(ns: argparse.Namespace) -> tuple[list[cal.Sample], dict[str, Any], RunResult | None]:
    from semif_adapter.eval import calibrate as cal
    from semif_adapter.eval.results import RunResult

    sources = [bool(ns.tasks), ns.report is not None, ns.logits is not None]
    if sum(sources) != 1:
        raise SystemExit("error: give exactly one source: task JSONL(s) + target, --report, or --logits")
    try:
        if ns.logits is not None:
            return cal.samples_from_jsonl(ns.logits), {"logits": str(ns.logits)}, None
        if ns.report is not None:
            run = RunResult.load(ns.report)
            return cal.samples_from_run(run), {"report": str(ns.report), "target": run.target}, run
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from exc
    run = _run(ns, ns.tasks)
    if ns.report_out is not None:
        run.save(ns.report_out)
    return cal.samples_from_run(run), {"tasks": [str(p) for p in ns.tasks], "target": run.target}, run


def run_calibrate_command(ns: argparse.Namespace) -> int:
    from semif_adapter.eval import calibrate as cal

    samples, source, run = _load_samples(ns)
    if not samples:
        print(
            "error: no labelled rows with raw option logits (generation targets and System One servers "
            "without x_option_logits cannot be calibrated)",
            file=sys.stderr,
        )
        return 1
    rows = run.rows if run is not None else []
    try:
        calibration = cal.fit_calibration(
            samples,
            per_option_count=ns.per_option_count,
            held_out_fraction=ns.held_out,
            seed=ns.seed,
            min_fit=ns.min_fit,
            min_held_out=ns.min_held_out,
            prompt_version=ns.prompt_version or cal.single_value(r.prompt_version for r in rows),
            scoring_version=ns.scoring_version or cal.single_value(r.scoring_version for r in rows),
            model_sha256=ns.model_sha256 or cal.single_value(r.model_sha256 for r in rows),
            source=source,
        )
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc
    path = cal.write_calibration(calibration, ns.out)
    for key, fit in calibration.fits.items():
        if "temperature" not in fit:
            print(f"{key:10s} skipped: {fit['reason']}")
            continue
        before, after = fit["held_out"]["before"], fit["held_out"]["after"]
        print(
            f"{key:10s} T={fit['temperature']:.3f}  held-out ECE {before['ece']:.4f} -> {after['ece']:.4f}  "
            f"NLL {before['nll']:.4f} -> {after['nll']:.4f}  {'kept' if fit['accepted'] else 'REJECTED'}"
            + ("" if fit["accepted"] else f" ({fit['reason']})")
        )
    print(f"wrote {path} ({len(calibration.temperatures)} temperature(s) kept)")
    return 0


# --- hooks -------------------------------------------------------------------------------------


def add_parser(subparsers: Any) -> None:
    """Register ``benchmark`` and ``calibrate`` on the package CLI's subparsers."""
    configure_benchmark(
        subparsers.add_parser("benchmark", help="accuracy, calibration and latency of a target")
    )
    configure_calibrate(
        subparsers.add_parser("calibrate", help="fit per-type temperatures -> calibration.json")
    )


def benchmark_main(argv: Sequence[str] | None = None) -> int:
    ns = configure_benchmark(argparse.ArgumentParser(prog="benchmark.py")).parse_args(argv)
    status: int = ns.func(ns)
    return status


def calibrate_main(argv: Sequence[str] | None = None) -> int:
    ns = configure_calibrate(argparse.ArgumentParser(prog="calibrate.py")).parse_args(argv)
    status: int = ns.func(ns)
    return status


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _print_paths(paths: dict[str, Path]) -> None:
    for kind, path in paths.items():
        print(f"{kind}: {path}")
