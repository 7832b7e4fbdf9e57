"""Built-in send processors and invoke handlers on AWS: SQS, EventBridge and Lambda.

Register them with a host by type name::

    from statebound.aws import SQSProcessor, EventBridgeProcessor, LambdaProcessor, LambdaInvoker

    host = sb.Host(charts, store,
                   processors={"sqs": SQSProcessor(queue_url), "events": EventBridgeProcessor("orders")},
                   invokers={"lambda": LambdaInvoker()})

Each takes ``client=None`` (a boto3 client to use instead of the default one), sends
strict JSON, refuses an oversized payload before the call
(:class:`~statebound.PayloadTooLarge`), and answers the outbox only with
:class:`~statebound.DeliveryFailed` (retry) or :class:`~statebound.DeliveryRejected`
(give up). ``docs/aws-processors.md`` has the payload shapes, IAM permissions and the
receiver's side of the idempotency contract.

Like :mod:`statebound.dynamodb`, this package needs the ``aws`` extra
(``pip install 'statebound[aws]'``); ``import statebound`` never imports it.
"""

try:
    import boto3  # noqa: F401  (fail here, with advice, rather than deep inside a delivery)
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("statebound.aws needs boto3: pip install 'statebound[aws]'") from exc

from .eventbridge import EVENTBRIDGE_MAX_BYTES, EventBridgeProcessor
from .lambda_ import LAMBDA_ASYNC_MAX_BYTES, LAMBDA_SYNC_MAX_BYTES, LambdaInvoker, LambdaProcessor
from .sqs import SQS_MAX_BYTES, SQSProcessor

__all__ = ["SQSProcessor", "EventBridgeProcessor", "LambdaProcessor", "LambdaInvoker",
           "SQS_MAX_BYTES", "EVENTBRIDGE_MAX_BYTES", "LAMBDA_ASYNC_MAX_BYTES", "LAMBDA_SYNC_MAX_BYTES"]
