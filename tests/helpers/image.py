"""The image tests' view of what the harness built (:class:`ImageUnderTest`) and podman as these machines
need it (runc, cgroupfs)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.image.harness import PODMAN


def podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, check=check, timeout=timeout)


def exec_in(container: str, script: str) -> str:
    """Run a shell snippet in the container with the image's own environment (PATH, user)."""
    return podman("exec", container, "sh", "-c", script).stdout


@dataclass(frozen=True)
class ImageUnderTest:
    image: str
    container: str
    url: str
    model_dir: Path
    binding: str  # the llama-cpp-python release whose vendored llama.cpp the stand-in base carries
    base: str  # the stand-in base image (name@sha256:digest)
    base_libs: Path  # the stand-in's libllama/libggml directory on this host
    work_dir: Path
