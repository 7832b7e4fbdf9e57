"""examples/lambda/template.yaml deploys: the SAM transform, then cfn-lint, with nothing reported.

The transform is aws-sam-translator's, the one ``sam deploy`` and CloudFormation run. The
local ``CodeUri`` is swapped for an S3 URI first, as ``sam package`` does. cfn-lint then
checks the transformed template with informational rules included, so errors, warnings
and notes all count; none are waived. The other tests pin the production settings the
issue asks for, so a later edit cannot drop one silently.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

samtranslator = pytest.importorskip("samtranslator")
cfnlint_api = pytest.importorskip("cfnlint.api")

from samtranslator.translator.transform import transform  # noqa: E402
from samtranslator.yaml_helper import yaml_parse  # noqa: E402

TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "lambda" / "template.yaml"
REGIONS = ["us-east-1", "eu-west-1"]


class _NoManagedPolicies:
    """The transform asks IAM for managed policy names only when a template uses one by name."""

    def load(self) -> dict[str, str]:
        return {}


def sam_transform(template: dict[str, Any]) -> dict[str, Any]:
    """What CloudFormation's ``AWS::Serverless-2016-10-31`` transform makes of ``template``."""
    template = copy.deepcopy(template)
    template["Globals"]["Function"]["CodeUri"] = "s3://statebound-artifacts/example.zip"
    return transform(template, {}, _NoManagedPolicies())


def lint(template: dict[str, Any]) -> list[str]:
    """cfn-lint's findings (errors, warnings and informational) as ``"RULE message"`` lines."""
    config = cfnlint_api.ManualArgs(regions=REGIONS, include_checks=["I"])
    matches = cfnlint_api.lint(json.dumps(template), config=config)
    return [f"{m.rule.id} {m.message}" for m in matches]


@pytest.fixture(scope="module")
def region_env():
    # the transform resolves AWS::Region from the environment; it never calls AWS
    mp = pytest.MonkeyPatch()
    mp.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    yield
    mp.undo()


@pytest.fixture(scope="module")
def source() -> dict[str, Any]:
    return yaml_parse(TEMPLATE.read_text())


@pytest.fixture(scope="module")
def transformed(region_env, source) -> dict[str, Any]:
    return sam_transform(source)


def resources(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def test_transformed_template_passes_cfn_lint_with_nothing_reported(transformed):
    assert lint(transformed) == []


def test_the_lint_step_catches_a_dependency_cycle(region_env, source):
    """The check above can fail: the issue's E3004 (a cycle through the API) is reported."""
    broken = copy.deepcopy(source)
    broken["Resources"]["Api"]["Properties"]["Description"] = {"Fn::GetAtt": ["EventsFunction", "Arn"]}
    assert any(line.startswith("E3004") for line in lint(sam_transform(broken)))


def test_table_is_retained_and_protected(transformed):
    table = transformed["Resources"]["Table"]
    assert table["DeletionPolicy"] == "Retain" and table["UpdateReplacePolicy"] == "Retain"
    props = table["Properties"]
    assert props["DeletionProtectionEnabled"] is True
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}


def test_every_route_is_authorized_and_the_stage_throttles(transformed):
    routes = resources(transformed, "AWS::ApiGatewayV2::Route")
    assert {r["Properties"]["RouteKey"] for r in routes.values()} == {
        "POST /instances/{id}", "POST /instances/{id}/events", "GET /instances/{id}"}
    for route in routes.values():
        auth = route["Properties"]["AuthorizationType"]
        assert auth == {"Fn::If": ["UseJwt", "JWT", "AWS_IAM"]}, auth
    authorizer = transformed["Resources"]["JwtAuthorizer"]
    assert authorizer["Condition"] == "UseJwt" and authorizer["Properties"]["AuthorizerType"] == "JWT"
    assert transformed["Parameters"]["AuthMode"]["AllowedValues"] == ["IAM", "JWT"]
    stage = transformed["Resources"]["ApiStage"]["Properties"]
    assert stage["DefaultRouteSettings"] == {"ThrottlingRateLimit": {"Ref": "ThrottleRate"},
                                             "ThrottlingBurstLimit": {"Ref": "ThrottleBurst"}}


def test_functions_run_a_current_python_and_log_to_groups_with_retention(transformed):
    functions = resources(transformed, "AWS::Lambda::Function")
    assert set(functions) == {"EventsFunction", "SweeperFunction", "SqsEventsFunction", "WakeFunction"}
    groups = resources(transformed, "AWS::Logs::LogGroup")
    for fn in functions.values():
        props = fn["Properties"]
        major, minor = props["Runtime"].removeprefix("python").split(".")
        assert (int(major), int(minor)) >= (3, 12)
        logging = props["LoggingConfig"]
        assert logging["LogFormat"] == "JSON" and logging["ApplicationLogLevel"] == {"Ref": "LogLevel"}
        group = groups[logging["LogGroup"]["Ref"]]
        assert group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    access = transformed["Resources"]["ApiStage"]["Properties"]["AccessLogSettings"]["DestinationArn"]
    assert groups[access["Fn::GetAtt"][0]]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_sweeper_failures_go_to_a_destination_and_raise_an_alarm(transformed):
    configs = resources(transformed, "AWS::Lambda::EventInvokeConfig")
    (config,) = configs.values()
    props = config["Properties"]
    assert props["FunctionName"] == {"Ref": "SweeperFunction"}
    assert props["MaximumRetryAttempts"] == 0 and props["MaximumEventAgeInSeconds"] == 60
    assert props["DestinationConfig"]["OnFailure"]["Destination"] == {"Fn::GetAtt": ["SweeperFailures", "Arn"]}
    alarm = transformed["Resources"]["SweeperFailuresAlarm"]["Properties"]
    assert alarm["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": ["SweeperFailures", "QueueName"]}}]


def test_alarms_watch_dead_timers_and_the_lag_p99(transformed):
    dead = transformed["Resources"]["DeadTimersAlarm"]["Properties"]
    assert (dead["MetricName"], dead["Statistic"], dead["Threshold"], dead["ComparisonOperator"]) == (
        "Dead", "Sum", 0, "GreaterThanThreshold")
    lag = transformed["Resources"]["TimerLagAlarm"]["Properties"]
    assert (lag["MetricName"], lag["ExtendedStatistic"], lag["Threshold"]) == ("TimerLag", "p99", {"Ref": "LagAlarmMs"})


def test_every_function_reads_the_api_endpoint_without_a_cycle(transformed):
    # a timer fired by the sweeper or a wake-up sends Basic HTTP as the HTTP function would:
    # only EventsFunction had HTTP_BASE, and a chart's send to a peer failed when a timer fired
    functions = {name: r for name, r in transformed["Resources"].items() if r["Type"] == "AWS::Lambda::Function"}
    assert {"EventsFunction", "SweeperFunction"} <= set(functions)
    for name, resource in functions.items():
        env = resource["Properties"]["Environment"]["Variables"]
        assert env["HTTP_BASE"] == {"Fn::GetAtt": ["Api", "ApiEndpoint"]}, name
        assert env["DONE_TTL_S"] == {"Ref": "DoneTtlSeconds"}, name
        # the API reaches the functions only through the integration, never in its own properties
        assert name not in json.dumps(transformed["Resources"]["Api"])


def test_the_confirmations_queue_is_named_by_cloudformation(transformed):
    # "<stack>-confirmations.fifo" broke stack names over 61 characters (SQS takes 80)
    props = transformed["Resources"]["ConfirmationsQueue"]["Properties"]
    assert "QueueName" not in props and props["FifoQueue"] is True


def _statements(template: dict[str, Any], function: str) -> list[dict[str, Any]]:
    role = template["Resources"][f"{function}Role"]["Properties"]
    return [st for policy in role["Policies"] for st in policy["PolicyDocument"]["Statement"]]


def _actions(statement: dict[str, Any]) -> set[str]:
    actions = statement["Action"]
    return {actions} if isinstance(actions, str) else set(actions)


def test_the_events_queue_feeds_its_function_with_partial_batch_failures(transformed):
    mapping = transformed["Resources"]["SqsEventsMapping"]["Properties"]
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": ["EventsQueue", "Arn"]}
    assert mapping["FunctionName"] == {"Ref": "SqsEventsFunction"}
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"] and mapping["BatchSize"] == 10
    queue = transformed["Resources"]["EventsQueue"]["Properties"]
    timeout = transformed["Resources"]["SqsEventsFunction"]["Properties"]["Timeout"]
    assert queue["VisibilityTimeout"] >= 6 * timeout          # AWS's advice for an event source mapping
    assert queue["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": ["EventsDeadLetters", "Arn"]},
                                      "maxReceiveCount": 5}
    dead = transformed["Resources"]["EventsDeadLetters"]
    assert dead["DeletionPolicy"] == "Retain" and dead["Properties"]["MessageRetentionPeriod"] == 1209600
    env = transformed["Resources"]["SqsEventsFunction"]["Properties"]["Environment"]["Variables"]
    assert env["DEAD_LETTER_QUEUE_URL"] == {"Ref": "EventsDeadLetters"}
    alarm = transformed["Resources"]["EventsDeadLettersAlarm"]["Properties"]
    assert alarm["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": ["EventsDeadLetters", "QueueName"]}}]


def test_the_sqs_events_function_may_touch_only_its_own_queues(transformed):
    """Least privilege: the poller's actions on the events queue, SendMessage on the dead
    letters, and no SQS action on any other resource (no managed policy with ``*``)."""
    sqs = [st for st in _statements(transformed, "SqsEventsFunction")
           if any(a.startswith("sqs:") for a in _actions(st))]
    by_resource = {json.dumps(st["Resource"], sort_keys=True): _actions(st) for st in sqs}
    assert by_resource[json.dumps({"Fn::GetAtt": ["EventsQueue", "Arn"]})] == {
        "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes"}
    assert by_resource[json.dumps({"Fn::GetAtt": ["EventsDeadLetters", "Arn"]})] == {"sqs:SendMessage"}
    assert by_resource[json.dumps({"Fn::GetAtt": ["WakeupQueue", "Arn"]})] == {"sqs:SendMessage"}
    assert len(by_resource) == 4 and "*" not in json.dumps(list(by_resource))
    role = transformed["Resources"]["SqsEventsFunctionRole"]["Properties"]
    assert [arn.rsplit("/", 1)[-1] for arn in role["ManagedPolicyArns"]] == ["AWSLambdaBasicExecutionRole"]


def test_every_function_can_deliver_the_confirmations_it_may_commit(transformed):
    """The outbox: whichever function commits a send hands it over right after the commit,
    and the sweeper retries; each needs the queue URL and sqs:SendMessage on it, nothing more."""
    queue = transformed["Resources"]["ConfirmationsQueue"]["Properties"]
    assert queue["FifoQueue"] is True and "QueueName" not in queue   # CloudFormation names it, ending in .fifo
    for function in ("EventsFunction", "SweeperFunction", "SqsEventsFunction", "WakeFunction"):
        env = transformed["Resources"][function]["Properties"]["Environment"]["Variables"]
        assert env["CONFIRMATIONS_QUEUE_URL"] == {"Ref": "ConfirmationsQueue"}, function
        sends = [st for st in _statements(transformed, function) if "ConfirmationsQueue" in json.dumps(st)]
        assert [_actions(st) for st in sends] == [{"sqs:SendMessage*"}], function


def test_the_outbox_alarm_adds_up_dead_rows_of_both_request_functions(transformed):
    alarm = transformed["Resources"]["OutboxDeadAlarm"]["Properties"]
    watched = {m["MetricStat"]["Metric"]["Dimensions"][0]["Value"]
               for m in alarm["Metrics"] if "MetricStat" in m}
    assert watched == {"statebound-events", "statebound-sqs-events"}
    services = {transformed["Resources"][f]["Properties"]["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"]
                for f in ("EventsFunction", "SqsEventsFunction")}
    assert services == watched
    assert all(m["MetricStat"]["Metric"]["MetricName"] == "Dead" for m in alarm["Metrics"] if "MetricStat" in m)

def test_timers_fire_by_sqs_wakeups_with_a_slow_fallback(transformed):
    """The wake-up wiring: every function that commits may send to the wake-up queue, the
    wake function consumes it in batches reporting per-message failures, failing messages
    park in a dead-letter queue that an alarm watches, and the sweeper runs every
    FallbackMinutes."""
    res = transformed["Resources"]
    queue = res["WakeupQueue"]["Properties"]
    assert queue["RedrivePolicy"]["deadLetterTargetArn"] == {"Fn::GetAtt": ["WakeupDeadLetters", "Arn"]}
    [props] = [m["Properties"] for m in resources(transformed, "AWS::Lambda::EventSourceMapping").values()
               if m["Properties"]["FunctionName"] == {"Ref": "WakeFunction"}]
    assert props["EventSourceArn"] == {"Fn::GetAtt": ["WakeupQueue", "Arn"]}
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"] and props["BatchSize"] == 10
    assert props["MaximumBatchingWindowInSeconds"] == 0
    assert queue["VisibilityTimeout"] >= 6 * res["WakeFunction"]["Properties"]["Timeout"]
    for fn in ("EventsFunction", "SqsEventsFunction", "WakeFunction", "SweeperFunction"):
        env = res[fn]["Properties"]["Environment"]["Variables"]
        assert env["WAKEUP_QUEUE_URL"] == {"Ref": "WakeupQueue"}, fn
        sends = [st for st in _statements(transformed, fn)
                 if "WakeupQueue" in json.dumps(st) and "sqs:SendMessage" in _actions(st)]
        assert [_actions(st) for st in sends] == [{"sqs:SendMessage"}], fn
    alarm = res["WakeupDeadLettersAlarm"]["Properties"]
    assert alarm["Dimensions"][0]["Value"] == {"Fn::GetAtt": ["WakeupDeadLetters", "QueueName"]}
    rules = json.dumps(resources(transformed, "AWS::Events::Rule"))
    assert "rate(${FallbackMinutes} minutes)" in rules


def test_every_functions_dynamodb_calls_give_up_before_its_timeout(transformed, monkeypatch):
    # botocore's defaults (60 s to connect, 60 s to read) held a call to a table endpoint that
    # hangs past every function's timeout: Lambda killed it, and API Gateway answered with its
    # own bare 5xx instead of the handler's 503
    import importlib

    from statebound.dynamodb._table import DYNAMODB_CALL, default_client

    from .harness import LAMBDA_DIR
    monkeypatch.syspath_prepend(str(LAMBDA_DIR))
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    app = importlib.import_module("app")

    def worst_s(config: dict[str, Any]) -> float:
        return config["retries"]["total_max_attempts"] * (config["connect_timeout"] + config["read_timeout"])

    timeouts = {name: r["Properties"]["Timeout"] for name, r in transformed["Resources"].items()
                if r["Type"] == "AWS::Lambda::Function"}
    assert min(timeouts.values()) == 10
    for name, timeout in timeouts.items():
        assert worst_s(app.DYNAMODB_CONFIG) < timeout - 1, name   # room left to answer 503
    client = app._dynamodb()._client_config
    assert (client.connect_timeout, client.read_timeout) == (1, 3)
    library = default_client()._client_config
    assert (library.connect_timeout, library.read_timeout) == (DYNAMODB_CALL.connect_timeout, DYNAMODB_CALL.read_timeout)
    assert DYNAMODB_CALL.read_timeout <= 5 and DYNAMODB_CALL.retries["total_max_attempts"] <= 2


def test_a_sweeper_that_stops_reporting_raises_an_alarm(transformed):
    # every other alarm treats missing data as fine: a sweeper that stopped running was silent
    alarm = transformed["Resources"]["SweeperSilentAlarm"]["Properties"]
    assert (alarm["MetricName"], alarm["Statistic"], alarm["TreatMissingData"]) == ("Sweeps", "Sum", "breaching")
    assert alarm["Dimensions"] == [{"Name": "service", "Value": "statebound-sweeper"}]
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("LessThanThreshold", 1)
    fallback = yaml_parse(TEMPLATE.read_text())["Parameters"]["FallbackMinutes"]
    assert fallback["MaxValue"] * 60 <= alarm["Period"]   # a live sweeper reports in every period
