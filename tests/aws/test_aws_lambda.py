"""LambdaProcessor and LambdaInvoker.

moto runs no function code here (no Docker): with ``use_docker`` off it answers every
invoke by echoing the request payload. So the moto tests check the request and the
plumbing of a result; what a *function* returns or raises is injected with botocore's
``Stubber`` on the client, and each such test says so.
"""

from __future__ import annotations

import io
import json
import logging

import pytest
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber

import statebound as sb
from statebound.aws import LAMBDA_ASYNC_MAX_BYTES, LAMBDA_SYNC_MAX_BYTES, LambdaInvoker, LambdaProcessor
from statebound.host.processors import InvokeHandler, Pending, SendProcessor

from .helpers import Requests, make_delivery, make_request

SEND_PAYLOAD = ('{"event":"order.placed","data":{"order_id":7,"total":12.5},"metadata":{"idempotency_key":'
                '"order-1:3","instance_id":"order-1","send_id":"notify","caller_context":null}}')
INVOKE_PAYLOAD = ('{"invokeid":"charge","src":"charge-card","data":{"amount":12.5},"content":null,"metadata":'
                  '{"idempotency_key":"order-1:charge:1","instance_id":"order-1","invokeid":"charge",'
                  '"caller_context":{"request_id":"r-1"}}}')


@pytest.fixture
def lam(client):
    """A Lambda client with two functions deployed (moto will echo, never run them)."""
    iam, lam = client("iam"), client("lambda")
    role = iam.create_role(RoleName="fn", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    for name in ("notify", "charge-card"):
        lam.create_function(FunctionName=name, Runtime="python3.12", Role=role, Handler="fn.handler",
                            Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18})
    return lam


def _stub_result(stub, raw: bytes, function_error: str | None = None, params=None):
    response = {"StatusCode": 200, "Payload": StreamingBody(io.BytesIO(raw), len(raw))}
    if function_error:
        response["FunctionError"] = function_error
    stub.add_response("invoke", response, params or {"FunctionName": ANY, "InvocationType": ANY, "Payload": ANY})


# --------------------------------------------------------------------------- send processor


def test_processor_invokes_asynchronously_with_the_send_envelope(lam):
    processor = LambdaProcessor("notify", client=lam)
    assert isinstance(processor, SendProcessor)
    sent = Requests(lam)
    processor.deliver(make_delivery())
    assert sent.only("Invoke") == {"FunctionName": "notify", "InvocationType": "Event",
                                   "Payload": SEND_PAYLOAD.encode()}


def test_processor_function_from_the_target_and_a_qualifier(lam):
    sent = Requests(lam)
    LambdaProcessor(qualifier="$LATEST", client=lam).deliver(make_delivery(target="notify"))
    assert sent.only("Invoke")["FunctionName"] == "notify"
    assert sent.only("Invoke")["Qualifier"] == "$LATEST"
    with pytest.raises(sb.DeliveryRejected, match="only sends to its own function"):
        LambdaProcessor("notify", client=lam).deliver(make_delivery(target="charge-card"))


def test_processor_refuses_a_payload_over_the_async_limit(lam):
    processor = LambdaProcessor("notify", client=lam)
    sent = Requests(lam)
    room = LAMBDA_ASYNC_MAX_BYTES - len(SEND_PAYLOAD.replace('{"order_id":7,"total":12.5}', '""'))
    processor.deliver(make_delivery(data="x" * room))
    with pytest.raises(sb.PayloadTooLarge) as err:
        processor.deliver(make_delivery(data="x" * (room + 1)))
    assert (err.value.size, err.value.limit) == (LAMBDA_ASYNC_MAX_BYTES + 1, LAMBDA_ASYNC_MAX_BYTES)
    assert len(sent.of("Invoke")) == 1


# --------------------------------------------------------------------------- invoke handler, sync


def test_invoker_sync_request_and_result_on_moto(lam):
    invoker = LambdaInvoker(client=lam)
    assert isinstance(invoker, InvokeHandler)
    sent = Requests(lam)
    result = invoker.start(make_request(src="charge-card", caller_context={"request_id": "r-1"}))
    assert sent.only("Invoke") == {"FunctionName": "charge-card", "InvocationType": "RequestResponse",
                                   "Payload": INVOKE_PAYLOAD.encode()}
    # moto echoes the payload, so the parsed "result" is the request: no token was handed out
    assert result == json.loads(INVOKE_PAYLOAD)
    assert "token" not in result["metadata"]


def test_invoker_returns_the_functions_json_result(lam):
    # Stubber stands in for a function that returns {"charged": true, "ref": "ch_1"}
    invoker = LambdaInvoker("charge-card", client=lam)
    with Stubber(lam) as stub:
        _stub_result(stub, b'{"charged": true, "ref": "ch_1"}', params={
            "FunctionName": "charge-card", "InvocationType": "RequestResponse", "Payload": ANY})
        _stub_result(stub, b"")           # a function that returns nothing (a custom runtime)
        _stub_result(stub, b"null")       # a Python function that returns None
        assert invoker.start(make_request()) == {"charged": True, "ref": "ch_1"}
        assert invoker.start(make_request()) is None
        assert invoker.start(make_request()) is None


@pytest.mark.parametrize("raw", [b"<html>oops</html>", b'{"x": NaN}', b"\xff\xfe"])
def test_a_result_that_is_not_strict_json_is_rejected(lam, raw):
    # Stubber stands in for a custom runtime answering with something that is not JSON
    with Stubber(lam) as stub:
        _stub_result(stub, raw)
        with pytest.raises(sb.PayloadNotJSON):
            LambdaInvoker("charge-card", client=lam).start(make_request())


def test_a_function_error_is_retried_and_its_message_stays_in_the_log(lam, caplog):
    # Stubber stands in for a function that raised: Lambda answers 200 with FunctionError
    error = {"errorType": "GatewayTimeout", "errorMessage": "card 4242-4242 timed out", "stackTrace": []}
    with Stubber(lam) as stub:
        _stub_result(stub, json.dumps(error).encode(), "Unhandled")
        with caplog.at_level(logging.WARNING, logger="statebound.aws"), pytest.raises(sb.DeliveryFailed) as err:
            LambdaInvoker("charge-card", client=lam).start(make_request())
    assert err.value.code == "GatewayTimeout" and not isinstance(err.value, sb.DeliveryRejected)
    assert "4242" not in str(err.value) and "4242" in caplog.text


@pytest.mark.parametrize(("error_type", "fatal", "outcome"), [
    ("CardDeclined", (), sb.DeliveryFailed),
    ("CardDeclined", ("CardDeclined",), sb.DeliveryRejected),
    ("Runtime.ImportModuleError", (), sb.DeliveryRejected),
    ("Runtime.HandlerNotFound", (), sb.DeliveryRejected),
])
def test_which_function_errors_are_final(lam, error_type, fatal, outcome):
    # Stubber stands in for a function that raised error_type
    with Stubber(lam) as stub:
        _stub_result(stub, json.dumps({"errorType": error_type, "errorMessage": "m"}).encode(), "Unhandled")
        with pytest.raises(outcome, match=error_type.replace(".", r"\.")):
            LambdaInvoker("charge-card", fatal_errors=fatal, client=lam).start(make_request())


def test_a_function_error_without_a_json_body_is_still_a_retry(lam):
    # Stubber: a runtime crash can answer FunctionError with a body that is not JSON
    with Stubber(lam) as stub:
        _stub_result(stub, b"Segmentation fault", "Unhandled")
        with pytest.raises(sb.DeliveryFailed) as err:
            LambdaInvoker("charge-card", client=lam).start(make_request())
    assert err.value.code == "Unhandled"


@pytest.mark.parametrize(("code", "status", "outcome"), [
    ("TooManyRequestsException", 429, sb.DeliveryFailed),
    ("ServiceException", 500, sb.DeliveryFailed),
    ("ResourceConflictException", 409, sb.DeliveryFailed),       # the function is being updated
    ("EC2ThrottledException", 502, sb.DeliveryFailed),
    ("ResourceNotFoundException", 404, sb.DeliveryRejected),
    ("AccessDeniedException", 403, sb.DeliveryRejected),
    ("RequestTooLargeException", 413, sb.DeliveryRejected),
    ("InvalidRequestContentException", 400, sb.DeliveryRejected),
])
def test_invoke_call_errors(lam, code, status, outcome):
    # Stubber: moto cannot be made to throttle, and it accepts invokes of missing functions
    with Stubber(lam) as stub:
        stub.add_client_error("invoke", service_error_code=code, http_status_code=status)
        with pytest.raises(outcome, match=code):
            LambdaInvoker("charge-card", client=lam).start(make_request())


def test_invoker_function_comes_from_src_and_cannot_be_redirected(lam):
    sent = Requests(lam)
    with pytest.raises(sb.DeliveryRejected, match="no function"):
        LambdaInvoker(client=lam).start(make_request(src=None))
    with pytest.raises(sb.DeliveryRejected, match="only sends to its own function"):
        LambdaInvoker("charge-card", client=lam).start(make_request(src="notify"))
    assert sent.calls == []


def test_invoker_limits_sync_6_mib_callback_256_kib(lam):
    big = make_request(src="charge-card", data={"blob": "x" * (LAMBDA_ASYNC_MAX_BYTES + 1)})
    assert LambdaInvoker(client=lam).start(big)["data"] == big.data          # sync: within 6 MiB
    with pytest.raises(sb.PayloadTooLarge) as err:
        LambdaInvoker(callback=True, client=lam).start(big)
    assert err.value.limit == LAMBDA_ASYNC_MAX_BYTES
    with pytest.raises(sb.PayloadTooLarge) as err:
        LambdaInvoker(client=lam).start(make_request(src="charge-card", data={"blob": "x" * LAMBDA_SYNC_MAX_BYTES}))
    assert err.value.limit == LAMBDA_SYNC_MAX_BYTES


def test_invoker_data_that_is_not_strict_json_is_rejected(lam):
    sent = Requests(lam)
    with pytest.raises(sb.PayloadNotJSON):
        LambdaInvoker("charge-card", client=lam).start(make_request(data={"amount": float("inf")}))
    assert sent.calls == []


# --------------------------------------------------------------------------- invoke handler, callback


def test_callback_mode_queues_the_invoke_with_its_token_and_returns_pending(lam):
    sent = Requests(lam)
    answer = LambdaInvoker("charge-card", callback=True, client=lam).start(make_request())
    assert isinstance(answer, Pending)
    params = sent.only("Invoke")
    assert (params["FunctionName"], params["InvocationType"]) == ("charge-card", "Event")
    metadata = json.loads(params["Payload"])["metadata"]
    assert metadata == {"idempotency_key": "order-1:charge:1", "instance_id": "order-1", "invokeid": "charge",
                        "caller_context": None, "token": "tok-123"}


def test_default_sync_client_waits_longer_than_the_longest_function(aws):
    # botocore's default 60 s read timeout would retry a slow function, running it twice
    assert LambdaInvoker().client.meta.config.read_timeout > 900
    assert LambdaInvoker().client.meta.region_name == "us-east-1"
