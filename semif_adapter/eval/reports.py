"""Report files for one run or several: JSON rows+totals, a Markdown table, and PNG plots.

The first Markdown table keeps the seed benchmark's columns (target | correct/total (%) | p50 | p95)
so a new run can be pasted next to the published CPU/GPU numbers; the detail tables add what the
seed lacked (validity, Brier, ECE, ordinal MAE, retries). Plots use matplotlib's ``Figure`` API,
which needs no display and no global backend switch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from semif_adapter.eval import metrics
from semif_adapter.eval.results import RunResult
from semif_adapter.eval.targets import slug


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} s"


def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _fraction(correct: int, total: int) -> str:
    return f"{correct}/{total} ({100.0 * correct / total:.1f}%)" if total else "0/0"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def seed_table(runs: Sequence[RunResult]) -> str:
    """The seed's headline table: one row per run."""
    lines = ["| target | correct/total (%) | p50 | p95 |", "|---|---|---|---|"]
    for run in runs:
        t = run.totals
        lat = t["latency_s"]
        lines.append(
            f"| {_cell(run.name)} | {_fraction(t['correct'], t['tasks'])} | "
            f"{_seconds(lat['p50'])} | {_seconds(lat['p95'])} |"
        )
    return "\n".join(lines)


def detail_table(runs: Sequence[RunResult]) -> str:
    header = (
        "| target | valid | majority baseline | Brier | ECE | log loss | score MAE | p99 | mean | "
        "decisions/s | 503 retries | retry wait |"
    )
    lines = [header, "|" + "---|" * 12]
    for run in runs:
        t = run.totals
        lat = t["latency_s"]
        base = t["majority_baseline"]
        baseline = _fraction(base["correct"], base["total"])
        lines.append(
            f"| {_cell(run.name)} | {t['valid']}/{t['tasks']} | {baseline} | "
            f"{_number(t['brier'])} | {_number(t['ece'])} | {_number(t['log_loss'])} | "
            f"{_number(t['ordinal_mae'])} | {_seconds(lat['p99'])} | {_seconds(lat['mean'])} | "
            f"{_number(t['decisions_per_s'], 2)} | {t['retries_503']} | {_seconds(t['retry_wait_s'])} |"
        )
    return "\n".join(lines)


def breakdown_table(runs: Sequence[RunResult], key: str) -> str:
    """Accuracy per question type (``by_type``) or family (``by_family``), runs as columns."""
    groups = sorted({g for run in runs for g in run.totals[key]})
    lines = [
        "| " + key.removeprefix("by_") + " | " + " | ".join(_cell(r.name) for r in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for group in groups:
        cells = []
        for run in runs:
            stats = run.totals[key].get(group)
            cells.append(_fraction(stats["correct"], stats["total"]) if stats else "–")
        lines.append(f"| {_cell(group)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(runs: Sequence[RunResult], title: str = "Benchmark") -> str:
    parts = [
        f"# {title}",
        "",
        seed_table(runs),
        "",
        "Latency is the client round trip of the successful attempt; 503 retries and their waits are "
        "counted separately. Accuracy counts invalid responses as wrong. Raw probabilities are not "
        "calibrated confidence; evaluate on your own labelled decisions.",
        "",
        "## Details",
        "",
        detail_table(runs),
        "",
        "## Accuracy by question type",
        "",
        breakdown_table(runs, "by_type"),
        "",
        "## Accuracy by family",
        "",
        breakdown_table(runs, "by_family"),
        "",
    ]
    return "\n".join(parts)


def _valid(run: RunResult) -> tuple[list[float], list[bool]]:
    rows = [r for r in run.rows if r.valid and r.confidence is not None]
    return [r.confidence or 0.0 for r in rows], [r.correct for r in rows]


def _draw_reliability(ax: Axes, runs: Sequence[RunResult], bars: bool, *, legend: bool = True) -> None:
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect calibration")
    for run in runs:
        conf, correct = _valid(run)
        bins = [b for b in metrics.reliability_bins(conf, correct) if b.count]
        if not bins:
            continue
        if bars:
            ax.bar(
                [(b.lower + b.upper) / 2 for b in bins],
                [b.accuracy for b in bins],
                width=0.1,
                edgecolor="black",
                alpha=0.7,
                label=f"{run.name} accuracy",
            )
            ax.plot([b.confidence for b in bins], [b.accuracy for b in bins], "o", color="black")
        else:
            ax.plot(
                [b.confidence for b in bins],
                [b.accuracy for b in bins],
                marker="o",
                label=f"{run.name} (ECE {_number(run.totals['ece'])})",
            )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("top-1 confidence")
    ax.set_ylabel("accuracy")
    ax.set_title("Reliability (10 equal-width bins)")
    if legend:
        ax.legend(loc="upper left", fontsize="small")


def _draw_latency_cdf(ax: Axes, runs: Sequence[RunResult], *, legend: bool = True) -> None:
    spans = []
    for run in runs:
        lat = np.sort([r.latency_s for r in run.rows if r.valid and r.latency_s is not None])
        if lat.size == 0:
            continue
        spans.append((lat[0], lat[-1]))
        ax.step(lat, np.arange(1, lat.size + 1) / lat.size, where="post", label=run.name)
    if spans and min(s[0] for s in spans) > 0 and max(s[1] for s in spans) / min(s[0] for s in spans) > 20:
        ax.set_xscale("log")
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("client latency (s)")
    ax.set_ylabel("share of decisions")
    ax.set_title("Latency CDF")
    if spans and legend:
        ax.legend(loc="lower right", fontsize="small")


def reliability_png(run: RunResult, path: Path) -> Path:
    fig = Figure(figsize=(5, 5), dpi=100)
    _draw_reliability(fig.add_subplot(), [run], bars=True)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def latency_png(runs: Sequence[RunResult], path: Path) -> Path:
    fig = Figure(figsize=(6, 4), dpi=100)
    _draw_latency_cdf(fig.add_subplot(), runs)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def write_run_report(run: RunResult, out_dir: Path, stem: str | None = None) -> dict[str, Path]:
    """``<stem>.json``, ``<stem>.md``, ``<stem>-reliability.png`` and ``<stem>-latency.png``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = stem or slug(run.name)
    paths = {
        "json": run.save(out_dir / f"{stem}.json"),
        "markdown": out_dir / f"{stem}.md",
        "reliability": reliability_png(run, out_dir / f"{stem}-reliability.png"),
        "latency": latency_png([run], out_dir / f"{stem}-latency.png"),
    }
    paths["markdown"].write_text(markdown([run], title=f"Benchmark: {run.name}"), encoding="utf-8")
    return paths


def write_comparison(runs: Sequence[RunResult], out_dir: Path, stem: str = "compare") -> dict[str, Path]:
    """Two or more runs side by side: one Markdown file, one figure (reliability + latency CDF)."""
    if len(runs) < 2:
        raise ValueError("compare needs at least two runs")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{stem}.md"
    md.write_text(markdown(runs, title="Benchmark comparison"), encoding="utf-8")
    # long run names: one legend under both panels instead of two legends over the data
    fig = Figure(figsize=(11, 4.5 + 0.25 * len(runs)), dpi=100, layout="constrained")
    left, right = fig.subplots(1, 2)
    _draw_reliability(left, runs, bars=False, legend=False)
    _draw_latency_cdf(right, runs, legend=False)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", fontsize="small")
    png = out_dir / f"{stem}.png"
    fig.savefig(png, format="png")
    return {"markdown": md, "figure": png}
