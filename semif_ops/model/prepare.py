"""Package the pinned model in AWS CodeBuild instead of on this machine (no local disk or bandwidth needed).

Writes a buildspec that downloads the manifest's file at its pinned revision, checks size and sha256,
builds model.tar.gz (GGUF + model-manifest.json) and copies it to S3; uploads it with the manifest as a
zip source, and creates (or updates) the CodeBuild project. --start runs it, --wait follows it.

    semif-ops model prepare --bucket my-bucket --output s3://my-bucket/semif/qwen/model.tar.gz \
        --start --wait
"""

from __future__ import annotations

import argparse
import io
import json
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from semif_adapter.model.manifest import MANIFEST_NAME, ModelManifest, load_manifest
from semif_ops import aws
from semif_ops.errors import OperationFailed
from semif_ops.exits import command

ROOT = Path(__file__).resolve().parents[2]


def buildspec(manifest: ModelManifest, output_uri: str) -> str:
    """Buildspec (JSON, which is valid YAML) that reproduces semif-ops model package's checks in shell."""
    check_size = (
        'test "$(stat -c %s "dl/$MODEL_FILE")" = "$MODEL_BYTES" '
        '|| { echo "size mismatch: $(stat -c %s "dl/$MODEL_FILE") != $MODEL_BYTES"; exit 1; }'
    )
    spec = {
        "version": 0.2,
        "env": {
            "variables": {
                "MODEL_REPO": manifest.source_repo,
                "MODEL_REVISION": manifest.revision,
                "MODEL_FILE": manifest.file,
                "MODEL_BYTES": str(manifest.bytes),
                "MODEL_SHA256": manifest.sha256,
                "OUTPUT_URI": output_uri,
            }
        },
        "phases": {
            "install": {"commands": ['python3 -m pip install --quiet "huggingface-hub>=0.24"']},
            "build": {
                "commands": [
                    'python3 -c "import os; from huggingface_hub import hf_hub_download; '
                    "hf_hub_download(os.environ['MODEL_REPO'], os.environ['MODEL_FILE'], "
                    "revision=os.environ['MODEL_REVISION'], local_dir='dl')\"",
                    check_size,
                    'echo "$MODEL_SHA256  dl/$MODEL_FILE" | sha256sum -c -',
                    f'mkdir -p model && mv "dl/$MODEL_FILE" model/ && cp {MANIFEST_NAME} model/',
                    "tar -C model -cf - . | gzip -1 > model.tar.gz",
                    'aws s3 cp model.tar.gz "$OUTPUT_URI"',
                ]
            },
        },
    }
    return json.dumps(spec, indent=2)


def source_zip(spec: str, manifest_bytes: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("buildspec.yml", spec)
        archive.writestr(MANIFEST_NAME, manifest_bytes)
    return buffer.getvalue()


def role_policy(source_bucket: str, output_bucket: str, output_key: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            *aws.codebuild_base_statements(source_bucket),
            {
                "Effect": "Allow",
                "Action": ["s3:PutObject"],
                "Resource": f"arn:aws:s3:::{output_bucket}/{output_key}",
            },
        ],
    }


@command
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--manifest", type=Path, default=ROOT / MANIFEST_NAME)
    parser.add_argument("--bucket", required=True, help="bucket for the build source (created if missing)")
    parser.add_argument("--prefix", default="semif-adapter/model-build")
    parser.add_argument("--output", required=True, help="s3://bucket/key.tar.gz the build writes")
    parser.add_argument("--project", default="semif-adapter-model-build")
    parser.add_argument("--role-arn", help="CodeBuild service role; default: create/update semif-model-build")
    parser.add_argument("--write", type=Path, help="also write the buildspec to this local file")
    parser.add_argument("--start", action="store_true", help="start the build after creating the project")
    parser.add_argument("--wait", action="store_true", help="with --start: follow the build to the end")
    parser.add_argument("--timeout", type=float, default=7200)
    parser.add_argument("--poll", type=float, default=20)
    aws.add_session_args(parser)
    args = parser.parse_args(argv)

    out_bucket, out_key = aws.parse_model_data(args.output)
    manifest = load_manifest(args.manifest)
    spec = buildspec(manifest, args.output)
    if args.write:
        args.write.write_text(spec + "\n", encoding="utf-8")
    session = {"region": args.region, "profile": args.profile}
    key = f"{args.prefix.strip('/')}/{manifest.file}.zip"
    s3 = aws.client("s3", **session)
    aws.ensure_bucket(s3, args.bucket)
    s3.put_object(Bucket=args.bucket, Key=key, Body=source_zip(spec, args.manifest.read_bytes()))
    role_arn = args.role_arn or aws.ensure_codebuild_role(
        aws.client("iam", **session),
        "semif-model-build",
        role_policy(args.bucket, out_bucket, out_key),
    )
    cb = aws.client("codebuild", **session)
    aws.ensure_codebuild_project(
        cb,
        {
            "name": args.project,
            "description": f"Downloads, verifies and packages {manifest.file} into {args.output}",
            "source": {"type": "S3", "location": f"{args.bucket}/{key}"},
            "artifacts": {"type": "NO_ARTIFACTS"},
            "environment": {
                "type": "LINUX_CONTAINER",
                "image": "aws/codebuild/amazonlinux-x86_64-standard:5.0",
                "computeType": "BUILD_GENERAL1_MEDIUM",
            },
            "serviceRole": role_arn,
            "timeoutInMinutes": 120,
        },
    )
    print(f"project {args.project}: source s3://{args.bucket}/{key} -> {args.output}")
    if not args.start:
        print(f"start it with: aws codebuild start-build --project-name {args.project}")
        return 0
    if not args.wait:
        build = cb.start_build(projectName=args.project)["build"]
        print(f"started {build['id']}")
        return 0
    record = aws.run_codebuild(
        cb, project=args.project, overrides={}, timeout_s=args.timeout, interval_s=args.poll
    )
    if record.get("buildStatus") != "SUCCEEDED":
        raise OperationFailed(f"model build {record.get('id')} ended {record.get('buildStatus')}")
    print(f"model packaged: {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
