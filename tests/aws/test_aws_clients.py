"""The clients the AWS processors and the SQS wake-ups build when given none.

A host call hands its outbox rows over, and asks for wake-ups, right after its commit.
With botocore's defaults (60 s to connect, 60 s to read, 5 attempts) an endpoint that
accepts and never answers held an already-committed request for minutes, past a Lambda
function's timeout and past the row's 30 s claim, so that a sweeper sent the row again
meanwhile.
"""

from __future__ import annotations

import pytest

from statebound.aws import EventBridgeProcessor, LambdaProcessor, SQSProcessor
from statebound.dynamodb import SQSWakeup

QUEUE = "https://sqs.eu-west-1.amazonaws.com/123456789012/q"


@pytest.mark.parametrize("build", [lambda: SQSProcessor(QUEUE), lambda: EventBridgeProcessor(),
                                   lambda: LambdaProcessor("f"), lambda: SQSWakeup(QUEUE)],
                         ids=["sqs", "eventbridge", "lambda", "wakeup"])
def test_a_default_client_gives_up_within_seconds(aws, build):
    cfg = build().client.meta.config
    assert (cfg.connect_timeout, cfg.read_timeout) == (3, 5)
    assert cfg.retries["total_max_attempts"] == 2
    worst = cfg.retries["total_max_attempts"] * (cfg.connect_timeout + cfg.read_timeout)
    assert worst < 30   # inside the outbox row's default claim
