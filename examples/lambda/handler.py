"""HTTP API handler (API Gateway HTTP API, payload format 2.0).

Routes:
  POST /instances/{id}          {"chart": "order", "data": {...}}  -> 201, the new instance
  POST /instances/{id}/events   {"event": "StartPayment", "data": {...}}  -> 200
                                (or a Basic HTTP form post: _scxmleventname=...&k=v)
  GET  /instances/{id}          -> 200, configuration, status, pending timers

One external event costs one GetItem and one TransactWriteItems (a conditional PutItem when
no timer changes). Errors map to 400 bad input, 404 unknown instance or chart, 409 exists
or conflict, 410 halted, 413 too large.
"""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import parse_qsl

import statebound as sb

from app import get_host

_STATUS = (
    (sb.InstanceNotFound, 404), (sb.UnknownChart, 404), (sb.InstanceExists, 409), (sb.ConflictError, 409),
    (sb.NotRunning, 410), (sb.ItemTooLarge, 413), (sb.SerializationError, 400), (sb.ChartError, 400),
    (sb.StoreUnavailable, 503),
)


class BadRequest(Exception):
    """The request itself is malformed (400)."""


def _response(status: int, body: Any) -> dict[str, Any]:
    return {"statusCode": status, "headers": {"content-type": "application/json"},
            "body": json.dumps(body, default=str)}


def _body(event: dict[str, Any]) -> tuple[str, str]:
    raw = event.get("body") or ""
    if event.get("isBase64Encoded"):
        try:
            raw = base64.b64decode(raw).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            raise BadRequest("body is not valid base64 UTF-8") from None
    headers = {k.lower(): v for k, v in (event.get("headers") or {}).items()}
    return raw, headers.get("content-type", "application/json").split(";")[0].strip().lower()


def _json(raw: str) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


def _instance(host: sb.Host, instance_id: str) -> dict[str, Any]:
    pos = host.get(instance_id)
    return {
        "id": instance_id, "chart": pos.chart.name, "status": pos.status,
        "configuration": sorted(pos.configuration), "datamodel": dict(pos.datamodel),
        "timers": [{"ordinal": r.ordinal, "name": r.name, "event": r.event.get("name"),
                    "due_at_ms": r.due_at_ms, "state": r.state} for r in host.pending_timers(instance_id)],
    }


def _event_from_request(raw: str, ctype: str, instance_path: str) -> sb.Event:
    if ctype == "application/x-www-form-urlencoded":
        # The SCXML Basic HTTP event I/O processor posts forms like this one.
        form = dict(parse_qsl(raw, keep_blank_values=True))
        name = form.get("_scxmleventname") or "HTTP.POST"
        return sb.Event(name, form, origintype=sb.events.BASICHTTP_PROCESSOR,
                        raw=f"POST {instance_path} HTTP/1.1\r\n\r\n{raw}")
    body = _json(raw)
    name = body.get("event")
    if not isinstance(name, str) or not name:
        raise BadRequest('body needs "event": a non-empty string')
    return sb.Event(name, body.get("data"))


def handle(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """The Lambda entry point for the HTTP API."""
    try:
        method = event["requestContext"]["http"]["method"].upper()
        path = event.get("rawPath") or event["requestContext"]["http"].get("path", "")
    except (KeyError, TypeError, AttributeError):
        return _response(400, {"error": "not an API Gateway HTTP API (v2) event"})
    params = event.get("pathParameters") or {}
    parts = [p for p in path.split("/") if p]
    instance_id = params.get("id") or (parts[1] if len(parts) >= 2 and parts[0] == "instances" else None)
    if not instance_id:
        return _response(404, {"error": f"no route for {method} {path}"})
    try:
        host = get_host()
        if method == "POST" and len(parts) == 2:
            body = _json(_body(event)[0])
            chart = body.get("chart")
            if not isinstance(chart, str):
                raise BadRequest('body needs "chart": the name of a deployed chart')
            data = body.get("data")
            if data is not None and not isinstance(data, dict):
                raise BadRequest('"data" must be a JSON object')
            host.start(chart, instance_id, data)
            return _response(201, _instance(host, instance_id))
        if method == "POST" and len(parts) == 3 and parts[2] == "events":
            raw, ctype = _body(event)
            host.send(instance_id, _event_from_request(raw, ctype, path))
            return _response(200, _instance(host, instance_id))
        if method == "GET" and len(parts) == 2:
            return _response(200, _instance(host, instance_id))
        return _response(404, {"error": f"no route for {method} {path}"})
    except BadRequest as exc:
        return _response(400, {"error": str(exc)})
    except ValueError as exc:  # e.g. an instance id the host refuses
        return _response(400, {"error": str(exc)})
    except sb.StateboundError as exc:
        status = next((code for cls, code in _STATUS if isinstance(exc, cls)), 500)
        return _response(status, {"error": str(exc).splitlines()[0], "type": type(exc).__name__})
