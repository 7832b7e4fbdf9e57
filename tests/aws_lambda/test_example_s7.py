"""Faults found in examples/lambda and fixed: each test failed before its fix.

1. sqs_events: a hanging SQS held the batch past the timeout (the dead-letter client had
   botocore's 60 s defaults, and no deadline was checked), so the applied records came back.
2. handler: JSON sent as a form (``curl -d`` with no content-type) was applied as ``HTTP.POST``.
3. handler: a deployment whose chart does not compile answered 400 naming a server path.
4. app: ``refuse_own_event`` called the ``Host.charts`` property, crashing for a plain Host.
5. handler: a repeated ``Idempotency-Key`` header (joined with a comma) was a new key.
6. handler: ``GET`` listed outbox rows as nameless timers.
7. redrive.py: ``--retry A:3`` could not name an instance whose id has a ``:``.
8. redrive.py: it revived rows statebound refuses to revive.
9. README: the wake function's log group was missing from "Observe".
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import socket
import threading
from typing import Any
from urllib.parse import quote_plus

import pytest
from botocore.exceptions import ReadTimeoutError
from samtranslator.yaml_helper import yaml_parse

import statebound as sb
from statebound.dynamodb import DynamoStore

from .harness import LAMBDA_DIR, TABLE, ClockContext, LambdaContext, count_requests, deployment, http_event, log_lines

FORM = "application/x-www-form-urlencoded"
README = (LAMBDA_DIR / "README.md").read_text()


def _record(message_id: str, body: Any) -> dict[str, Any]:
    """One SQS record as Lambda hands it to the function."""
    return {"messageId": message_id, "receiptHandle": f"r-{message_id}", "eventSource": "aws:sqs",
            "messageAttributes": {}, "body": body if isinstance(body, str) else json.dumps(body)}


def _start(lam, *ids: str) -> None:
    for iid in ids:
        assert lam.call("POST", "/instances/x", {"chart": "order"}, instance_id=iid)[0] == 201


def _configuration(lam, iid: str) -> list[str]:
    return lam.call("GET", "/instances/x", instance_id=iid)[1]["configuration"]


# ------------------------------------------------------------------ 1. the SQS events batch


class _HangingDeadLetters:
    """The dead-letter queue's SQS: every send takes ``call_ms`` of the clock, then times out."""

    def __init__(self, clock, call_ms: int) -> None:
        self.clock, self.call_ms, self.calls = clock, call_ms, 0

    def send_message(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        self.clock.advance(self.call_ms)
        raise ReadTimeoutError(endpoint_url="https://sqs.eu-west-1.amazonaws.com/")


def test_the_events_batch_stops_at_its_margin_and_reports_only_what_it_did_not_apply(lam):
    """Bad records whose dead-letter sends hang 4 s each, in a 20 s invocation: the function
    stops with 5 s or less left instead of running past its timeout (where Lambda kills it and
    SQS delivers the applied records again). The records it applied are not reported, so SQS
    deletes them; the ones it did not reach are reported and untouched."""
    _start(lam, "g0", "g1", "g2", "g3")
    dead_letters = _HangingDeadLetters(lam.clock, 4_000)
    lam.sqs_events._sqs = dead_letters
    order = ["g0", "b1", "b2", "g1", "b3", "b4", "b5", "g2", "b6", "g3"]
    batch = [_record(m, {"instance_id": m, "event": "StartPayment"}) if m.startswith("g") else _record(m, "not json")
             for m in order]
    ctx = ClockContext(lam.clock, 20_000, "sqs-events-1")
    result = lam.sqs_events.handle({"Records": batch}, ctx)
    assert ctx.get_remaining_time_in_millis() > 0                # returned before its timeout
    failed = [f["itemIdentifier"] for f in result["batchItemFailures"]]
    # b1..b4: their dead-letter send failed, so SQS retries them; from b5 on: not reached
    assert failed == ["b1", "b2", "b3", "b4", "b5", "g2", "b6", "g3"]
    assert dead_letters.calls == 4
    assert [_configuration(lam, g) for g in ("g0", "g1", "g2", "g3")] == [["Started"], ["Started"],
                                                                          ["Pending"], ["Pending"]]


def test_a_hanging_dead_letter_queue_costs_a_bad_record_one_short_attempt(lam, monkeypatch):
    """SQS accepts the connection and never answers (a real local socket). The dead-letter
    client used botocore's defaults (60 s to read, three attempts), and the batch stalled
    behind its first bad record; now that record gets one short attempt, is reported (so it
    is retried, never lost), and the rest of the batch is applied."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    ids = [f"o{i}" for i in range(9)]
    _start(lam, *ids)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", f"http://127.0.0.1:{srv.getsockname()[1]}")
    lam.sqs_events._sqs = None                   # a cold start: the client is built on first use
    batch = [_record("bad", "not json"), *(_record(i, {"instance_id": i, "event": "StartPayment"}) for i in ids)]
    done: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: done.setdefault(
        "result", lam.sqs_events.handle({"Records": batch}, LambdaContext(30_000))), daemon=True)
    worker.start()
    worker.join(timeout=30)                      # a hang guard: one attempt takes about 2 s
    srv.close()
    for conn in held:
        conn.close()
    worker.join(timeout=10)
    assert "result" in done, "the batch was still waiting on the dead-letter queue"
    assert done["result"] == {"batchItemFailures": [{"itemIdentifier": "bad"}]}
    monkeypatch.delenv("AWS_ENDPOINT_URL_SQS")
    assert all(_configuration(lam, i) == ["Started"] for i in ids)


def test_the_readme_says_a_keyless_event_may_apply_twice_after_a_redrive():
    events_over_sqs = README.split("## Events over SQS", 1)[1].split("\n## ", 1)[0]
    assert "without a producer's `idempotency_key` may be applied twice after a redrive" in events_over_sqs


# ------------------------------------------------------------------ 2. JSON sent as a form


def test_json_sent_as_a_form_is_a_415_and_leaves_the_key_unused(lam):
    """``curl -d '{...}'`` without a content-type: the JSON was read as a form, applied as
    the event HTTP.POST (a 200 that changed nothing), and the client's retry with the right
    content-type and the same Idempotency-Key was then refused with 422."""
    _start(lam, "order-1")
    headers = {"authorization": "Bearer eyJ...", "idempotency-key": "pay-order-1-a7f3"}
    body = '{"event": "StartPayment", "data": {"card": "4242"}}'
    with count_requests(lam.client) as calls:
        resp = lam.handler.handle(http_event("POST", "/instances/order-1/events", raw_body=body, content_type=FORM,
                                             headers=headers), LambdaContext())
    assert resp["statusCode"] == 415 and calls == []
    assert "application/json" in json.loads(resp["body"])["error"]
    status, answer = lam.call("POST", "/instances/order-1/events", raw_body=body, headers=headers)
    assert status == 200 and answer["configuration"] == ["Started"]


@pytest.mark.parametrize("raw", ["_scxmleventname=StartPayment&card=4242", "card=4242",
                                 quote_plus('{"event": "StartPayment"}'), "this+is+some+content", ""])
def test_a_form_post_is_still_an_event(lam, raw):
    """Basic HTTP senders percent-encode what they post, a ``<content>`` body included
    (W3C test 520): none of these is refused. Without ``_scxmleventname`` the event is
    HTTP.POST, which the order chart ignores."""
    _start(lam, "f")
    status, body = lam.call("POST", "/instances/f/events", raw_body=raw, content_type=FORM)
    assert status == 200
    assert body["configuration"] == (["Started"] if "_scxmleventname" in raw else ["Pending"])


def test_the_readme_s_jwt_example_keeps_the_json_content_type():
    use = README.split("## Use", 1)[1].split("\n## ", 1)[0]
    jwt = use.split("With `AuthMode=JWT`", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    assert "Authorization: Bearer $TOKEN" in jwt and "content-type: application/json" in jwt


# ------------------------------------------------------------------ 3. a chart that does not compile


def test_a_deployment_whose_chart_does_not_compile_is_a_500_with_the_problems_in_the_log(lam, monkeypatch,
                                                                                          tmp_path, capsys):
    charts = tmp_path / "charts"
    (charts / "order").mkdir(parents=True)
    (charts / "order" / "v1.scxml").write_text(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" initial="Nope"><state id="A"/></scxml>')
    monkeypatch.setenv("CHARTS_DIR", str(charts))
    lam.app.configure(None)                       # a cold start of the broken deployment
    capsys.readouterr()
    for method, path, body in (("GET", "/instances/o1", None), ("POST", "/instances/o1", {"chart": "order"})):
        resp = lam.handler.handle(http_event(method, path, body), LambdaContext())
        assert resp["statusCode"] == 500
        assert json.loads(resp["body"]) == {"error": "internal error", "request_id": "req-1"}
    errors = [d for d in log_lines(capsys.readouterr().out) if d.get("level") == "ERROR"]
    assert len(errors) == 2
    for line in errors:
        assert line["status"] == 500 and line["problems"] and any("Nope" in p for p in line["problems"])
        assert str(charts) in line["exception"]   # the path is the log's to show, not the client's


# ------------------------------------------------------------------ 4. own events of a plain Host


@pytest.mark.parametrize("event", ["PaymentTimeout", "GraceExpired.early", "error.execution"])
def test_a_host_installed_with_configure_refuses_own_events_too(lam, event):
    """A Host not made by app.build_host has no ``own_events``; the fallback called the
    ``Host.charts`` property as a method, and every event was a 500."""
    plain = sb.Host(lam.app.load_charts(), store=DynamoStore(TABLE, client=lam.client), clock=lam.clock)
    lam.app.configure(plain)
    _start(lam, "o1")
    assert lam.call("POST", "/instances/o1/events", {"event": "StartPayment"})[0] == 200
    status, body = lam.call("POST", "/instances/o1/events", {"event": event})
    assert status == 403 and event in body["error"]
    assert _configuration(lam, "o1") == ["Started"]


# ------------------------------------------------------------------ 5. a repeated Idempotency-Key header


@pytest.mark.parametrize("joined", ["k-9,k-9", '"k-9","k-9"', "k-9, k-9", "a,b"])
def test_a_repeated_idempotency_key_header_is_a_400_before_any_request(lam, joined):
    """API Gateway joins a header sent twice with a comma: the joined value was a new key,
    and the retry it carried was applied again."""
    _start(lam, "o1")
    lam.call("POST", "/instances/o1/events", {"event": "StartPayment"})
    first = lam.call("POST", "/instances/o1/events", {"event": "Complete"}, headers={"idempotency-key": "k-9"})
    assert first[0] == 200 and first[1]["status"] == "done"
    with count_requests(lam.client) as calls:
        status, body = lam.call("POST", "/instances/o1/events", {"event": "Complete"},
                                headers={"idempotency-key": joined}, request_id="req-3")
    assert status == 400 and "send the header once" in body["error"] and calls == []


# ------------------------------------------------------------------ 6. GET lists timers only


def _dead_confirmation(lam, iid: str, **kw: Any) -> None:
    """Complete an order whose confirmation SQS refuses: its outbox row is parked dead."""
    lam.call("POST", "/instances/x", {"chart": "order", "data": {"amount": 5}}, instance_id=iid, **kw)
    lam.call("POST", "/instances/x/events", {"event": "StartPayment"}, instance_id=iid)
    assert lam.call("POST", "/instances/x/events", {"event": "Complete"}, instance_id=iid)[0] == 200
    assert [(r.kind, r.state) for r in lam.host.pending_timers(iid)] == [("send", "dead")]


def test_get_lists_timers_and_not_a_dead_outbox_row(lam):
    lam.call("POST", "/instances/o1", {"chart": "order"})
    lam.call("POST", "/instances/o1/events", {"event": "StartPayment"})
    [timer] = lam.call("GET", "/instances/o1")[1]["timers"]
    assert (timer["name"], timer["event"], timer["state"]) == ("PaymentTimeout", "PaymentTimeout", "pending")
    lam.sqs.delete_queue(QueueUrl=lam.confirmations)
    _dead_confirmation(lam, "o2")
    status, body = lam.call("GET", "/instances/o2")
    assert status == 200 and body["timers"] == []


# ------------------------------------------------------------------ 7, 8. redrive.py


def _redrive(lam, capsys, *argv: str) -> list[dict[str, Any]]:
    redrive = importlib.import_module("redrive")
    capsys.readouterr()
    assert redrive.main(["--table", TABLE, "--json", *argv], client=lam.client, clock=lam.clock) == 0
    return json.loads(capsys.readouterr().out)


def _dead(lam) -> list[tuple[str, int]]:
    return sorted(r.key for r in DynamoStore(TABLE, client=lam.client).dead_timers(100))


def test_redrive_names_an_instance_whose_id_has_a_colon(lam, capsys):
    """``--retry tenant:3`` revived row 3 of ``tenant`` when the instance ``tenant:3`` was meant."""
    lam.sqs.delete_queue(QueueUrl=lam.confirmations)
    _dead_confirmation(lam, "tenant:3")
    _dead_confirmation(lam, "order-7")
    assert _dead(lam) == [("order-7", 3), ("tenant:3", 3)]
    [_, tenant] = _redrive(lam, capsys, "--retry", "tenant:3")      # only one reading has dead rows
    assert (tenant["instance"], tenant["revived"]) == ("tenant:3", True)
    assert [r["instance"] for r in _redrive(lam, capsys, "--retry", "order-7:3") if r["revived"]] == ["order-7"]
    assert _dead(lam) == []


def test_redrive_refuses_an_ambiguous_selector_and_takes_instance_and_ordinal(lam, capsys):
    lam.sqs.delete_queue(QueueUrl=lam.confirmations)
    _dead_confirmation(lam, "tenant")
    _dead_confirmation(lam, "tenant:3")
    redrive = importlib.import_module("redrive")
    with pytest.raises(SystemExit) as exc:
        redrive.main(["--table", TABLE, "--retry", "tenant:3"], client=lam.client, clock=lam.clock)
    assert exc.value.code == 2 and "--instance" in capsys.readouterr().err
    assert _dead(lam) == [("tenant", 3), ("tenant:3", 3)]          # nothing revived
    _redrive(lam, capsys, "--instance", "tenant:3")
    assert _dead(lam) == [("tenant", 3)]
    _redrive(lam, capsys, "--instance", "tenant", "--ordinal", "3")
    assert _dead(lam) == []


class _Payment:
    """An invoke handler for a gateway that is down."""

    def start(self, request: Any) -> Any:
        raise RuntimeError("gateway down")


_INVOKING = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="inv">
  <state id="Paying"><invoke type="payment" id="pay"/>
    <transition event="done.invoke.pay" target="Paid"/>
    <transition event="error.execution" target="Failed"/></state>
  <state id="Paid"/><state id="Failed"/>
</scxml>"""


def test_redrive_leaves_an_ended_invocation_dead_with_the_reason(lam, capsys):
    """The chart was told error.execution and moved on: a revived invoke row would start the
    payment handler again and throw its answer away. ``statebound redrive`` refuses it."""
    chart = sb.Chart.from_scxml(_INVOKING, name="inv")
    host = sb.Host([chart], DynamoStore(TABLE, client=lam.client), lam.clock, invokers={"payment": _Payment()})
    host.start(chart, "o1")
    for _ in range(40):
        lam.clock.advance(1_000)
        host.fire_due()
    assert host.get("o1").configuration == {"Failed"} and _dead(lam) == [("o1", 1)]
    [row] = _redrive(lam, capsys, "--retry", "all")
    assert (row["kind"], row["revived"]) == ("invoke", False)
    assert "dead invoke row" in row["left_dead"]
    assert _dead(lam) == [("o1", 1)]


def test_redrive_leaves_a_suspended_instance_s_row_dead(lam, capsys, tmp_path):
    lam.rebuild(deployment(tmp_path / "v1", "v1"))
    lam.call("POST", "/instances/old", {"chart": "order", "data": {"payment_timeout": "30s"}})
    lam.call("POST", "/instances/old/events", {"event": "StartPayment"})
    v2_only = deployment(tmp_path / "v2", "v2")
    lam.rebuild(v2_only).max_attempts = 1             # v1 dropped while "old" runs it: the timer dies
    lam.clock.advance(30_000)
    lam.sweep(8_000, 2_000)
    assert _dead(lam) == [("old", 1)]
    shutil.copy2(LAMBDA_DIR / "charts" / "order" / "v1.scxml", v2_only / "order")
    lam.rebuild(v2_only).suspend("old")
    [row] = _redrive(lam, capsys, "--retry", "old")
    assert row["revived"] is False and "suspended" in row["left_dead"]
    assert _dead(lam) == [("old", 1)]
    text_redrive = importlib.import_module("redrive")
    assert text_redrive.main(["--table", TABLE, "--retry", "all"], client=lam.client, clock=lam.clock) == 0
    out = capsys.readouterr().out
    assert "left dead: instance 'old' is suspended" in out and "1 dead, 0 revived, 1 left dead" in out


# ------------------------------------------------------------------ 9. the README's log groups


def test_the_readme_names_every_function_s_log_group():
    template = yaml_parse((LAMBDA_DIR / "template.yaml").read_text())
    groups = [props["LogGroupName"]["Fn::Sub"] for res in template["Resources"].values()
              if res["Type"] == "AWS::Logs::LogGroup"
              for props in [res["Properties"]] if "/aws/lambda/" in str(props["LogGroupName"])]
    observe = README.split("## Observe", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(/aws/lambda/<stack>-[a-z-]+)`", observe))
    assert {g.replace("${AWS::StackName}", "<stack>") for g in groups} == named
    assert "/aws/lambda/<stack>-wake" in named


def test_a_host_installed_with_configure_refuses_an_older_revisions_own_timeout(lam):
    # only the latest revision of each chart was looked at: an instance still on an older
    # revision could be sent that revision's timeout event by any client
    ns = 'xmlns="http://www.w3.org/2005/07/scxml" xmlns:sb="urn:statebound" version="1.0" datamodel="python"'
    older = sb.Chart.from_scxml(f'<scxml {ns} name="order" initial="a"><state id="a">'
                                '<sb:timeout event="ReminderDue" after="1h"/></state></scxml>')
    newer = sb.Chart.from_scxml(f'<scxml {ns} name="order" initial="a"><state id="a"/></scxml>')
    host = sb.Host([older, newer], store=DynamoStore(TABLE, client=lam.client), clock=lam.clock)
    with pytest.raises(lam.app.OwnEvent):
        lam.app.refuse_own_event(host, "ReminderDue")
    lam.app.refuse_own_event(host, "SomethingElse")
