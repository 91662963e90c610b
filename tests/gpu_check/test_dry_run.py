"""The CPU dry run of scripts/gpu_check.sh (GPU_CHECK_CPU=1): the same script, bundle, offline 3.12 venv,
source build, random models, quantizer, tests and report as on the GPU, so it cannot rot between leases.

It builds libllama + llama-quantize for the CPU (no CUDA flags) and keeps that build between runs in
``~/.cache/semif-adapter/gpu-check-work`` (``SEMIF_GPU_CHECK_WORK``), keyed by the source's hash.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from scripts import gpu_bundle

pytestmark = pytest.mark.gpu_check


def python312() -> str:
    """A CPython 3.12 (the GPU machine's): GPU_CHECK_PYTHON, python3.12 on PATH, or a pyenv install."""
    candidates = [os.environ.get("GPU_CHECK_PYTHON")]
    candidates += sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12*/bin/python3.12")))
    candidates.append(shutil.which("python3.12"))  # last: a pyenv shim on PATH may not run
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return candidate
    pytest.fail("the dry run needs a CPython 3.12 (the GPU machine's): install one or set GPU_CHECK_PYTHON")


@pytest.fixture(scope="module")
def dry_run(bundle: dict, gpu_check_work: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("gpu-check-out")
    env = {
        **os.environ,
        "GPU_CHECK_CPU": "1",
        "GPU_CHECK_BUNDLE": str(bundle["path"]),
        "GPU_CHECK_WORK": str(gpu_check_work),
        "GPU_CHECK_PYTHON": python312(),
        "OUT": str(out),
    }
    for name in ("SEMIF_TEST_ENGINES", "SEMIF_TEST_TOKENIZER_GGUF", "LLAMA_CPP_LIB_PATH", "PYTHONPATH"):
        env.pop(name, None)
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh"], cwd=gpu_bundle.ROOT, env=env, capture_output=True, text=True,
        timeout=1800,
    )  # fmt: skip
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    return {"rc": done.returncode, "log": done.stdout + done.stderr, "out": out, "report": report}


def test_the_script_builds_checks_and_reports(dry_run: dict) -> None:
    assert dry_run["rc"] == 0, dry_run["log"][-4000:]
    report = dry_run["report"]
    assert report["machine"]["mode"] == "cpu" and report["machine"]["python"].startswith("3.12")
    assert report["build"]["seconds"] >= 0 and "-DGGML_CUDA" not in report["build"]["flags"]
    files = sorted(p.name for p in dry_run["out"].iterdir())
    assert len(files) <= 8 and {"report.md", "report.json", "timings.json", "determinism.xml"} <= set(files)
    assert "reference SemIf sample, NVIDIA L40S" in (dry_run["out"] / "report.md").read_text()


def test_every_invariance_holds_on_the_dense_model(dry_run: dict) -> None:
    """On the CPU the dry run adds the dense (gemma3) model; the suite runs hybrid and mamba already."""
    report = dry_run["report"]
    assert report["check"]["exit_code"] == 0
    # the engine loaded in the server's import order first, and the tests then ran in that order too
    assert report["check"]["server_order_exit"] == 0 and report["check"]["llama_cpp_first"] is False
    assert (
        "Engine load in the server's import order: loaded. The engine tests ran in that order."
        in (dry_run["out"] / "report.md").read_text()
    )
    models = {t["model"] for t in report["tests"] if t["model"]}  # the rest load no model (cut rules)
    assert models == {"dense"}
    assert len(report["tests"]) >= 20
    for row in report["invariances"]:
        assert all(row[m] == "holds" for m in models), row
    # the probe's verdict on the dense model is in the report: the mode the engine logged, and why
    (verdict,) = report["numerics"]
    assert verdict["architecture"] == "gemma3" and verdict["mode"] in ("invariant", "fixed-split")
    assert verdict["reason"]
    assert f"gemma3: **{verdict['mode']}**" in (dry_run["out"] / "report.md").read_text()


def test_the_shaped_model_is_quantized_and_timed(dry_run: dict, gpu_check_work: Path) -> None:
    import gguf

    report = dry_run["report"]
    assert report["model"]["shape"] == "small"
    reader = gguf.GGUFReader(gpu_check_work / "models" / "qwen35-small-Q4_K_M.gguf")
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q4_K_M
    assert {t.tensor_type.name for t in reader.tensors} >= {"Q4_K", "Q6_K"}
    timings = report["timings"]
    assert timings["model"]["architecture"] == "qwen35"
    assert report["bench"] == {"exit_code": 0, "server_order_exit": 0, "llama_cpp_first": False}
    engine = timings["engine"]
    assert engine["numerics"] in ("invariant", "fixed-split") and engine["numerics_reason"]
    cold = timings["cold_decisions"]
    assert cold["n"] == 12 and 0 < cold["p50_s"] <= cold["p95_s"] <= cold["max_s"]
    assert timings["sharing"]["speedup"] > 1
    assert [r["prefix_tokens"] for r in timings["state_io"]] == [128, 512]
    assert {r["chunk"] for r in timings["raw_prefill"]} == {128, 512}
    stopped = [r for r in timings["deadline"][1:] if r["error"]]
    assert stopped and all(r["overshoot_s"] >= 0 for r in stopped)
