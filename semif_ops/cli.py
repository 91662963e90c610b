"""``semif-ops GROUP OPERATION [options]``: one entry point for every operator task.

Each operation is a module with ``main(argv, prog)``; this front door only picks the module and turns the
errors an operator can cause (bad input, missing credentials, a refused AWS call, a failed command) into one
line that says what went wrong, instead of a traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from semif_ops.exits import render

PROG = "semif-ops"


@dataclass(frozen=True)
class Operation:
    module: str
    summary: str
    stock: str | None = None  # the module run with --stock (the stock llama.cpp DLC instead of semif-adapter)


GROUPS: dict[str, dict[str, Operation]] = {
    "model": {
        "package": Operation("semif_ops.model.package", "build model.tar.gz (GGUF + manifest), upload it"),
        "prepare": Operation("semif_ops.model.prepare", "package the model in AWS CodeBuild instead of here"),
    },
    "image": {
        "context": Operation("semif_ops.image.context", "prepare the offline build context (wheels)"),
        "build": Operation("semif_ops.image.build", "build and push the image through CodeBuild into ECR"),
        "check": Operation("semif_ops.image.check", "check the Dockerfiles (and run hadolint)"),
        "abi": Operation("semif_ops.image.abi", "prove the binding's struct layouts against a llama.h"),
    },
    "endpoint": {
        "deploy": Operation(
            "semif_ops.endpoint.deploy",
            "deploy a real-time or --async endpoint (--stock: the stock llama.cpp DLC)",
            stock="semif_ops.endpoint.deploy_stock",
        ),
        "invoke": Operation(
            "semif_ops.endpoint.invoke",
            "send a request file to an endpoint (--stock: one chat question to the stock DLC)",
            stock="semif_ops.endpoint.invoke_stock",
        ),
        "scale": Operation("semif_ops.endpoint.scale", "attach or --remove autoscaling"),
        "cleanup": Operation("semif_ops.endpoint.cleanup", "delete autoscaling, endpoint, config, models"),
        "batch": Operation("semif_ops.endpoint.batch", "run a Batch Transform job over JSON Lines in S3"),
    },
}
STOCK = "--stock"


def usage(group: str | None = None) -> str:
    """Every operation with its one-line summary (or only those of ``group``)."""
    lines = [f"usage: {PROG} {group or 'GROUP'} OPERATION [options]   ({PROG} GROUP OPERATION --help)", ""]
    for name, operations in GROUPS.items():
        if group and name != group:
            continue
        for op_name, op in operations.items():
            lines.append(f"  {name + ' ' + op_name:<17} {op.summary}")
    return "\n".join(lines)


def _resolve(argv: list[str]) -> tuple[Callable[..., int], list[str], str]:
    """The operation's ``main``, its arguments and its prog name; SystemExit(2) with a hint otherwise."""
    group, operation, rest = argv[0], argv[1] if len(argv) > 1 else None, argv[2:]
    if group not in GROUPS:
        raise _usage_exit(f"unknown group {group!r}; pass one of: {', '.join(GROUPS)}")
    operations = GROUPS[group]
    if operation in (None, "-h", "--help"):
        print(usage(group))
        raise SystemExit(0 if operation else 2)
    if operation not in operations:
        raise _usage_exit(f"unknown operation '{group} {operation}'; pass one of: {', '.join(operations)}")
    op = operations[operation]
    module, prog = op.module, f"{PROG} {group} {operation}"
    if STOCK in rest:
        if op.stock is None:
            with_stock = [f"{g} {o}" for g, ops in GROUPS.items() for o, p in ops.items() if p.stock]
            raise _usage_exit(f"{STOCK} applies only to {' and '.join(with_stock)}; drop it here")
        rest = [a for a in rest if a != STOCK]
        module, prog = op.stock, f"{prog} {STOCK}"
    return importlib.import_module(module).main, rest, prog


def _usage_exit(message: str) -> SystemExit:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return SystemExit(2)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    try:
        run, rest, prog = _resolve(args)
        return run(rest, prog=prog)
    except SystemExit as exc:  # argparse's own usage errors (already printed), or a one-line refusal
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        code = render(exc)
        if code is None:
            raise
        return code
