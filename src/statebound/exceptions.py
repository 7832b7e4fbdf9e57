"""The statebound error hierarchy.

Every error statebound raises on purpose derives from :class:`StateboundError`,
so a host can catch the whole family in one clause and still tell the cases apart::

    StateboundError
    ├── ChartError                    the SCXML could not become a Chart
    │   ├── ChartSyntaxError          malformed or hostile XML (line, column)
    │   ├── ChartValidationError      a well-formed document that breaks the rules (all problems)
    │   │   └── ChartPolicyError      ... or the load policy: src containment, trust (docs/security.md)
    │   ├── InvalidTrustLevel         trust= is neither "trusted" nor "untrusted" (also a ValueError)
    │   └── UnknownState              Chart.state() of an id the chart lacks (also a KeyError)
    ├── EvaluationError               an expression failed (internal: becomes error.execution)
    ├── NotRunning                    drive/send on a halted position or instance
    ├── BudgetExceeded                start() did not settle within max_rounds or its CPU/memory budget
    ├── SerializationError            a value that cannot be stored (msgpack/cbor)
    ├── InvalidJSON                   input that is not strict JSON (NaN and Infinity included)
    ├── InvalidEvent                  an event that is not an Event or a non-empty name
    ├── InvalidArgument               an argument the API cannot use (also a TypeError and ValueError)
    ├── PositionError                 a blob that cannot be loaded
    │   ├── NotAPosition
    │   ├── UnsupportedFormatVersion
    │   ├── ChartIdentityMismatch
    │   ├── CorruptPosition
    │   ├── MigrationError            import_() of an export the new chart cannot hold (in statebound.position)
    │   └── CodecUnavailable          cbor without cbor2 installed; also a SerializationError (statebound.position)
    ├── HostError
    │   ├── InstanceExists
    │   ├── InstanceNotFound
    │   ├── UnknownChart
    │   ├── InstanceSuspended         an event sent to a suspended instance
    │   ├── DeliveryRejected          a processor or invoke handler gave up for good
    │   │   ├── PayloadTooLarge       over the receiving service's size limit
    │   │   └── PayloadNotJSON        data that strict JSON cannot carry (NaN, bytes...)
    │   ├── DeliveryFailed            this attempt failed; the outbox retries it
    │   ├── IdempotencyKeyReused      an idempotency key came back with other data
    │   └── InvalidBatchItem          a send_many item that is not (id, event[, data, key])
    └── StoreError                    anything a backend could not do
        ├── ConflictError             optimistic version check failed
        ├── ItemTooLarge              a position or commit over the backend's limit
        ├── InvalidInstanceId         an id the host or backend cannot use (empty, '::', too long)
        ├── StoreUnavailable          the backend failed (throttled past retries, I/O error)
        └── InvalidStoreURL           open_store() was given a URL it cannot open

Errors raised by executable content inside a chart are *not* in this tree: the W3C
algorithm turns them into ``error.execution`` events and they never reach the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "StateboundError",
    "ChartError",
    "ChartSyntaxError",
    "ChartValidationError",
    "ChartPolicyError",
    "InvalidTrustLevel",
    "UnknownState",
    "Problem",
    "EvaluationError",
    "NotRunning",
    "BudgetExceeded",
    "SerializationError",
    "InvalidJSON",
    "InvalidEvent",
    "InvalidArgument",
    "PositionError",
    "NotAPosition",
    "UnsupportedFormatVersion",
    "ChartIdentityMismatch",
    "CorruptPosition",
    "HostError",
    "InstanceExists",
    "InstanceNotFound",
    "UnknownChart",
    "InstanceSuspended",
    "DeliveryRejected",
    "PayloadTooLarge",
    "PayloadNotJSON",
    "DeliveryFailed",
    "IdempotencyKeyReused",
    "InvalidBatchItem",
    "StoreError",
    "ConflictError",
    "ItemTooLarge",
    "InvalidInstanceId",
    "StoreUnavailable",
    "InvalidStoreURL",
]


class StateboundError(Exception):
    """Root of every error statebound raises deliberately.

    Every one survives ``pickle`` (a process pool handing a worker's error back, a task
    queue) as it was: the same class, message and attributes. Python's default would call
    the class again with the message as its only argument, which most of these classes'
    constructors, taking ids and reasons, cannot take or would word differently.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.args, self.__dict__)


def describe(exc: BaseException) -> str:
    """``"Type: message"`` for an exception raised by code the host calls (a processor, a
    handler, a log sink), even one whose ``__str__`` raises: that text is written on the
    row, and a formatting error there would fail the sweep instead of the row."""
    try:
        text = str(exc)
    except Exception as inner:  # whatever __str__ raises
        text = f"<str() of this exception raised {type(inner).__name__}>"
    return f"{type(exc).__name__}: {text}"


def _rebuild(cls: type[StateboundError], args: tuple[Any, ...], state: dict[str, Any]) -> StateboundError:
    """A pickled :class:`StateboundError` as it was, without calling its ``__init__`` again."""
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


# --------------------------------------------------------------------------- charts


class ChartError(StateboundError):
    """The SCXML document could not be turned into a :class:`~statebound.Chart`."""


class ChartSyntaxError(ChartError):
    """The document is not well-formed XML, or uses a forbidden construct (DTD, entities).

    :ivar line: 1-based line of the problem, or ``None`` when unknown.
    :ivar column: 1-based column of the problem, or ``None`` when unknown.
    """

    def __init__(self, message: str, line: int | None = None, column: int | None = None,
                 source: str | None = None) -> None:
        self.line = line
        self.column = column
        self.source = source
        where = ""
        if line is not None:
            where = f" at line {line}" + (f", column {column}" if column is not None else "")
        prefix = f"{source}: " if source else ""
        super().__init__(f"{prefix}{message}{where}")


@dataclass(frozen=True, slots=True)
class Problem:
    """One validation problem: what is wrong and where.

    :ivar message: a sentence saying what is wrong.
    :ivar line: 1-based source line of the offending element, when known.
    :ivar column: 1-based source column, when known.
    :ivar element: the element's tag (``"transition"``, ``"state"``...).
    """

    message: str
    line: int | None = None
    column: int | None = None
    element: str | None = None

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.message}"


class ChartValidationError(ChartError):
    """The document is well-formed but is not a valid chart. Lists *every* problem found.

    :ivar problems: the problems, in document order.
    """

    def __init__(self, problems: Sequence[Problem], source: str | None = None) -> None:
        self.problems = tuple(problems)
        self.source = source
        head = f"{source}: " if source else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{head}{len(self.problems)} problem(s) in chart:\n{lines}")


class ChartPolicyError(ChartValidationError):
    """The chart breaks the policy it was loaded under (see ``docs/security.md``).

    A ``src`` that leaves the chart's base directory (or the allowed directories), names
    something other than a regular file, or is over the size limit; a datamodel that an
    untrusted chart may not use; a load that reads or compiles more than one load may.
    Raised at load time, listing every problem like its parent class; at run time (a
    ``srcexpr`` or ``<content expr>`` child) the same refusal becomes ``error.execution``.
    """


class InvalidTrustLevel(ChartError, ValueError):
    """``trust=`` was neither ``"trusted"`` nor ``"untrusted"``; nothing was loaded.

    A ``ValueError`` too, as it was before it had a class of its own.
    """


class UnknownState(ChartError, KeyError):
    """:meth:`Chart.state <statebound.Chart.state>` was asked for an id the chart has no
    state for. A ``KeyError`` too, as it was before it had a class of its own.

    :ivar chart: the chart's name.
    :ivar state_id: the id asked for.
    """

    def __init__(self, chart: str, state_id: object) -> None:
        self.chart = chart
        self.state_id = state_id
        super().__init__(f"chart {chart!r} has no state {state_id!r}")

    def __str__(self) -> str:  # KeyError's would quote the message
        return str(self.args[0])


# --------------------------------------------------------------------------- running


class EvaluationError(StateboundError):
    """An expression, location or script failed in the datamodel.

    The interpreter catches it and raises ``error.execution`` inside the chart, as the
    SCXML spec requires; hosts never see it.
    """


class NotRunning(StateboundError):
    """The position or instance has halted (status ``done`` or ``cancelled``).

    :ivar status: the status found.
    """

    def __init__(self, message: str, status: str | None = None) -> None:
        self.status = status
        super().__init__(message)


class BudgetExceeded(StateboundError):
    """``Interpreter.start`` (or ``Host.start``) ran ``max_rounds`` microsteps, or spent its
    CPU or memory budget (``max_cpu_ms``, ``max_memory_bytes``), without the session settling.

    A *drive* never raises this: it returns the unchanged position and a
    ``BudgetExhausted`` effect. A start has no earlier position to return.
    """


class SerializationError(StateboundError, TypeError):
    """A value cannot be encoded by the position codec (msgpack or CBOR).

    Datamodel values and event data must be made of ``None``, ``bool``, ``int``,
    ``float``, ``str``, ``bytes``, lists and string-keyed dicts.
    """


class InvalidJSON(StateboundError, ValueError):
    """Text given as JSON is not strict JSON (RFC 8259): malformed, or it uses ``NaN``,
    ``Infinity`` or a number too large for a float, which Python's ``json`` would accept.
    """


class InvalidEvent(StateboundError, TypeError, ValueError):
    """An event given to ``drive``, ``host.send`` or ``host.send_many`` is neither an
    :class:`~statebound.Event` nor an event name, or its name is not a non-empty string.
    Nothing is driven or written. A ``TypeError`` and a ``ValueError`` too, as it was
    before it had a class of its own.
    """


class InvalidArgument(StateboundError, TypeError, ValueError):
    """An argument statebound's API cannot use, refused before anything was done: a
    setting of the wrong type or out of range (a limit, a lease, a batch size), start data
    that is not a map of variable names, an idempotency key that is empty or too long, an
    invoke token of another invocation, a clock moved backwards, or a wake-up message that
    is not one.

    A ``TypeError`` and a ``ValueError`` too, as those calls raised before it had a class
    of its own, so ``except ValueError`` (or ``TypeError``) around them still works. The
    message says which argument and why.
    """


# --------------------------------------------------------------------------- positions


class PositionError(StateboundError):
    """A position blob could not be loaded. ``from_bytes`` raises nothing else."""


class NotAPosition(PositionError):
    """The bytes do not start with the statebound magic prefix."""


class UnsupportedFormatVersion(PositionError):
    """The blob was written by a format version this code does not know.

    :ivar version: the version number found in the blob.
    """

    def __init__(self, version: int, supported: Sequence[int] = ()) -> None:
        self.version = version
        self.supported = tuple(supported)
        known = ", ".join(map(str, self.supported)) or "none"
        super().__init__(f"position format version {version} is not supported (this code reads: {known})")


class ChartIdentityMismatch(PositionError):
    """The blob belongs to a different chart than the one it is being loaded against.

    :ivar expected: ``(identity, name, version)`` of the chart given to ``from_bytes``.
    :ivar found: ``(identity, name, version)`` recorded in the blob.
    """

    def __init__(self, expected: tuple[str, str | None, str | None],
                 found: tuple[str, str | None, str | None]) -> None:
        self.expected = expected
        self.found = found
        super().__init__(
            "position was written for chart "
            f"{found[1]!r} version {found[2]!r} ({found[0]}) but is being loaded against "
            f"{expected[1]!r} version {expected[2]!r} ({expected[0]}); "
            "drain it on the old chart or migrate it with export()/Position.import_()"
        )


class CorruptPosition(PositionError):
    """The blob is truncated or its payload is inconsistent with the chart."""


# --------------------------------------------------------------------------- host


class HostError(StateboundError):
    """A host call was refused. Nothing was written."""


class InstanceExists(HostError):
    """``start`` was called with an instance id that already exists."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        super().__init__(f"instance {instance_id!r} already exists")


class InstanceNotFound(HostError, KeyError):
    """No instance with this id exists in the store."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        super().__init__(f"instance {instance_id!r} not found")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class UnknownChart(HostError, KeyError):
    """The host was asked for a chart it was not given."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"chart {name!r} is not registered with this host")

    def __str__(self) -> str:
        return str(self.args[0])


class InstanceSuspended(HostError):
    """The instance is suspended (``Host.suspend``): it takes no events until
    ``Host.resume``. Nothing was written; its timers wait, they are not dropped."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        super().__init__(f"instance {instance_id!r} is suspended (resume it first)")


class DeliveryRejected(HostError):
    """Raised by a send processor or invoke handler: this delivery will never succeed.

    The outbox row is parked as dead at once (no retries), and the sending instance gets
    ``error.communication`` (a send) or ``error.execution`` (an invoke). Any other exception
    from a processor means "retry later".
    """


class PayloadTooLarge(DeliveryRejected):
    """The encoded payload is over the receiving service's limit; it was not sent.

    Checked before the call, so a payload that can never fit is parked at once rather
    than retried until ``max_attempts``.

    :ivar size: the encoded size in bytes, as the service counts it.
    :ivar limit: the limit in bytes.
    """

    def __init__(self, message: str, size: int | None = None, limit: int | None = None) -> None:
        self.size = size
        self.limit = limit
        super().__init__(message)


class PayloadNotJSON(DeliveryRejected):
    """A payload (or a function's result) is not strict JSON: NaN, Infinity, bytes, a cycle...

    Retrying cannot change the data, so the delivery is parked at once.
    """


class DeliveryFailed(HostError):
    """Raised by a send processor or invoke handler: this attempt failed, a later one may not.

    The outbox releases the row with backoff and tries again, up to the host's
    ``max_attempts`` (throttling, a 5xx, a dropped connection, a function that raised).

    :ivar code: the remote error code (``"ThrottlingException"``...), when there is one.
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        self.code = code
        super().__init__(message)


class IdempotencyKeyReused(HostError):
    """An idempotency key this instance has already applied came with a different event,
    different data or (for ``start``) a different chart. Nothing was written.

    :ivar instance_id: the instance that holds the key.
    :ivar key: the key.
    """

    def __init__(self, instance_id: str, key: str, what: str = "event or data") -> None:
        self.instance_id = instance_id
        self.key = key
        super().__init__(f"idempotency key {key!r} was already used on instance {instance_id!r} "
                         f"with a different {what}; use a new key for a new request")


class InvalidBatchItem(HostError, ValueError):
    """An item of ``host.send_many`` that is not ``(instance_id, event[, data[,
    idempotency_key]])``. Reported in that item's result; the other items go on.

    :ivar index: the item's position in the input.
    """

    def __init__(self, index: int, reason: str) -> None:
        self.index = index
        super().__init__(f"send_many item {index}: {reason}")


# --------------------------------------------------------------------------- stores


class StoreError(StateboundError):
    """A backend could not complete an operation."""


class ConflictError(StoreError):
    """The optimistic version check failed: someone else committed first.

    The host reloads and retries a bounded number of times before letting this escape.

    :ivar instance_id: the instance whose version moved, when known.
    :ivar current: the version now stored, when the backend can tell.
    """

    def __init__(self, message: str, instance_id: str | None = None, current: Any = None) -> None:
        self.instance_id = instance_id
        self.current = current
        super().__init__(message)


class ItemTooLarge(StoreError):
    """A position, or a whole commit, exceeds what the backend accepts. Nothing was written.

    :ivar size: the size or count that was refused.
    :ivar limit: the backend's limit.
    """

    def __init__(self, message: str, size: int | None = None, limit: int | None = None) -> None:
        self.size = size
        self.limit = limit
        super().__init__(message)


class InvalidInstanceId(StoreError, ValueError):
    """An instance id the host or the backend cannot use. Nothing was read or written.

    Every store refuses an id that is not a non-empty string or is not valid Unicode (a
    lone surrogate cannot be encoded as UTF-8); a backend with a key-size limit also
    refuses ids over it (DynamoDB: ``statebound.dynamodb.MAX_INSTANCE_ID_BYTES``). A host
    also refuses, at ``start``, an id over 512 characters or one holding ``::`` (kept for
    invoked children). It is a ``ValueError`` too, so a caller validating input can treat
    it as bad input.

    :ivar instance_id: the refused id (possibly not a string).
    :ivar reason: why, in a few words.
    """

    def __init__(self, instance_id: object, reason: str) -> None:
        self.instance_id = instance_id
        self.reason = reason
        shown = repr(instance_id)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"instance id {shown} cannot be stored: {reason}")


class StoreUnavailable(StoreError):
    """The backend failed in a way retries did not cure (I/O error, throttled)."""


class InvalidStoreURL(StoreError, ValueError):
    """:func:`statebound.open_store` cannot open this URL: an unknown scheme or option, a bad
    value, a missing table name, or a backend whose extra is not installed. Nothing was opened."""
