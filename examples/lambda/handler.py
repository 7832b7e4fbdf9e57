"""HTTP API handler (API Gateway HTTP API, payload format 2.0).

Routes:
  POST /instances/{id}          {"chart": "order", "data": {...}}  -> 201, the new instance
  POST /instances/{id}/events   {"event": "StartPayment", "data": {...}}  -> 200
                                (or a Basic HTTP form post: _scxmleventname=...&k=v)
  GET  /instances/{id}          -> 200, the instance and its timer rows not yet fired

Every answer shows the instance's datamodel, except the variables in
``REDACTED_VARIABLES`` (the order's ``card``), which show only as ``"redacted"``.

Both POSTs answer from the position they committed, so an external event costs two
DynamoDB requests: one GetItem and one write (TransactWriteItems, or a conditional PutItem
when no timer changes). Their body lists the armed named timeouts; the timer rows with
due times are GET's (one GetItem plus one Query of the instance's partition). GET lists
only timers (``kind`` "timer"), each with its ``state``; the outbox rows of the same
partition (the order confirmation) are ``redrive.py``'s to show.

Both POSTs take an ``Idempotency-Key`` header (1 to 256 printable ASCII characters; the
quoted form of the IETF draft, ``"k-1"``, is accepted too; a comma is not, since API
Gateway joins a repeated header with commas), passed to the host as ``idempotency_key``.
A repeat of a key on the same instance applies nothing, costs one GetItem, and answers as
the first request did (201 or 200, the instance as it is now) with
``idempotent-replayed: true``; the same key with another event, data or chart is a 422.

No client may send an event the charts raise for themselves: a ``<sb:timeout>`` event of
any deployed revision (``PaymentTimeout``: posting it would fire the timer early) or a
platform event (``done.*``, ``error.*``); that is a 403 and changes nothing.

JSON is strict both ways (``statebound.jsonio``): NaN and Infinity are refused in a
body and never written. An event body that is JSON sent as a form (``curl -d`` without a
content-type) is a 415, not the event ``HTTP.POST``. Errors map to 400 bad input, 403 a
chart's own event, 404 unknown instance or chart, 409 exists, conflict or an undeployed
chart revision, 410 halted, 413 too large, 415 JSON sent as a form, 422 an
Idempotency-Key reused for another request, 503 the table is unavailable, 500 anything
else, a deployment whose charts do not compile included (the problems go to the log). A
5xx, or any error that came from AWS, answers a generic message and the request id; the
details (which may name the role or table) go to the log under that id, never into the
response.
"""

from __future__ import annotations

import base64
import re
import unicodedata
from typing import Any
from urllib.parse import parse_qsl

import statebound as sb
from statebound import jsonio
from statebound.dynamodb import MAX_INSTANCE_ID_BYTES
from statebound.host.store import TIMER

from app import OwnEvent, flush_outbox_metrics, get_host, refuse_own_event
from telemetry import logger, scope

_STATUS = (
    (sb.InstanceNotFound, 404), (sb.UnknownChart, 404), (sb.InstanceExists, 409), (sb.ConflictError, 409),
    (sb.ChartIdentityMismatch, 409), (sb.NotRunning, 410), (sb.ItemTooLarge, 413), (sb.SerializationError, 400),
    (sb.ChartError, 400), (sb.StoreUnavailable, 503), (sb.IdempotencyKeyReused, 422),
)
#: What a client is told when the details must stay in the log.
_GENERIC = {409: "the instance changed concurrently; retry", 413: "the instance would exceed the storage limit",
            503: "storage is unavailable; retry later"}
#: Longest instance id accepted, in UTF-8 bytes: what the table can key (below DynamoDB's
#: 1,024-byte sort-key limit, since the dead index's sort key is the id plus a suffix).
MAX_ID_BYTES = MAX_INSTANCE_ID_BYTES
#: A caller's X-Correlation-Id (or an SQS record's correlation_id attribute) is used only if
#: it looks like an id (it goes into every log line).
CORRELATION_ID = re.compile(r"[A-Za-z0-9._:/=+@-]{1,128}")
#: An Idempotency-Key: printable ASCII, as many characters as the host keeps per key.
_IDEMPOTENCY_KEY = re.compile(r"[\x20-\x7e]{1,256}")


class BadRequest(Exception):
    """The request itself is malformed (400)."""

    status = 400


class UnsupportedMediaType(BadRequest):
    """The body is not what its content-type says it is (415)."""

    status = 415


class HostUnavailable(Exception):
    """The environment's Host could not be built (a chart of the deployment does not compile)."""


def _response(status: int, body: Any, correlation_id: str | None = None, *,
              replayed: bool = False) -> dict[str, Any]:
    headers = {"content-type": "application/json"}
    if correlation_id:
        headers["x-correlation-id"] = correlation_id
    if replayed:
        headers["idempotent-replayed"] = "true"
    return {"statusCode": status, "headers": headers, "body": jsonio.dumps(body, default=_json_default)}


def _json_default(value: Any) -> Any:
    return value.hex() if isinstance(value, (bytes, bytearray)) else str(value)


def _body(event: dict[str, Any]) -> tuple[str, str]:
    raw = event.get("body") or ""
    if event.get("isBase64Encoded"):
        try:
            raw = base64.b64decode(raw).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            raise BadRequest("body is not valid base64 UTF-8") from None
    return raw, _headers(event).get("content-type", "application/json").split(";")[0].strip().lower()


def _headers(event: dict[str, Any]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}


def _json(raw: str) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        body = jsonio.loads(raw)
    except sb.InvalidJSON as exc:
        raise BadRequest(f"body is not strict JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


def check_instance_id(instance_id: str) -> str:
    """The id from the path, if this API accepts it; else :class:`BadRequest`.

    Any printable string of up to ``MAX_ID_BYTES`` works, ``#``, ``lease#...`` and the like
    included: the table keeps internal items in a key space no instance id reaches, and the
    store refuses what it cannot key (``InvalidInstanceId``, also a 400). Refused here
    first: control characters (they would travel into logs and URLs), ``::`` (it names
    invoked children) and lone surrogates (not encodable).
    """
    if not isinstance(instance_id, str) or not instance_id:
        raise BadRequest("instance id is empty")
    try:
        size = len(instance_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest("instance id is not valid Unicode") from None
    if size > MAX_ID_BYTES:
        raise BadRequest(f"instance id is {size:,} bytes in UTF-8; at most {MAX_ID_BYTES:,}")
    if any(unicodedata.category(ch) == "Cc" for ch in instance_id):
        raise BadRequest("instance id may not contain control characters")
    if "::" in instance_id:
        raise BadRequest("'::' is reserved for invoked child ids")
    return instance_id


#: Datamodel variables a response shows only as present: what the payment step keeps is
#: the chart's to use, never the API's to echo back to whoever may read an instance.
REDACTED_VARIABLES = frozenset({"card"})


def _public(datamodel: dict[str, Any]) -> dict[str, Any]:
    return {k: ("redacted" if k in REDACTED_VARIABLES and v is not None else v) for k, v in datamodel.items()}


def _view(pos: sb.Position, instance_id: str) -> dict[str, Any]:
    """An instance as the committed position shows it (no read needed)."""
    states = pos.chart.states
    return {
        "id": instance_id, "chart": pos.chart.name, "revision": pos.chart.version, "status": pos.status,
        "configuration": sorted(pos.configuration), "datamodel": _public(dict(pos.datamodel)),
        "timeouts": [{"name": t.name, "state": states[t.state].id, "ordinal": t.ordinal} for t in pos.timeouts],
    }


def _view_with_timers(host: sb.Host, instance_id: str) -> dict[str, Any]:
    """:func:`_view` plus the instance's timers that have not fired, each with its state
    (``pending``, ``claimed``, ``suspended`` or ``dead``)."""
    view = _view(host.get(instance_id), instance_id)
    # The partition also holds outbox rows (a confirmation not yet delivered, or parked
    # dead): they are no timers, have no name or event name, and redrive.py lists them.
    view["timers"] = [{"ordinal": r.ordinal, "name": r.name, "event": r.event.get("name"), "due_at_ms": r.due_at_ms,
                       "state": r.state, "attempts": r.attempts}
                      for r in host.pending_timers(instance_id) if r.kind == TIMER]
    return view


def _event_from_request(raw: str, ctype: str, instance_path: str) -> sb.Event:
    if ctype == "application/x-www-form-urlencoded":
        # The SCXML Basic HTTP event I/O processor posts forms like this one.
        form = dict(parse_qsl(raw, keep_blank_values=True))
        if "_scxmleventname" not in form and raw.lstrip().startswith("{"):
            # curl -d sends JSON as a form unless told otherwise; read as one, it would be
            # the event HTTP.POST, applied under the caller's Idempotency-Key. A form
            # serializer never writes a raw "{" (it percent-encodes it, as Basic HTTP senders
            # encode a <content> body), so no real form post is refused.
            raise UnsupportedMediaType(
                "the body is JSON but its content-type is application/x-www-form-urlencoded (curl -d's default): "
                "send 'content-type: application/json', or name a form post's event with _scxmleventname")
        name = form.get("_scxmleventname") or "HTTP.POST"
        return sb.Event(name, form, origintype=sb.events.BASICHTTP_PROCESSOR,
                        raw=f"POST {instance_path} HTTP/1.1\r\n\r\n{raw}")
    body = _json(raw)
    name = body.get("event")
    if not isinstance(name, str) or not name:
        raise BadRequest('body needs "event": a non-empty string')
    return sb.Event(name, body.get("data"))


def idempotency_key(event: dict[str, Any]) -> str | None:
    """The request's ``Idempotency-Key`` header, if it has one; :class:`BadRequest` if it is malformed.

    Stripe's bare form (``Idempotency-Key: k-1``) and the IETF draft's quoted string
    (``Idempotency-Key: "k-1"``) name the same key. A key may not contain a comma: API
    Gateway joins a header sent twice with one (``k-1,k-1``), and that new key would apply
    a retry again.
    """
    raw = _headers(event).get("idempotency-key")
    if raw is None:
        return None
    if "," in raw:
        raise BadRequest("Idempotency-Key may not contain ',': send the header once "
                         "(API Gateway joins a repeated header with commas)")
    key = raw.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not _IDEMPOTENCY_KEY.fullmatch(key) or not key.strip():
        raise BadRequest("Idempotency-Key must be 1 to 256 printable ASCII characters")
    return key


def _correlation_id(event: dict[str, Any]) -> str | None:
    given = _headers(event).get("x-correlation-id", "")
    if CORRELATION_ID.fullmatch(given):
        return given
    return (event.get("requestContext") or {}).get("requestId")


def from_aws(exc: BaseException) -> bool:
    """Whether botocore is anywhere in the exception's chain (its text may name ARNs)."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__module__.split(".")[0] in ("botocore", "boto3"):
            return True
        # `raise ... from None` said the context does not explain this error: stop there
        seen = seen.__cause__ if seen.__cause__ is not None or seen.__suppress_context__ else seen.__context__
    return False


def _error(exc: sb.StateboundError, cid: str | None) -> dict[str, Any]:
    status = next((code for cls, code in _STATUS if isinstance(exc, cls)), 500)
    if status >= 500 or from_aws(exc):
        logger.exception("request failed", extra={"status": status})
        return _response(status, {"error": _GENERIC.get(status, "internal error"), "request_id": cid}, cid)
    if isinstance(exc, sb.ChartIdentityMismatch):
        message = "the instance runs a chart revision that is not deployed (see README, Upgrade a chart)"
    else:
        message = str(exc).splitlines()[0]
    return _response(status, {"error": message, "type": type(exc).__name__}, cid)


@logger.inject_lambda_context(clear_state=True)
def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point for the HTTP API."""
    try:
        return _handle(event)
    finally:
        flush_outbox_metrics()


def _handle(event: dict[str, Any]) -> dict[str, Any]:
    try:
        method = event["requestContext"]["http"]["method"].upper()
        path = event.get("rawPath") or event["requestContext"]["http"].get("path", "")
    except (KeyError, TypeError, AttributeError):
        return _response(400, {"error": "not an API Gateway HTTP API (v2) event"})
    cid = _correlation_id(event)
    logger.set_correlation_id(cid)
    params = event.get("pathParameters") or {}
    parts = [p for p in path.split("/") if p]
    # API Gateway decodes {id} into pathParameters; the raw path is only a fallback
    instance_id = params["id"] if "id" in params else (parts[1] if len(parts) >= 2 and parts[0] == "instances"
                                                         else None)
    if instance_id is None:
        return _response(404, {"error": f"no route for {method} {path}"}, cid)
    try:
        with scope(instance_id=check_instance_id(instance_id), route=f"{method} /instances/{{id}}"
                   + ("/events" if len(parts) == 3 else ""), api_request_id=event["requestContext"].get("requestId")):
            return _route(event, method, path, parts, instance_id, cid)
    except BadRequest as exc:
        return _response(exc.status, {"error": str(exc)}, cid)
    except OwnEvent as exc:
        logger.warning("own event refused", extra={"reason": str(exc)})
        return _response(403, {"error": str(exc)}, cid)
    except ValueError as exc:  # an id the host or the store refuses (InvalidInstanceId is one)
        if not from_aws(exc):
            return _response(400, {"error": str(exc).splitlines()[0]}, cid)
        return _internal_error(cid)
    except HostUnavailable as exc:
        cause = exc.__cause__
        return _internal_error(cid, reason="the host could not be built; is the deployment's charts/ valid?",
                               problems=[str(p) for p in getattr(cause, "problems", ())] or str(cause))
    except sb.StateboundError as exc:
        return _error(exc, cid)
    except Exception:
        return _internal_error(cid)


def _internal_error(cid: str | None, **extra: Any) -> dict[str, Any]:
    logger.exception("request failed", extra={"status": 500, **extra})
    return _response(500, {"error": "internal error", "request_id": cid}, cid)


def _host() -> sb.Host:
    """:func:`app.get_host`, whose failure is the deployment's fault, never the request's."""
    try:
        return get_host()
    except sb.StateboundError as exc:
        # ChartError would be a 400 naming a server file; every request fails alike until a
        # fixed deployment, so it is a 500 whose problems go to the log only
        raise HostUnavailable(str(exc)) from exc


def _route(event: dict[str, Any], method: str, path: str, parts: list[str], instance_id: str,
           cid: str | None) -> dict[str, Any]:
    host = _host()
    context = {"correlation_id": cid}
    key = idempotency_key(event) if method == "POST" else None
    if key is not None:
        logger.append_keys(idempotency_key=key)
    repeats = host.metrics.get("duplicates", 0)   # one request at a time per environment

    def replayed() -> bool:
        return key is not None and host.metrics.get("duplicates", 0) > repeats

    if method == "POST" and len(parts) == 2:
        body = _json(_body(event)[0])
        chart = body.get("chart")
        if not isinstance(chart, str):
            raise BadRequest('body needs "chart": the name of a deployed chart')
        data = body.get("data")
        if data is not None and not isinstance(data, dict):
            raise BadRequest('"data" must be a JSON object')
        logger.append_keys(chart=chart)
        pos = host.start(chart, instance_id, data, caller_context=context, idempotency_key=key)
        logger.append_keys(revision=pos.chart.version)
        logger.info("instance started" if not replayed() else "repeated start: nothing applied",
                    extra={"configuration": sorted(pos.configuration)})
        return _response(201, _view(pos, instance_id), cid, replayed=replayed())
    if method == "POST" and len(parts) == 3 and parts[2] == "events":
        raw, ctype = _body(event)
        ev = _event_from_request(raw, ctype, path)
        logger.append_keys(event=ev.name)
        refuse_own_event(host, ev.name)
        pos = host.send(instance_id, ev, caller_context=context, idempotency_key=key)
        logger.info("event processed" if not replayed() else "repeated event: nothing applied",
                    extra={"configuration": sorted(pos.configuration), "status": pos.status})
        return _response(200, _view(pos, instance_id), cid, replayed=replayed())
    if method == "GET" and len(parts) == 2:
        return _response(200, _view_with_timers(host, instance_id), cid)
    return _response(404, {"error": f"no route for {method} {path}"}, cid)
