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
    assert set(functions) == {"EventsFunction", "SweeperFunction"}
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


def test_events_function_reads_the_api_endpoint_without_a_cycle(transformed):
    env = transformed["Resources"]["EventsFunction"]["Properties"]["Environment"]["Variables"]
    assert env["HTTP_BASE"] == {"Fn::GetAtt": ["Api", "ApiEndpoint"]}
    assert env["DONE_TTL_S"] == {"Ref": "DoneTtlSeconds"}
    # the API reaches the function only through the integration, never in its own properties
    assert "EventsFunction" not in json.dumps(transformed["Resources"]["Api"])
