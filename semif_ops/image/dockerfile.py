"""Static rules for this project's Dockerfiles, shared by ``semif-ops image check`` and the tests.

hadolint covers general hygiene; these rules cover what deployment relies on: every base is pinned by digest
(tags are mutable, so a rebuild could silently change llama.cpp), the final stage runs as a non-root user,
exposes 8080, starts through the project entrypoint, and installs no compiler toolchain.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from semif_ops.image import dlc_base, shell_commands

ENTRYPOINT = "/usr/local/bin/semif-entrypoint"
DIGEST_REF = re.compile(r"^[a-z0-9][a-z0-9._/-]*(?::[0-9]+/[a-z0-9._/-]+)?@sha256:[0-9a-f]{64}$")
VAR_REF = re.compile(r"^\$\{?(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}?$")
# Where this project's own executables live in the image (build context and install prefix).
PROJECT_PATHS = ("/src/", "/opt/semif/", "/usr/local/bin/semif-entrypoint")
# Variables holding the base's own Python (check-base.sh finds it) or, in the entrypoint, the user's command.
VOUCHED_VARIABLES = {"PYTHON", "python_path", "@"}
COMPILERS = {"gcc", "gcc-c++", "g++", "clang", "cmake", "make", "cpp", "cuda-nvcc", "nvcc"}


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


@dataclass
class Stage:
    line: int
    image: str
    alias: str | None
    instructions: list[Instruction] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.message}"


def parse(text: str) -> list[Instruction]:
    """Split a Dockerfile into instructions, joining ``\\`` continuations and dropping comments."""
    instructions: list[Instruction] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue  # comment lines inside a continuation are ignored by Docker too
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1])
            continue
        buffer.append(stripped)
        joined = " ".join(part.strip() for part in buffer if part.strip())
        keyword, _, args = joined.partition(" ")
        instructions.append(Instruction(start, keyword.upper(), args.strip()))
        buffer = []
    return instructions


def _global_args(instructions: list[Instruction]) -> dict[str, str | None]:
    """ARGs declared before the first FROM (the only ones a FROM line can use), with their defaults."""
    result: dict[str, str | None] = {}
    for ins in instructions:
        if ins.keyword == "FROM":
            break
        if ins.keyword == "ARG":
            name, sep, default = ins.args.partition("=")
            result[name.strip()] = default.strip().strip("\"'") if sep else None
    return result


def stages(instructions: list[Instruction]) -> list[Stage]:
    result: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = [w for w in ins.args.split() if not w.startswith("--")]
            alias = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            result.append(Stage(ins.line, words[0], alias))
        elif result:
            result[-1].instructions.append(ins)
    return result


def is_digest_pinned(image: str) -> bool:
    return bool(DIGEST_REF.fullmatch(image.strip()))


def check_base_image(value: str) -> str | None:
    """Problem with a BASE_IMAGE value, or None when it is ``<repo>@sha256:<64 hex>``."""
    if is_digest_pinned(value):
        return None
    if "@sha256:" in value:
        return f"base image {value!r} has a malformed digest (need @sha256: and 64 lower-case hex characters)"
    return f"base image {value!r} is tag-only (mutable); pin it as <repo>@sha256:<digest>"


def _exec_form(args: str) -> list[str] | None:
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def _installed_packages(run_args: str) -> set[str]:
    """Package names passed to ``dnf/yum/microdnf/apt-get install`` in one RUN."""
    packages: set[str] = set()
    for command in re.split(r"&&|;|\|\|", run_args):
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
        for i, word in enumerate(words):
            if word in {"dnf", "yum", "microdnf", "apt-get", "apt"} and "install" in words[i + 1 :]:
                rest = words[words.index("install", i) + 1 :]
                packages.update(w.strip("\"'") for w in rest if not w.startswith("-"))
    return packages


def check_text(text: str, path: str = "Dockerfile") -> list[Finding]:
    """Every rule against one Dockerfile's text."""
    instructions = parse(text)
    found: list[Finding] = []
    all_stages = stages(instructions)
    if not all_stages:
        return [Finding(path, 1, "no-from", "no FROM instruction")]
    args = _global_args(instructions)
    aliases: set[str] = set()
    for stage in all_stages:
        image = stage.image
        var = VAR_REF.fullmatch(image)
        if image in aliases or image == "scratch":
            pass
        elif var:
            name = var["name"]
            if name not in args:
                found.append(Finding(path, stage.line, "base-digest", f"FROM uses ${name}, not a global ARG"))
            elif args[name] is not None and (problem := check_base_image(args[name] or "")):
                found.append(Finding(path, stage.line, "base-digest", f"ARG {name} default: {problem}"))
        elif "$" in image:
            found.append(Finding(path, stage.line, "base-digest", f"FROM {image!r} is not a plain ARG"))
        elif problem := check_base_image(image):
            found.append(Finding(path, stage.line, "base-digest", problem))
        if stage.alias:
            aliases.add(stage.alias)

    if len(all_stages) < 2:
        found.append(
            Finding(path, all_stages[0].line, "multi-stage", "build tools need a separate builder stage")
        )
    final = all_stages[-1]
    by_keyword: dict[str, list[Instruction]] = {}
    for ins in final.instructions:
        by_keyword.setdefault(ins.keyword, []).append(ins)

    users = by_keyword.get("USER", [])
    user = users[-1].args.split(":")[0].strip() if users else ""
    if user in {"", "root", "0"}:
        line = users[-1].line if users else final.line
        found.append(Finding(path, line, "non-root", "final stage must end with a non-root USER"))

    exposed = {p.split("/")[0] for ins in by_keyword.get("EXPOSE", []) for p in ins.args.split()}
    if "8080" not in exposed:
        found.append(Finding(path, final.line, "expose-8080", "final stage must EXPOSE 8080 (SageMaker)"))

    entrypoints = by_keyword.get("ENTRYPOINT", [])
    entry = _exec_form(entrypoints[-1].args) if entrypoints else None
    if entry != [ENTRYPOINT]:
        line = entrypoints[-1].line if entrypoints else final.line
        found.append(Finding(path, line, "entrypoint", f'ENTRYPOINT must be the exec form ["{ENTRYPOINT}"]'))
    cmds = by_keyword.get("CMD", [])
    if not cmds or _exec_form(cmds[-1].args) != ["serve"]:
        line = cmds[-1].line if cmds else final.line
        found.append(Finding(path, line, "entrypoint", 'CMD must be ["serve"] (what SageMaker passes)'))

    for ins in by_keyword.get("RUN", []):
        bad = sorted(_installed_packages(ins.args) & COMPILERS)
        if bad:
            found.append(
                Finding(path, ins.line, "no-compilers", f"final stage installs build tools: {', '.join(bad)}")
            )
    return found


def check_file(path: Path) -> list[Finding]:
    text = Path(path).read_text(encoding="utf-8")
    return check_text(text, str(path)) + check_commands(text, str(path))


def command_problems(script: str, where: str) -> list[str]:
    """Commands in ``script`` that the DLC's base does not have (see semif_ops/image/dlc_base.py)."""
    defined = shell_commands.functions(script)
    problems: list[str] = []
    for call in shell_commands.calls(script):
        name = call.name
        variable = re.fullmatch(r"\$\{?([A-Za-z_@][A-Za-z0-9_]*|@)\}?", name)
        if variable:
            if variable[1] not in VOUCHED_VARIABLES:
                problems.append(f"{where}: runs the command held in ${variable[1]}, which cannot be checked")
            continue
        if name in shell_commands.BUILTINS or name in defined or name.startswith(PROJECT_PATHS):
            continue
        if dlc_base.allowed(name.rsplit("/", 1)[-1]) and (
            "/" not in name or name.startswith(("/usr/bin/", "/usr/sbin/", "/bin/", "/sbin/"))
        ):
            continue
        hint = " (not in the Amazon Linux 2023 base: use Python or a shell builtin)"
        problems.append(
            f"{where}: calls '{name}'{hint if name in dlc_base.ABSENT else ''}, which the "
            "DLC's base does not have"
        )
    return list(dict.fromkeys(problems))


def check_commands(text: str, path: str = "Dockerfile") -> list[Finding]:
    """Every shell-form RUN, in every stage, calls only what the base has (both stages start from it)."""
    found: list[Finding] = []
    for ins in parse(text):
        if ins.keyword != "RUN" or _exec_form(ins.args) is not None:
            continue
        args = re.sub(r"^(--[a-z-]+=\S+\s+)+", "", ins.args)  # RUN --mount=... flags
        for problem in command_problems(args, f"RUN at line {ins.line}"):
            found.append(Finding(path, ins.line, "base-commands", problem))
    return found


def check_script(path: Path) -> list[Finding]:
    """A docker/*.sh helper calls only what the base has."""
    text = Path(path).read_text(encoding="utf-8")
    return [Finding(str(path), 1, "base-commands", p) for p in command_problems(text, Path(path).name)]
