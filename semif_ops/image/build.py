"""Build and push the semif-adapter image through AWS CodeBuild into ECR; print the digest-pinned URI.

No local Docker needed: the source is zipped to S3, a privileged CodeBuild project (created if missing)
runs `docker build`/`docker push`, and the digest comes back from ECR. The equivalent local commands are
printed too. The build context must be prepared first (`make image-context`, see
semif-ops image context): its wheelhouse travels in the zip, so the image build needs no index, and
its build-args (the llama.cpp version the base must report) are passed to `docker build`.

    semif-ops image build --variant cpu --bucket my-build-bucket \
        --base-image public.ecr.aws/deep-learning-containers/llama-cpp@sha256:<64 hex>
    semif-ops image build --variant cpu --platform linux/arm64 --repository semif-adapter-arm64 \
        --base-image public.ecr.aws/deep-learning-containers/llama-cpp-arm64@sha256:<64 hex> --bucket ...
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from semif_ops import aws
from semif_ops.errors import OperationFailed, UsageError
from semif_ops.exits import command
from semif_ops.image import dockerfile

ROOT = Path(__file__).resolve().parents[2]
SOURCE_FILES = (
    "Dockerfile.cpu",
    "Dockerfile.gpu",
    "pyproject.toml",
    "README.md",
    "LICENSE",
    ".dockerignore",
    "model-manifest.json",
    "semif_ops/__init__.py",
    "semif_ops/exits.py",
    "semif_ops/image/__init__.py",
    "semif_ops/image/abi.py",
    "semif_ops/image/check.py",
    "semif_ops/image/dlc_base.py",
    "semif_ops/image/dockerfile.py",
    "semif_ops/image/shell_commands.py",
)
SOURCE_DIRS = ("docker", "semif_adapter")
ARCHES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
PREPARED = ("docker/wheelhouse", "docker/llama-headers")
CODEBUILD_IMAGES = {
    "linux/amd64": ("LINUX_CONTAINER", "aws/codebuild/amazonlinux-x86_64-standard:5.0"),
    "linux/arm64": ("ARM_CONTAINER", "aws/codebuild/amazonlinux-aarch64-standard:3.0"),
}


def prepared_context(docker_dir: Path, platform: str) -> tuple[dict[str, Any], list[str]]:
    """The wheelhouse's context.json and build-args; ValueError says what to prepare when unusable."""
    context_file = docker_dir / "wheelhouse" / "context.json"
    arch = ARCHES[platform]
    hint = f"make image-context IMAGE_ARCH={arch} IMAGE_PYTHON=3.12 LLAMA_SOURCE=<llama.cpp tarball>"
    if not context_file.is_file():
        raise ValueError(f"no prepared build context in {docker_dir / 'wheelhouse'}; run: {hint}")
    context = json.loads(context_file.read_text())
    if context.get("arch") != arch:
        raise ValueError(
            f"the wheelhouse is for {context.get('arch')}, the build for {platform}; run: {hint}"
        )
    args_file = docker_dir / "wheelhouse" / "build-args"
    build_args = args_file.read_text().split() if args_file.is_file() else []
    return context, [a for a in build_args if a != "--build-arg"]


def source_zip(root: Path = ROOT, docker_dir: Path | None = None) -> bytes:
    """Zip what `docker build` needs (executable bits kept: the entrypoint must stay executable); the
    prepared wheelhouse and headers come from ``docker_dir`` (default: root/docker)."""
    prepared = docker_dir or root / "docker"
    entries = [(root / f, f) for f in SOURCE_FILES if (root / f).is_file()]
    for directory in SOURCE_DIRS:
        entries += [
            (p, str(p.relative_to(root)))
            for p in sorted((root / directory).rglob("*"))
            if p.is_file()
            and "__pycache__" not in p.parts
            and not str(p.relative_to(root)).startswith(PREPARED)
        ]
    for sub in PREPARED:
        base = prepared / Path(sub).name
        if base.is_dir():
            entries += [(p, f"{sub}/{p.relative_to(base)}") for p in sorted(base.rglob("*")) if p.is_file()]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, name in entries:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (path.stat().st_mode & 0o777 | 0o100000) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    return buffer.getvalue()


def buildspec() -> str:
    """CodeBuild buildspec (JSON is valid YAML). Values arrive as environment variables per build."""
    spec = {
        "version": 0.2,
        "env": {"exported-variables": ["IMAGE_DIGEST"]},
        "phases": {
            "pre_build": {
                "commands": [
                    'python3 -m semif_ops.image.check --base-image "$BASE_IMAGE" "Dockerfile.$VARIANT"',
                    'aws ecr get-login-password --region "$AWS_REGION" '
                    '| docker login --username AWS --password-stdin "${REPOSITORY_URI%%/*}"',
                ]
            },
            "build": {
                "commands": [
                    'DOCKER_BUILDKIT=1 docker build --platform "$PLATFORM" -f "Dockerfile.$VARIANT" '
                    '--build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg LLAMA_CPP_VERSION="$LLAMA_CPP_VERSION" '
                    '--build-arg LLAMA_CPP_COMMIT="$LLAMA_CPP_COMMIT" -t "$REPOSITORY_URI:$IMAGE_TAG" .',
                    'docker push "$REPOSITORY_URI:$IMAGE_TAG"',
                    "IMAGE_DIGEST=$(docker inspect --format '{{index .RepoDigests 0}}' "
                    '"$REPOSITORY_URI:$IMAGE_TAG" | cut -d@ -f2)',
                    'echo "pushed $REPOSITORY_URI@$IMAGE_DIGEST"',
                ]
            },
        },
    }
    return json.dumps(spec, indent=2)


def ensure_repository(ecr: Any, name: str) -> str:
    """Repository URI, creating the repository (immutable tags, scan on push) if missing."""
    try:
        repo = ecr.describe_repositories(repositoryNames=[name])["repositories"][0]
    except ClientError as exc:
        if aws.error_code(exc) != "RepositoryNotFoundException":
            raise
        repo = ecr.create_repository(
            repositoryName=name,
            imageTagMutability="IMMUTABLE",
            imageScanningConfiguration={"scanOnPush": True},
        )["repository"]
    return str(repo["repositoryUri"])


def role_policy(bucket: str, repository_arn: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            *aws.codebuild_base_statements(bucket),
            {"Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
            {
                "Effect": "Allow",
                "Action": [
                    "ecr:BatchCheckLayerAvailability",
                    "ecr:InitiateLayerUpload",
                    "ecr:UploadLayerPart",
                    "ecr:CompleteLayerUpload",
                    "ecr:PutImage",
                    "ecr:BatchGetImage",
                ],
                "Resource": repository_arn,
            },
        ],
    }


def local_commands(
    variant: str,
    platform: str,
    base_image: str,
    repository_uri: str,
    tag: str,
    build_args: Sequence[str] = (),
) -> str:
    registry = repository_uri.split("/", 1)[0]
    extra = "".join(f"--build-arg {a} " for a in build_args)
    region = registry.split(".")[3] if registry.count(".") >= 3 else "<region>"
    return "\n".join(
        [
            f"aws ecr get-login-password --region {region} | docker login --username AWS "
            f"--password-stdin {registry}",
            f"docker build --platform {platform} -f Dockerfile.{variant} "
            f"--build-arg BASE_IMAGE={base_image} {extra}-t {repository_uri}:{tag} .",
            f"docker push {repository_uri}:{tag}",
            f"docker inspect --format '{{{{index .RepoDigests 0}}}}' {repository_uri}:{tag}",
        ]
    )


@command
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", choices=("cpu", "gpu"), required=True, help="Dockerfile.cpu or .gpu")
    parser.add_argument("--base-image", required=True, help="llama.cpp DLC as <repo>@sha256:<64 hex>")
    parser.add_argument("--platform", choices=sorted(CODEBUILD_IMAGES), default="linux/amd64")
    parser.add_argument("--repository", default=None, help="ECR repository (default semif-adapter-<variant>)")
    parser.add_argument("--tag", default=None, help="image tag (default: <variant>-<UTC timestamp>)")
    parser.add_argument(
        "--bucket", required=True, help="S3 bucket for the zipped source (created if missing)"
    )
    parser.add_argument("--prefix", default="semif-adapter/build", help="S3 key prefix for the source")
    parser.add_argument(
        "--project", default=None, help="CodeBuild project (default semif-adapter-image-build)"
    )
    parser.add_argument("--role-arn", help="CodeBuild service role; default: create/update semif-codebuild")
    parser.add_argument("--compute-type", default="BUILD_GENERAL1_LARGE")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the build")
    parser.add_argument("--poll", type=float, default=15, help="seconds between status checks")
    parser.add_argument("--print-only", action="store_true", help="print local docker commands and stop")
    parser.add_argument(
        "--context",
        type=Path,
        default=ROOT / "docker",
        help="folder holding the prepared wheelhouse/ and llama-headers/ (default: docker/)",
    )
    aws.add_session_args(parser)
    args = parser.parse_args(argv)

    if problem := dockerfile.check_base_image(args.base_image):
        raise UsageError(problem)
    if args.variant == "gpu" and args.platform != "linux/amd64":
        raise UsageError("the CUDA DLC is x86_64 only; use --platform linux/amd64 for --variant gpu")
    try:
        _, build_args = prepared_context(args.context, args.platform)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    llama = dict(a.split("=", 1) for a in build_args if "=" in a)
    repository = args.repository or f"semif-adapter-{args.variant}"
    tag = args.tag or f"{args.variant}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    project = args.project or "semif-adapter-image-build"
    session = {"region": args.region, "profile": args.profile}

    if args.print_only:
        print(
            local_commands(
                args.variant,
                args.platform,
                args.base_image,
                f"<account>.dkr.ecr.<region>.amazonaws.com/{repository}",
                tag,
                build_args,
            )
        )
        return 0
    ecr = aws.client("ecr", **session)
    s3 = aws.client("s3", **session)
    cb = aws.client("codebuild", **session)
    repository_uri = ensure_repository(ecr, repository)
    repository_arn = ecr.describe_repositories(repositoryNames=[repository])["repositories"][0][
        "repositoryArn"
    ]
    aws.ensure_bucket(s3, args.bucket)
    key = f"{args.prefix.strip('/')}/source-{tag}.zip"
    s3.put_object(Bucket=args.bucket, Key=key, Body=source_zip(ROOT, args.context))
    role_arn = args.role_arn or aws.ensure_codebuild_role(
        aws.client("iam", **session), "semif-codebuild", role_policy(args.bucket, repository_arn)
    )
    env_type, image = CODEBUILD_IMAGES[args.platform]
    aws.ensure_codebuild_project(
        cb,
        {
            "name": project,
            "description": "Builds semif-adapter images (semif-ops image build)",
            "source": {"type": "S3", "location": f"{args.bucket}/{key}", "buildspec": buildspec()},
            "artifacts": {"type": "NO_ARTIFACTS"},
            "environment": {
                "type": env_type,
                "image": image,
                "computeType": args.compute_type,
                "privilegedMode": True,
            },
            "serviceRole": role_arn,
            "timeoutInMinutes": 120,
        },
    )
    variables = {
        "VARIANT": args.variant,
        "BASE_IMAGE": args.base_image,
        "PLATFORM": args.platform,
        "REPOSITORY_URI": repository_uri,
        "IMAGE_TAG": tag,
        "LLAMA_CPP_VERSION": llama.get("LLAMA_CPP_VERSION", ""),
        "LLAMA_CPP_COMMIT": llama.get("LLAMA_CPP_COMMIT", ""),
    }
    record = aws.run_codebuild(
        cb,
        project=project,
        overrides={
            "sourceTypeOverride": "S3",
            "sourceLocationOverride": f"{args.bucket}/{key}",
            "buildspecOverride": buildspec(),
            "imageOverride": image,
            "environmentTypeOverride": env_type,
            "environmentVariablesOverride": [
                {"name": k, "value": v, "type": "PLAINTEXT"} for k, v in variables.items()
            ],
        },
        timeout_s=args.timeout,
        interval_s=args.poll,
    )
    if record.get("buildStatus") != "SUCCEEDED":
        raise OperationFailed(
            f"CodeBuild {record.get('id')} ended {record.get('buildStatus')} in phase "
            f"{record.get('currentPhase')}; see its CloudWatch logs"
        )
    details = ecr.describe_images(repositoryName=repository, imageIds=[{"imageTag": tag}])
    digest = str(details["imageDetails"][0]["imageDigest"])
    exported = {v["name"]: v["value"] for v in record.get("exportedEnvironmentVariables", []) if "name" in v}
    if exported.get("IMAGE_DIGEST") and exported["IMAGE_DIGEST"] != digest:
        raise OperationFailed(f"build reported {exported['IMAGE_DIGEST']} but ECR has {digest} for tag {tag}")
    print("# equivalent local build:", file=sys.stderr)
    print(
        local_commands(args.variant, args.platform, args.base_image, repository_uri, tag, build_args),
        file=sys.stderr,
    )
    print(f"{repository_uri}@{digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
