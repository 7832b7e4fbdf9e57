"""What an operator sees: the sweeper's CloudWatch Embedded Metric Format documents, and the
structured log lines of both functions (Powertools), read back from stdout as CloudWatch
Logs would receive them. The metric names are checked against the template's alarms."""

from __future__ import annotations

from pathlib import Path

import pytest
from samtranslator.yaml_helper import yaml_parse

from .harness import LAMBDA_DIR, TABLE, LambdaContext, deployment, http_event, log_lines

EMF_COUNTS = {"Fired", "Discarded", "Stale", "Failed", "Dead", "Conflicts"}


def emf_documents(out: str) -> list[dict]:
    return [d for d in log_lines(out) if "_aws" in d]


def totals(docs: list[dict], name: str) -> float:
    """A metric summed over documents (a value may be one number or a list of them)."""
    total = 0.0
    for d in docs:
        v = d.get(name, 0)
        total += sum(v) if isinstance(v, list) else v
    return total


def samples(docs: list[dict], name: str) -> list[float]:
    out: list[float] = []
    for d in docs:
        v = d.get(name)
        if v is not None:
            out += v if isinstance(v, list) else [v]
    return out


def assert_emf_envelope(doc: dict) -> None:
    """The shape CloudWatch requires of an EMF document."""
    aws = doc["_aws"]
    assert isinstance(aws["Timestamp"], int) and aws["Timestamp"] > 1_600_000_000_000
    (directive,) = aws["CloudWatchMetrics"]
    assert directive["Namespace"] == "statebound"
    assert directive["Dimensions"] == [["service"]] and doc["service"] == "statebound-sweeper"
    for metric in directive["Metrics"]:
        assert metric["Name"] in doc, metric       # every declared metric has its value at the top level
        assert metric["Unit"] in ("Count", "Milliseconds")


def start_with_timer(lam, iid: str, timeout: str = "30s", correlation: str | None = None) -> None:
    headers = {"x-correlation-id": correlation} if correlation else None
    assert lam.call("POST", f"/instances/{iid}", {"chart": "order", "data": {"payment_timeout": timeout}},
                    headers=headers)[0] == 201
    assert lam.call("POST", f"/instances/{iid}/events", {"event": "StartPayment"}, headers=headers)[0] == 200


def test_sweeper_emits_emf_with_counts_and_lag_samples(lam, capsys):
    for iid in ("a", "b", "gone"):
        start_with_timer(lam, iid)
    lam.client.delete_item(TableName=TABLE, Key={"pk": {"S": "gone"}, "sk": {"S": "P"}})  # its timer is discarded
    lam.clock.advance(30_000 + 1_500)   # fired 1.5 s late
    capsys.readouterr()

    report = lam.sweep(8_000, 2_000)
    docs = emf_documents(capsys.readouterr().out)

    assert report["fired"] == 2 and report["discarded"] == 1
    assert docs, "no EMF document on stdout"
    for doc in docs:
        assert_emf_envelope(doc)
    declared = {m["Name"]: m["Unit"] for d in docs for m in d["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert EMF_COUNTS | {"TimerLag", "Sweeps"} <= set(declared)
    assert declared["TimerLag"] == "Milliseconds" and declared["Fired"] == "Count"
    assert totals(docs, "Fired") == 2 and totals(docs, "Discarded") == 1
    assert totals(docs, "Failed") == totals(docs, "Dead") == totals(docs, "Stale") == totals(docs, "Conflicts") == 0
    assert samples(docs, "TimerLag") == [1500.0, 1500.0]
    lagged = [d for d in docs if "TimerLag" in d]
    assert lagged[0]["lag_p50_ms"] == 1500 and lagged[0]["lag_p99_ms"] == 1500
    assert totals(docs, "Sweeps") >= 1


def test_a_quiet_sweep_still_reports_that_it_ran(lam, capsys):
    capsys.readouterr()
    lam.sweep(8_000, 2_000)
    (doc,) = emf_documents(capsys.readouterr().out)
    assert_emf_envelope(doc)
    assert totals([doc], "Sweeps") >= 1 and all(totals([doc], name) == 0 for name in EMF_COUNTS)


def test_failed_and_dead_are_counted(lam, capsys, tmp_path):
    """A deployment that dropped the revision a live timer needs: the fire fails, then parks."""
    lam.rebuild(deployment(tmp_path / "v1", "v1"))
    start_with_timer(lam, "old")
    lam.rebuild(deployment(tmp_path / "v2", "v2", "v3")).max_attempts = 2
    lam.clock.advance(30_000)
    capsys.readouterr()

    first = lam.sweep(8_000, 2_000)
    lam.clock.advance(10_000)   # past the backoff
    second = lam.sweep(8_000, 2_000)
    out = capsys.readouterr().out
    docs = emf_documents(out)

    assert first["failed"] == 1 and second["failed"] == 1 and second["dead"] == 1
    assert totals(docs, "Failed") == 2 and totals(docs, "Dead") == 1 and totals(docs, "Fired") == 0
    failures = [d for d in log_lines(out) if d.get("message") == "timer delivery failed"]
    assert len(failures) == 2 and failures[0]["level"] == "WARNING" and failures[0]["instance_id"] == "old"
    assert "chart 'order' version 'v1'" in failures[0]["reason"]
    assert [r.state for r in lam.host.pending_timers("old")] == ["dead"]


def test_conflicts_are_counted(lam, capsys):
    start_with_timer(lam, "c")
    lam.clock.advance(30_000)
    moved: list[bool] = []

    def concurrent_writer(**kwargs):
        """Moves the position's version just before the fire commits, once."""
        if not moved:
            moved.append(True)
            lam.client.update_item(TableName=TABLE, Key={"pk": {"S": "c"}, "sk": {"S": "P"}},
                                   UpdateExpression="SET #v = #v + :one", ExpressionAttributeNames={"#v": "version"},
                                   ExpressionAttributeValues={":one": {"N": "1"}})

    lam.client.meta.events.register("before-call.dynamodb.TransactWriteItems", concurrent_writer)
    capsys.readouterr()
    try:
        report = lam.sweep(8_000, 2_000)
    finally:
        lam.client.meta.events.unregister("before-call.dynamodb.TransactWriteItems", concurrent_writer)
    docs = emf_documents(capsys.readouterr().out)
    assert moved and report["fired"] == 1 and report["conflicts"] == 1
    assert totals(docs, "Conflicts") == 1 and totals(docs, "Fired") == 1


def test_the_alarms_watch_metrics_the_sweeper_emits(lam, capsys):
    template = yaml_parse((LAMBDA_DIR / "template.yaml").read_text())
    start_with_timer(lam, "x")
    lam.clock.advance(30_000)
    capsys.readouterr()
    lam.sweep(8_000, 2_000)
    docs = emf_documents(capsys.readouterr().out)
    emitted = {(d["_aws"]["CloudWatchMetrics"][0]["Namespace"], m["Name"], d["service"])
               for d in docs for m in d["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    for name in ("DeadTimersAlarm", "TimerLagAlarm"):
        alarm = template["Resources"][name]["Properties"]
        (dimension,) = alarm["Dimensions"]
        assert dimension["Name"] == "service"
        assert (alarm["Namespace"], alarm["MetricName"], dimension["Value"]) in emitted, name


def test_logs_carry_instance_chart_event_request_and_correlation_ids(lam, capsys):
    capsys.readouterr()
    start_with_timer(lam, "order-7", correlation="corr-42")
    http = log_lines(capsys.readouterr().out)
    processed = next(d for d in http if d.get("message") == "event processed")
    assert processed["instance_id"] == "order-7" and processed["chart"] == "order" and processed["revision"] == "v3"
    assert processed["event"] == "StartPayment" and processed["correlation_id"] == "corr-42"
    assert processed["function_request_id"] == "lambda-req-1" and processed["level"] == "INFO"
    assert processed["api_request_id"] == "req-1"   # API Gateway's, beside the caller's correlation id

    lam.clock.advance(30_000)
    lam.sweep(8_000, 2_000)
    swept = log_lines(capsys.readouterr().out)
    fired = next(d for d in swept if d.get("message") == "timer fired")
    # the timer carries the correlation id of the request that armed it
    assert fired["correlation_id"] == "corr-42" and fired["instance_id"] == "order-7"
    assert fired["event"] == "PaymentTimeout" and fired["chart"] == "order" and fired["revision"] == "v3"
    assert fired["function_request_id"] == "sweeper-req-1" and fired["lag_ms"] == 0
    chart_log = next(d for d in swept if d.get("message") == "chart log")
    assert chart_log["log_label"] == "order" and chart_log["log_value"] == "payment overdue; grace period started"
    assert chart_log["level"] == "INFO" and chart_log["correlation_id"] == "corr-42"
    assert chart_log["instance_id"] == "order-7"


def test_without_a_caller_id_the_api_request_id_correlates(lam, capsys):
    capsys.readouterr()
    resp = lam.handler.handle(http_event("POST", "/instances/r1", {"chart": "order"}, request_id="apigw-77"),
                              LambdaContext())
    assert resp["headers"]["x-correlation-id"] == "apigw-77"
    started = next(d for d in log_lines(capsys.readouterr().out) if d.get("message") == "instance started")
    assert started["correlation_id"] == "apigw-77"


def test_chart_log_follows_the_function_log_level_and_errors_show_above_it(lam, capsys):
    logger = lam.telemetry.logger
    level = logger.log_level
    capsys.readouterr()
    try:
        logger.setLevel("WARNING")
        start_with_timer(lam, "quiet", timeout="soon")   # an invalid delay: error.execution
        lam.call("POST", "/instances/q2", {"chart": "order"})
        out = log_lines(capsys.readouterr().out)
    finally:
        logger.setLevel(level)
    assert not [d for d in out if d.get("level") == "INFO"]
    (raised,) = [d for d in out if d.get("message") == "chart raised error.execution"]
    assert raised["level"] == "WARNING" and raised["instance_id"] == "quiet"
    assert "'soon'" in raised["log_value"] and raised["event"] == "StartPayment"
    assert lam.call("GET", "/instances/quiet")[1]["timers"] == []


@pytest.mark.parametrize("header,expected", [("abc-123", "abc-123"), ("bad value\nforged", "req-1"),
                                             ("x" * 129, "req-1")])
def test_only_a_sane_correlation_header_is_trusted(lam, header, expected):
    resp = lam.handler.handle(http_event("POST", "/instances/h", {"chart": "order"},
                                         headers={"x-correlation-id": header}), LambdaContext())
    assert resp["headers"]["x-correlation-id"] == expected


def test_log_lines_are_strict_json(lam, capsys):
    """A NaN in a logged value would make the line unreadable to Logs Insights."""
    capsys.readouterr()
    lam.telemetry.logger.info("value", extra={"v": float("nan")})
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert "NaN" not in line and log_lines(line)[0]["v"] is None


def test_charts_dir_layout_is_what_the_docs_say():
    assert sorted(p.relative_to(LAMBDA_DIR).as_posix() for p in (LAMBDA_DIR / "charts").rglob("*.scxml")) == [
        "charts/order/v1.scxml", "charts/order/v2.scxml", "charts/order/v3.scxml"]
    assert Path(LAMBDA_DIR / "charts" / "order").is_dir()


def test_a_row_parked_dead_inside_a_fire_is_counted_once(lam, capsys, tmp_path):
    """The grace timer's fire commits a send (a revision that tells the queue the order was
    cancelled); the send is handed over inside that fire and SQS refuses it for good. One
    row is dead, but Dead was measured around each fire, the inner one's inside the outer's:
    EMF and the sweep's return said 2."""
    charts = deployment(tmp_path / "v4", "v3")
    v3 = (charts / "order" / "v3.scxml").read_text()
    v4 = v3.replace('<log label="order" expr="\'grace period over\'"/>',
                    '<log label="order" expr="\'grace period over\'"/>\n'
                    '      <send type="sqs" id="cancelled" event="order.cancelled">'
                    '<param name="order_id" expr="_sessionid"/></send>')
    assert v4 != v3
    (charts / "order" / "v4.scxml").write_text(v4)
    lam.rebuild(charts)
    lam.call("POST", "/instances/o1", {"chart": "order", "data": {"payment_timeout": "1s", "grace_period": "1s"}})
    lam.call("POST", "/instances/o1/events", {"event": "StartPayment"})
    lam.clock.advance(1_000)
    lam.sweep(8_000, 2_000)                                  # PaymentTimeout
    lam.sqs.delete_queue(QueueUrl=lam.confirmations)         # the send now fails for good
    capsys.readouterr()
    lam.clock.advance(1_000)
    report = lam.sweep(8_000, 2_000)                         # GraceExpired, and its send, dead
    docs = emf_documents(capsys.readouterr().out)
    assert [(r.instance_id, r.kind) for r in lam.host.dead_timers()] == [("o1", "send")]
    assert report["dead"] == 1 and totals(docs, "Dead") == 1
