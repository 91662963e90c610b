"""podman as these machines need it (runc, cgroupfs), for the image tests."""

from __future__ import annotations

import subprocess

from scripts.test_image import PODMAN


def podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, check=check, timeout=timeout)


def exec_in(container: str, script: str) -> str:
    """Run a shell snippet in the container with the image's own environment (PATH, user)."""
    return podman("exec", container, "sh", "-c", script).stdout
