"""Build and push the semif-adapter image through AWS CodeBuild into ECR; print the digest-pinned URI.

No local Docker needed: the source is zipped to S3, a privileged CodeBuild project (created if missing)
runs `docker build`/`docker push`, and the digest comes back from ECR. The equivalent local commands are
printed too.

    python scripts/build_image.py --variant cpu --bucket my-build-bucket \
        --base-image public.ecr.aws/deep-learning-containers/llama-cpp@sha256:<64 hex>
    python scripts/build_image.py --variant cpu --platform linux/arm64 --repository semif-adapter-arm64 \
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

try:
    from scripts import _aws, _dockerfile
except ModuleNotFoundError:  # run as a file: python scripts/build_image.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from scripts import _aws, _dockerfile

ROOT = Path(__file__).resolve().parents[1]
SOURCE_FILES = (
    "Dockerfile.cpu",
    "Dockerfile.gpu",
    "pyproject.toml",
    "README.md",
    "model-manifest.json",
    "scripts/__init__.py",
    "scripts/_dockerfile.py",
    "scripts/check_dockerfiles.py",
)
SOURCE_DIRS = ("docker", "semif_adapter")
CODEBUILD_IMAGES = {
    "linux/amd64": ("LINUX_CONTAINER", "aws/codebuild/amazonlinux-x86_64-standard:5.0"),
    "linux/arm64": ("ARM_CONTAINER", "aws/codebuild/amazonlinux-aarch64-standard:3.0"),
}


def source_zip(root: Path = ROOT) -> bytes:
    """Zip what `docker build` needs (executable bits kept: the entrypoint must stay executable)."""
    paths = [root / f for f in SOURCE_FILES if (root / f).is_file()]
    for directory in SOURCE_DIRS:
        paths += sorted(
            p for p in (root / directory).rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in paths:
            info = zipfile.ZipInfo(str(path.relative_to(root)), date_time=(2020, 1, 1, 0, 0, 0))
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
                    'python3 scripts/check_dockerfiles.py --base-image "$BASE_IMAGE" "Dockerfile.$VARIANT"',
                    'aws ecr get-login-password --region "$AWS_REGION" '
                    '| docker login --username AWS --password-stdin "${REPOSITORY_URI%%/*}"',
                ]
            },
            "build": {
                "commands": [
                    'DOCKER_BUILDKIT=1 docker build --platform "$PLATFORM" -f "Dockerfile.$VARIANT" '
                    '--build-arg BASE_IMAGE="$BASE_IMAGE" -t "$REPOSITORY_URI:$IMAGE_TAG" .',
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
        if _aws.error_code(exc) != "RepositoryNotFoundException":
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
            *_aws.codebuild_base_statements(bucket),
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


def local_commands(variant: str, platform: str, base_image: str, repository_uri: str, tag: str) -> str:
    registry = repository_uri.split("/", 1)[0]
    region = registry.split(".")[3] if registry.count(".") >= 3 else "<region>"
    return "\n".join(
        [
            f"aws ecr get-login-password --region {region} | docker login --username AWS "
            f"--password-stdin {registry}",
            f"docker build --platform {platform} -f Dockerfile.{variant} "
            f"--build-arg BASE_IMAGE={base_image} -t {repository_uri}:{tag} .",
            f"docker push {repository_uri}:{tag}",
            f"docker inspect --format '{{{{index .RepoDigests 0}}}}' {repository_uri}:{tag}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    _aws.add_session_args(parser)
    args = parser.parse_args(argv)

    if problem := _dockerfile.check_base_image(args.base_image):
        return _aws.fail(problem)
    if args.variant == "gpu" and args.platform != "linux/amd64":
        return _aws.fail("the CUDA DLC is x86_64 only; use --platform linux/amd64 for --variant gpu")
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
            )
        )
        return 0
    try:
        ecr = _aws.client("ecr", **session)
        s3 = _aws.client("s3", **session)
        cb = _aws.client("codebuild", **session)
        repository_uri = ensure_repository(ecr, repository)
        repository_arn = ecr.describe_repositories(repositoryNames=[repository])["repositories"][0][
            "repositoryArn"
        ]
        _aws.ensure_bucket(s3, args.bucket)
        key = f"{args.prefix.strip('/')}/source-{tag}.zip"
        s3.put_object(Bucket=args.bucket, Key=key, Body=source_zip())
        role_arn = args.role_arn or _aws.ensure_codebuild_role(
            _aws.client("iam", **session), "semif-codebuild", role_policy(args.bucket, repository_arn)
        )
        env_type, image = CODEBUILD_IMAGES[args.platform]
        _aws.ensure_codebuild_project(
            cb,
            {
                "name": project,
                "description": "Builds semif-adapter images (scripts/build_image.py)",
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
        }
        record = _aws.run_codebuild(
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
            return _aws.fail(
                f"CodeBuild {record.get('id')} ended {record.get('buildStatus')} in phase "
                f"{record.get('currentPhase')}; see its CloudWatch logs"
            )
        details = ecr.describe_images(repositoryName=repository, imageIds=[{"imageTag": tag}])
        digest = str(details["imageDetails"][0]["imageDigest"])
    except ClientError as exc:
        return _aws.fail(f"AWS: {exc}")
    except TimeoutError as exc:
        return _aws.fail(str(exc))
    exported = {v["name"]: v["value"] for v in record.get("exportedEnvironmentVariables", []) if "name" in v}
    if exported.get("IMAGE_DIGEST") and exported["IMAGE_DIGEST"] != digest:
        return _aws.fail(f"build reported {exported['IMAGE_DIGEST']} but ECR has {digest} for tag {tag}")
    print("# equivalent local build:", file=sys.stderr)
    print(local_commands(args.variant, args.platform, args.base_image, repository_uri, tag), file=sys.stderr)
    print(f"{repository_uri}@{digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
