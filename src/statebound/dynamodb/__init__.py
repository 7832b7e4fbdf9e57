"""statebound on DynamoDB: :class:`DynamoStore`, the sweepers' :class:`ShardLeases`, and
:class:`SQSWakeup` with its Lambda handlers (``statebound.dynamodb.lambda_handlers``).

This is the only statebound package that imports boto3 (``pip install 'statebound[aws]'``);
``import statebound`` never does, so the core runs without it.
"""

try:
    import boto3  # noqa: F401  (fail here, with advice, rather than deep inside a call)
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("statebound.dynamodb needs boto3: pip install 'statebound[aws]'") from exc

from ._codec import DEAD_INDEX, DUE_INDEX
from ._migrate import MigrationReport
from .leases import ShardLeases
from .sqs_wakeup import SQSWakeup
from .store import MAX_INSTANCE_ID_BYTES, MAX_ITEM_BYTES, MAX_TRANSACTION_ACTIONS, DynamoStore

__all__ = ["DynamoStore", "ShardLeases", "SQSWakeup", "MigrationReport", "DUE_INDEX", "DEAD_INDEX",
           "MAX_ITEM_BYTES", "MAX_TRANSACTION_ACTIONS", "MAX_INSTANCE_ID_BYTES"]
