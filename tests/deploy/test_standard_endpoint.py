"""semif-ops endpoint deploy --stock: the stock DLC configured through SM_LLAMA_CPP_* (moto)."""

from __future__ import annotations

from typing import Any

import pytest

from semif_ops.endpoint import deploy_stock as deploy_standard_endpoint
from tests.helpers.deploy import DIGEST

DLC = f"763104351884.dkr.ecr.us-east-1.amazonaws.com/llama-cpp@sha256:{DIGEST}"
ARGS = [
    "--name",
    "llamacpp-test",
    "--role-arn",
    "arn:aws:iam::123456789012:role/R",
    "--model-data",
    "s3://models/semif/qwen/model.tar.gz",
    "--instance-type",
    "ml.g4dn.xlarge",
]


def test_stock_dlc_gets_llama_server_flags_as_environment(
    moto_aws: None, calls: list[tuple[str, str, dict[str, Any]]]
) -> None:
    rc = deploy_standard_endpoint.main(
        [
            *ARGS,
            "--image",
            DLC,
            "--gpu-layers",
            "999",
            "--llama-arg",
            "threads=8",
            "--llama-arg=--flash-attn=on",
        ]
    )
    assert rc == 0
    assert [op for _, op, _ in calls] == ["CreateModel", "CreateEndpointConfig", "CreateEndpoint"]
    container = calls[0][2]["PrimaryContainer"]
    assert container["Image"] == DLC
    assert container["Environment"] == {
        "SM_LLAMA_CPP_CTX_SIZE": "8192",
        "SM_LLAMA_CPP_N_GPU_LAYERS": "999",
        "SM_LLAMA_CPP_THREADS": "8",
        "SM_LLAMA_CPP_FLASH_ATTN": "on",
    }
    assert calls[1][2]["ProductionVariants"][0]["InstanceType"] == "ml.g4dn.xlarge"


def test_stock_dlc_tag_and_bad_flag_are_refused(calls: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        deploy_standard_endpoint.main([*ARGS, "--image", DLC.split("@")[0] + ":server-sagemaker-cuda-v1"])
        != 0
    )
    assert "not pinned by digest" in capsys.readouterr().err
    assert deploy_standard_endpoint.main([*ARGS, "--image", DLC, "--llama-arg", "Bad Flag=1"]) != 0
    assert "long flag" in capsys.readouterr().err
    assert calls == []
