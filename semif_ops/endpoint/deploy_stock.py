"""Deploy the stock llama.cpp DLC (its own llama-server chat API) for comparison with semif-adapter.

Same model.tar.gz, same digest rule and instance options as `endpoint deploy`; the container is configured
through SM_LLAMA_CPP_* variables (SM_LLAMA_CPP_FOO_BAR=v becomes llama-server --foo-bar v). SageMaker
cannot pull from ECR Public: use the DLC's private ECR URI in your region, pinned by digest.

    semif-ops endpoint deploy --stock --name llamacpp-qwen \
        --role-arn arn:aws:iam::123456789012:role/R \
        --image 763104351884.dkr.ecr.us-east-1.amazonaws.com/llama-cpp@sha256:<64 hex> \
        --model-data s3://my-bucket/semif/qwen/model.tar.gz --instance-type ml.c7i.2xlarge --wait
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from semif_ops import aws
from semif_ops.endpoint import deploy
from semif_ops.exits import command

FLAG = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def llama_environment(ctx_size: int, gpu_layers: int | None, flags: Sequence[str]) -> dict[str, str]:
    """llama-server flags as the DLC's SM_LLAMA_CPP_* variables."""
    environment = {"SM_LLAMA_CPP_CTX_SIZE": str(ctx_size)}
    if gpu_layers is not None:
        environment["SM_LLAMA_CPP_N_GPU_LAYERS"] = str(gpu_layers)
    for key, value in aws.env_pairs(flags).items():
        flag = key.lstrip("-")
        if not FLAG.fullmatch(flag):
            raise aws.UsageError(f"--llama-arg {key!r}: use the llama-server long flag, e.g. threads=8")
        environment["SM_LLAMA_CPP_" + flag.upper().replace("-", "_")] = value
    return environment


@command
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    deploy.add_common_arguments(parser)
    parser.add_argument("--ctx-size", type=int, default=8192, help="SM_LLAMA_CPP_CTX_SIZE")
    parser.add_argument("--gpu-layers", type=int, help="SM_LLAMA_CPP_N_GPU_LAYERS (e.g. 999 on GPU)")
    parser.add_argument(
        "--llama-arg", action="append", default=[], metavar="FLAG=VALUE", help="any llama-server flag"
    )
    args = parser.parse_args(argv)
    image, extra = deploy.validate_common(args)
    environment = llama_environment(args.ctx_size, args.gpu_layers, args.llama_arg)
    environment.update(extra)
    return deploy.run(args, environment, image)


if __name__ == "__main__":
    raise SystemExit(main())
