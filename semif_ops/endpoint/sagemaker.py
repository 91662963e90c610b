"""SageMaker pieces more than one operation uses: the model, the variant name, the role check.

``endpoint deploy`` (and its --stock form) and ``endpoint batch`` create models the same way; ``endpoint
scale`` and ``endpoint cleanup`` address the variant deploy creates.
"""

from __future__ import annotations

import re
from typing import Any

from semif_ops import aws

ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")
VARIANT = "AllTraffic"  # the one production variant deploy creates


def create_model(
    sm: Any,
    *,
    name: str,
    image: aws.ImageRef,
    model_data: str,
    role_arn: str,
    environment: dict[str, str],
    tags: list[dict[str, str]],
    network_isolation: bool = True,
) -> None:
    """CreateModel with the digest-pinned image."""
    sm.create_model(
        ModelName=name,
        ExecutionRoleArn=role_arn,
        PrimaryContainer={"Image": image.uri, "ModelDataUrl": model_data, "Environment": environment},
        EnableNetworkIsolation=network_isolation,
        Tags=tags,
    )
