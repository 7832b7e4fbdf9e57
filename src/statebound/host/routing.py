"""Routing: where a ``<send>`` goes, and what a loaded session is allowed to reach.

* :func:`route` resolves a send target (``#_parent``, ``#_scxml_<id>``, ``#_<invokeid>``,
  none) to the instance that receives it and the event it gets; :func:`route_http` does
  the same for the Basic HTTP processor (SCXML C.2), which loops back to this host's own
  instances (ADR 0008).
* :func:`stamp` sets a loaded position's per-driver fields: which sessions ``#_scxml_<id>``
  reaches, the ``_ioprocessors`` it is offered and the invoke types it may use. An
  untrusted chart is offered only its own family and the processors and handlers the host
  opens to it (``Host(untrusted_may_use=...)``, ADR 0018), so it cannot steer other
  instances.

Nothing here writes: the unit of work loads, delivers and commits (``runner.py``,
``delivery.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote_plus, unquote, urlencode

from ..chart.trust import UNTRUSTED
from ..effects import Send
from ..events import BASICHTTP_PROCESSOR, SCXML_PROCESSOR, Event
from ..interpreter import Position
from ..interpreter.state import restamped
from .unit import Unit

if TYPE_CHECKING:
    from .host import Host

__all__ = ["child_instance_id", "related", "route", "route_http", "to_invoked", "stamp", "restamp", "ioprocessors"]

log = logging.getLogger("statebound")


def child_instance_id(parent_id: str, invokeid: str) -> str:
    """The instance id of the child session an ``<invoke>`` starts."""
    return f"{parent_id}::{invokeid}"


def related(me: str, parent: str | None, other: str) -> bool:
    """Whether an untrusted session ``me`` may address ``other``: itself, its parent, or a child of its own."""
    if other in (me, parent):
        return True
    head, sep, tail = other.rpartition("::")
    return bool(sep) and head == me and "::" not in tail


def to_invoked(eff: Send) -> bool:
    """Whether an SCXML send targets an invocation (``#_<invokeid>``)."""
    t = eff.target
    return (eff.type == SCXML_PROCESSOR and t is not None and t.startswith("#_")
            and not t.startswith("#_scxml_") and t not in ("#_parent", "#_internal"))


def route(h: Host, iid: str, pos: Position, target: str | None, eff: Any) -> tuple[str | None, Event]:
    """Resolve a send target to an instance id and the event it receives."""
    if eff.type == BASICHTTP_PROCESSOR:
        return route_http(h, iid, pos, target, eff)
    invokeid = None
    if target is None:
        dest: str | None = iid
    elif target == "#_parent":
        dest, invokeid = pos.parent, pos.invokeid
    elif target.startswith("#_scxml_"):
        dest = target[8:]
    elif target.startswith("#_"):
        dest = child_instance_id(iid, target[2:])
    else:
        log.warning("instance %r: no route for send target %r (type %s); event %r dropped",
                    iid, target, eff.type, eff.event)
        dest = None
    ev = Event(eff.event, eff.data, "external", eff.send_id if eff.id_from_author else None, eff.origin,
               SCXML_PROCESSOR, invokeid)
    return dest, ev


def route_http(h: Host, iid: str, pos: Position, target: str | None, eff: Any) -> tuple[str | None, Event]:
    """Basic HTTP (SCXML C.2): a form POST; loop back when the URL is one of ours."""
    form = dict(eff.data) if isinstance(eff.data, dict) else {}
    if eff.event:
        form["_scxmleventname"] = eff.event
    body = quote_plus(str(eff.data)) if eff.data is not None and not isinstance(eff.data, dict) \
        else urlencode({k: str(v) for k, v in form.items()})
    prefix = f"{h.http_base}/instances/" if h.http_base else None
    dest = None
    if prefix and target and target.startswith(prefix) and target.endswith("/events"):
        dest = unquote(target[len(prefix):-len("/events")])
    if dest is None:
        return iid, Event("error.communication", {"message": f"Basic HTTP target {target!r} is not reachable"},
                          "platform", eff.send_id)
    assert target is not None  # dest was found in it
    if pos.chart.trust == UNTRUSTED and not related(iid, pos.parent, dest):
        return iid, Event("error.communication",
                          {"message": f"Basic HTTP target {target!r} is not reachable from an untrusted chart"},
                          "platform", eff.send_id)
    raw = (f"POST {target[len(h.http_base or ''):]} HTTP/1.1\r\n"
           "Content-Type: application/x-www-form-urlencoded\r\n\r\n" + body)
    name = str(form.get("_scxmleventname") or "HTTP.POST")
    data = form if isinstance(eff.data, dict) or form else eff.data
    return dest, Event(name, data, "external", eff.send_id if eff.id_from_author else None,
                       h.http_location(iid), BASICHTTP_PROCESSOR, None, raw)


def stamp(h: Host, u: Unit, pos: Position) -> Position:
    """``pos`` with the per-driver fields this host offers it within unit ``u``."""
    return restamp(pos, *driver(h, u, pos))


def offer(h: Host, u: Unit, pos: Position) -> Callable[[], tuple[Any, Any, Any]]:
    """``() -> driver(h, u, pos)``, built on the first call and kept: what a unit hands
    ``Interpreter.drive_as``, which calls it only when the drive reads the fields (a
    cached transition never does, so most drives never build the routes or the offer)."""
    fields: tuple[Any, Any, Any] | None = None

    def get() -> tuple[Any, Any, Any]:
        nonlocal fields
        if fields is None:
            fields = driver(h, u, pos)
        return fields
    return get


def driver(h: Host, u: Unit, pos: Position) -> tuple[Any, Any, Any]:
    """``(routes, ioprocessors, invokers)``: the per-driver fields this host offers the
    instance of ``pos`` within unit ``u`` (see :func:`stamp`)."""
    if pos.chart.trust == UNTRUSTED:
        # An untrusted chart sees only its own family, and only the processors and handlers
        # offered to it: everything else is, to it, an unknown target or type (the spec's
        # error.communication / error.execution), so it cannot steer other instances.
        me = pos.session_id

        def reachable(session_id: str) -> bool:
            return related(me, pos.parent, session_id) and h._load(u, session_id) is not None
        return reachable, ioprocessors(h, me, trusted=False), h._untrusted_invoker_types

    def routes(session_id: str) -> bool:
        return h._load(u, session_id) is not None
    return routes, ioprocessors(h, pos.session_id), h._invoker_types


def ioprocessors(h: Host, instance_id: str, *, trusted: bool = True) -> dict[str, Any] | None:
    """The ``_ioprocessors`` entries offered to an instance, beside the SCXML processor."""
    # every send processor is an I/O processor the chart may name (SCXML 5.10's _ioprocessors)
    # built afresh on every load: the chart's code gets this very dict as _ioprocessors
    procs = h.processors
    iop: dict[str, Any] = {name: {} for name in procs if trusted or name in h.untrusted_may_use} if procs else {}
    if h.http_base is not None:
        loc = {"location": h.http_location(instance_id)}
        iop[BASICHTTP_PROCESSOR] = loc
        iop["basichttp"] = loc
    return iop or None


#: ``pos.restamp(routes=..., ioprocessors=..., invokers=...)`` positionally (callbacks are not
#: passed, so they are cleared): it runs twice on every host call, and returns ``pos`` itself
#: when it already carries exactly these values.
restamp = restamped
