"""semif-ops image build and semif-ops model prepare against moto (S3, ECR, IAM, CodeBuild).

moto's CodeBuild records builds and reports them SUCCEEDED but never runs a buildspec, so the image the
buildspec would push is put into moto's ECR by the test; the script must then read its digest from ECR.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import boto3
import pytest

from semif_ops.image import build as build_image
from semif_ops.image import dockerfile as _dockerfile
from semif_ops.model import prepare as prepare_model_build
from tests.helpers.deploy import DIGEST, REPO_ROOT, write_manifest

BASE = f"public.ecr.aws/deep-learning-containers/llama-cpp@sha256:{DIGEST}"


def prepared(tmp_path: Path, arch: str = "x86_64") -> str:
    """A prepared build context as semif-ops image context leaves it (wheels stubbed)."""
    wheelhouse = tmp_path / "docker" / "wheelhouse"
    wheelhouse.mkdir(parents=True)
    (wheelhouse / "context.json").write_text(
        json.dumps({"python": "3.12", "arch": arch, "binding": "0.3.36"})
    )
    (wheelhouse / "build-args").write_text(
        "--build-arg LLAMA_CPP_VERSION=0.4.1\n--build-arg LLAMA_CPP_COMMIT=f00dcafe\n"
    )
    (wheelhouse / "pip-25.3-py3-none-any.whl").write_bytes(b"stub")
    (tmp_path / "docker" / "llama-headers").mkdir()
    (tmp_path / "docker" / "llama-headers" / "llama.h").write_text("/* stub */\n")
    return str(tmp_path / "docker")


def pushed_image(repository: str, tag: str) -> str:
    """What `docker push` would leave in ECR; returns its digest."""
    ecr = boto3.client("ecr", region_name="us-east-1")
    ecr.create_repository(repositoryName=repository)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"digest": "sha256:" + "1" * 64, "size": 1},
            "layers": [],
        }
    )
    image = ecr.put_image(repositoryName=repository, imageManifest=manifest, imageTag=tag)["image"]
    return str(image["imageId"]["imageDigest"])


def test_build_pushes_through_codebuild_and_prints_digest_uri(
    moto_aws: None,
    calls: list[tuple[str, str, dict[str, Any]]],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    digest = pushed_image("semif-adapter-cpu", "cpu-test")
    rc = build_image.main(
        [
            "--variant",
            "cpu",
            "--base-image",
            BASE,
            "--bucket",
            "build-src",
            "--tag",
            "cpu-test",
            "--poll",
            "0",
            "--context",
            prepared(tmp_path),
        ]
    )
    assert rc == 0
    out, err = capsys.readouterr()
    repo_uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-adapter-cpu"
    assert out.strip() == f"{repo_uri}@{digest}"
    assert (
        f"docker build --platform linux/amd64 -f Dockerfile.cpu --build-arg BASE_IMAGE={BASE} "
        "--build-arg LLAMA_CPP_VERSION=0.4.1 --build-arg LLAMA_CPP_COMMIT=f00dcafe -t" in err
    )

    ops = [(service, op) for service, op, _ in calls]
    assert [op for op in ops if op[0] != "sts"] == [
        ("ecr", "DescribeRepositories"),
        ("ecr", "DescribeRepositories"),
        ("s3", "HeadBucket"),
        ("s3", "CreateBucket"),
        ("s3", "PutObject"),
        ("iam", "GetRole"),
        ("iam", "CreateRole"),
        ("iam", "PutRolePolicy"),
        ("codebuild", "BatchGetProjects"),
        ("codebuild", "CreateProject"),
        ("codebuild", "StartBuild"),
        ("codebuild", "BatchGetBuilds"),
        ("ecr", "DescribeImages"),
    ]
    params = {op: p for _, op, p in calls}
    project = params["CreateProject"]
    assert project["environment"]["privilegedMode"] is True
    assert project["environment"]["type"] == "LINUX_CONTAINER"
    start = params["StartBuild"]
    env = {v["name"]: v["value"] for v in start["environmentVariablesOverride"]}
    assert env == {
        "VARIANT": "cpu",
        "BASE_IMAGE": BASE,
        "PLATFORM": "linux/amd64",
        "REPOSITORY_URI": repo_uri,
        "IMAGE_TAG": "cpu-test",
        "LLAMA_CPP_VERSION": "0.4.1",
        "LLAMA_CPP_COMMIT": "f00dcafe",
    }
    assert start["sourceLocationOverride"] == "build-src/semif-adapter/build/source-cpu-test.zip"
    assert params["DescribeImages"]["imageIds"] == [{"imageTag": "cpu-test"}]

    source = (
        boto3.client("s3", region_name="us-east-1")
        .get_object(Bucket="build-src", Key="semif-adapter/build/source-cpu-test.zip")["Body"]
        .read()
    )
    with zipfile.ZipFile(io.BytesIO(source)) as archive:
        names = set(archive.namelist())
        assert {
            "Dockerfile.cpu",
            "Dockerfile.gpu",
            "pyproject.toml",
            "docker/entrypoint.sh",
            "docker/requirements.lock",
            "semif_adapter/model/manifest.py",
            "semif_ops/image/abi.py",
            "docker/check-base.sh",
            "docker/wheelhouse/context.json",
            "docker/wheelhouse/pip-25.3-py3-none-any.whl",
            "docker/llama-headers/llama.h",
        } <= names
        assert not any("__pycache__" in n for n in names)
        for dockerfile in ("Dockerfile.cpu", "Dockerfile.gpu"):  # everything the build COPYs is shipped
            for ins in _dockerfile.parse((REPO_ROOT / dockerfile).read_text()):
                if ins.keyword == "COPY" and "--from=" not in ins.args:
                    for source in ins.args.split()[:-1]:
                        assert source in names or any(n.startswith(source + "/") for n in names), source
        mode = archive.getinfo("docker/entrypoint.sh").external_attr >> 16
        assert mode & 0o111, "entrypoint must stay executable"


def test_tag_only_base_is_refused_before_any_aws_call(
    calls: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = build_image.main(
        [
            "--variant",
            "gpu",
            "--bucket",
            "b-src",
            "--base-image",
            "public.ecr.aws/deep-learning-containers/llama-cpp:server-sagemaker-cuda-v1",
        ]
    )
    assert rc != 0
    assert "tag-only" in capsys.readouterr().err
    assert calls == []


def test_gpu_on_arm64_is_refused(calls: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    rc = build_image.main(
        ["--variant", "gpu", "--platform", "linux/arm64", "--bucket", "b-src", "--base-image", BASE]
    )
    assert rc != 0 and "x86_64 only" in capsys.readouterr().err
    assert calls == []


def test_graviton_build_uses_an_arm_codebuild_environment(
    moto_aws: None, calls: list[tuple[str, str, dict[str, Any]]], tmp_path: Path
) -> None:
    arm_base = BASE.replace("llama-cpp@", "llama-cpp-arm64@")
    pushed_image("semif-adapter-arm64", "arm-1")
    rc = build_image.main(
        [
            "--variant",
            "cpu",
            "--platform",
            "linux/arm64",
            "--repository",
            "semif-adapter-arm64",
            "--tag",
            "arm-1",
            "--base-image",
            arm_base,
            "--bucket",
            "build-src",
            "--poll",
            "0",
            "--context",
            prepared(tmp_path, "aarch64"),
        ]
    )
    assert rc == 0
    params = {op: p for _, op, p in calls}
    assert params["CreateProject"]["environment"]["type"] == "ARM_CONTAINER"
    assert params["StartBuild"]["environmentTypeOverride"] == "ARM_CONTAINER"


@pytest.mark.parametrize(
    ("arch", "platform", "message"),
    [
        (None, "linux/amd64", "no prepared build context in"),
        (
            "x86_64",
            "linux/arm64",
            "the wheelhouse is for x86_64, the build for linux/arm64; run: make image-context",
        ),
    ],
)
def test_unprepared_or_wrong_arch_context_is_refused_before_any_aws_call(
    tmp_path: Path,
    calls: list[Any],
    capsys: pytest.CaptureFixture[str],
    arch: str | None,
    platform: str,
    message: str,
) -> None:
    context = prepared(tmp_path, arch) if arch else str(tmp_path)
    argv = [
        "--variant",
        "cpu",
        "--platform",
        platform,
        "--bucket",
        "b",
        "--base-image",
        BASE,
        "--context",
        context,
    ]
    assert build_image.main(argv) != 0
    assert message in capsys.readouterr().err
    assert calls == []


def test_buildspec_is_valid_and_checks_the_base() -> None:
    spec = json.loads(build_image.buildspec())
    pre = " ".join(spec["phases"]["pre_build"]["commands"])
    assert "python3 -m semif_ops.image.check --base-image" in pre
    build = " ".join(spec["phases"]["build"]["commands"])
    assert '--build-arg LLAMA_CPP_VERSION="$LLAMA_CPP_VERSION"' in build
    assert spec["env"]["exported-variables"] == ["IMAGE_DIGEST"]


def test_the_codebuild_check_runs_from_the_source_zip_alone(tmp_path: Path) -> None:
    """CodeBuild has the zip and a bare python3: the pre-build check must import nothing from elsewhere
    (``-S``: no site-packages, so no installed semif_ops or third-party module can stand in)."""
    with zipfile.ZipFile(io.BytesIO(build_image.source_zip())) as archive:
        archive.extractall(tmp_path)
    check = json.loads(build_image.buildspec())["phases"]["pre_build"]["commands"][0]
    base = f"public.ecr.aws/deep-learning-containers/llama-cpp@sha256:{DIGEST}"
    argv = check.replace('"$BASE_IMAGE"', base).replace('"Dockerfile.$VARIANT"', "Dockerfile.cpu").split()
    assert argv[:3] == ["python3", "-m", "semif_ops.image.check"]
    done = subprocess.run([sys.executable, "-S", *argv[1:]], cwd=tmp_path, capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, "ok: Dockerfile.cpu"), done.stderr


def test_model_build_project_downloads_verifies_and_uploads(
    moto_aws: None,
    tmp_path: Path,
    calls: list[tuple[str, str, dict[str, Any]]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    written = tmp_path / "buildspec.yml"
    rc = prepare_model_build.main(
        [
            "--bucket",
            "model-src",
            "--output",
            "s3://models/semif/qwen/model.tar.gz",
            "--write",
            str(written),
            "--start",
            "--wait",
            "--poll",
            "0",
        ]
    )
    assert rc == 0
    spec = json.loads(written.read_text())
    variables = spec["env"]["variables"]
    manifest = json.loads((REPO_ROOT / "model-manifest.json").read_text())
    assert variables["MODEL_SHA256"] == manifest["sha256"]
    assert variables["MODEL_BYTES"] == str(manifest["bytes"])
    assert variables["MODEL_REVISION"] == manifest["revision"]
    commands = "\n".join(spec["phases"]["build"]["commands"])
    assert "sha256sum -c" in commands and 'aws s3 cp model.tar.gz "$OUTPUT_URI"' in commands
    ops = [op for _, op, _ in calls]
    assert ops.index("PutObject") < ops.index("CreateProject") < ops.index("StartBuild")
    source = (
        boto3.client("s3", region_name="us-east-1")
        .get_object(Bucket="model-src", Key=f"semif-adapter/model-build/{manifest['file']}.zip")["Body"]
        .read()
    )
    with zipfile.ZipFile(io.BytesIO(source)) as archive:
        assert json.loads(archive.read("model-manifest.json")) == manifest
        assert json.loads(archive.read("buildspec.yml")) == spec
    assert "model packaged: s3://models/semif/qwen/model.tar.gz" in capsys.readouterr().out


def test_model_build_refuses_bad_manifest_and_output(
    tmp_path: Path, gemma_gguf: Path, calls: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_manifest(tmp_path, gemma_gguf, sha256="nothex")
    assert (
        prepare_model_build.main(
            ["--bucket", "b-src", "--output", "s3://models/m/model.tar.gz", "--manifest", str(bad)]
        )
        != 0
    )
    assert "sha256 must be 64 hex" in capsys.readouterr().err
    assert prepare_model_build.main(["--bucket", "b-src", "--output", "models/model.tar.gz"]) != 0
    assert "s3://" in capsys.readouterr().err
    assert calls == []
