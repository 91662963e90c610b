"""The official ``typesafe_sdk`` client, unmodified, against the live server and through SageMaker.

SageMaker is simulated with botocore's Stubber, not moto: moto's InvokeEndpoint returns canned bodies
and cannot check what was sent, nor return a container error as ``ModelError`` with
``OriginalStatusCode``/``OriginalMessage``. The stub's answer is the live server's real
``/invocations`` answer to the very body the SDK sent.
"""

from __future__ import annotations

import io
import json

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber
from typesafe_sdk import (
    Choice,
    Noul,
    RetryPolicy,
    Score,
    TypeSafeAuthenticationError,
    TypeSafeClient,
    TypeSafeNotFoundError,
    TypeSafeUnprocessableEntityError,
)

from semif_client.sagemaker_transport import SageMakerTransport
from tests.helpers.systemone import CHOICE, NOUL, SCORE, STATE, check_answer

NO_RETRY = RetryPolicy(max_retries=0)
TIMEOUT = 120.0  # 2 shared cores: the SDK default of 10 s is too short under parallel test load


def sdk_questions():
    return {
        "billing": Noul(instructions=NOUL["instructions"]),
        "tone": Choice(instructions=CHOICE["instructions"], criteria=CHOICE["criteria"]),
        "urgency": Score(instructions=SCORE["instructions"], criteria=SCORE["criteria"]),
    }


def test_sdk_parses_every_answer_type_and_the_model_list(live_server, s1):
    with TypeSafeClient(
        api_key="unused", base_url=live_server.url, model="jev-preview", retry=NO_RETRY, timeout=TIMEOUT
    ) as client:
        result = client.system_one(state=STATE, questions=sdk_questions())
        listing = client.models.list()
        with pytest.raises(TypeSafeUnprocessableEntityError) as info:
            client.system_one(state=STATE, questions={"u": Score(criteria=["only one level"])})
    raw = result.raw_http_response.json()
    assert result.model == listing.models[0].name == raw["model"]
    assert 0.0 <= result.nouls["billing"].noul <= 1.0
    assert result.choices["tone"].choice in CHOICE["criteria"]
    assert set(result.scores["urgency"].probabilities) == {0, 1, 2}
    for qid, question in {"billing": NOUL, "tone": CHOICE, "urgency": SCORE}.items():
        check_answer(raw["answers"][qid], question)
    assert result.usage.input_tokens == raw["usage"]["input_tokens"] > 0 and result.usage.output_tokens == 0
    assert [m.name for m in listing.models][1:] == ["jev-latest", "jev-preview"]
    assert info.value.status == 422 and "questions.u.score.criteria" in str(info.value)


def test_sdk_through_sagemaker_invoke_endpoint(s1):
    runtime = boto3.client(
        "sagemaker-runtime", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    sent = {"state": STATE, "model": "jev-latest", "questions": {"b": NOUL, "t": CHOICE}}  # SDK key order
    container = s1.post("/invocations", json=sent)  # what the endpoint's container answers
    bad = {"model": "jev-latest", "state": STATE, "questions": {"b": {"type": "box", "instructions": "dog"}}}
    refused = s1.post("/invocations", json=bad)
    assert container.status_code == 200 and refused.status_code == 422
    with Stubber(runtime) as stub:
        stub.add_response(
            "invoke_endpoint",
            {
                "Body": StreamingBody(io.BytesIO(container.content), len(container.content)),
                "ContentType": "application/json",
            },
            expected_params={
                "EndpointName": "semif-ep",
                "Body": json.dumps(sent, separators=(",", ":")).encode(),
                "ContentType": "application/json",
                "Accept": "application/json",
            },
        )
        stub.add_client_error(
            "invoke_endpoint",
            service_error_code="ModelError",
            service_message="Received client error (422) from primary",
            http_status_code=424,
            modeled_fields={"OriginalStatusCode": 422, "OriginalMessage": refused.text},
        )
        stub.add_client_error(
            "invoke_endpoint", service_error_code="AccessDeniedException", http_status_code=401
        )
        transport = SageMakerTransport("semif-ep", client=runtime)
        with TypeSafeClient(
            api_key="unused", transport=transport, retry=NO_RETRY, compression=False, timeout=TIMEOUT
        ) as client:
            result = client.system_one(
                state=STATE,
                questions={
                    "b": Noul(instructions=NOUL["instructions"]),
                    "t": Choice(instructions=CHOICE["instructions"], criteria=CHOICE["criteria"]),
                },
            )
            with pytest.raises(TypeSafeUnprocessableEntityError) as info:
                client.system_one(state=STATE, questions={"b": {"type": "box", "instructions": "dog"}})
            with pytest.raises(TypeSafeAuthenticationError):
                client.system_one(state=STATE, questions={"b": Noul(instructions="x")})
        stub.assert_no_pending_responses()
    assert result.raw_http_response.json() == container.json()
    assert result.nouls["b"].noul == container.json()["answers"]["b"]["noul"]
    assert "questions.b.type" in str(info.value)


def test_transport_refuses_what_sagemaker_cannot_route():
    transport = SageMakerTransport("ep", client=object())  # never called: nothing to invoke
    with TypeSafeClient(api_key="unused", transport=transport, retry=NO_RETRY, timeout=TIMEOUT) as client:
        with pytest.raises(TypeSafeNotFoundError) as info:
            client.models.list()
    assert info.value.status == 404 and "only POST /v1/systemone" in str(info.value)
