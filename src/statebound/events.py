"""The :class:`Event` value that drives a chart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._fastinit import fast_init

__all__ = ["Event", "SCXML_PROCESSOR", "BASICHTTP_PROCESSOR", "CANCEL_EVENT"]

#: The type URI of the SCXML event I/O processor (W3C SCXML §C.1).
SCXML_PROCESSOR = "http://www.w3.org/TR/scxml/#SCXMLEventProcessor"
#: The type URI of the Basic HTTP event I/O processor (W3C SCXML §C.2).
BASICHTTP_PROCESSOR = "http://www.w3.org/TR/scxml/#BasicHTTPEventProcessor"


#: Name of the platform event that cancels a session (Appendix D's ``isCancelEvent``).
CANCEL_EVENT = "cancel"


@fast_init
@dataclass(frozen=True, slots=True)
class Event:
    """An SCXML event, as seen by the chart through ``_event``.

    ``data`` is plain data (dicts, lists, strings, numbers, booleans, ``None``); it is
    never evaluated. The other fields follow W3C SCXML §5.10.1 and are normally
    filled in by the host when it routes an event between sessions.

    :param name: the event name, e.g. ``"StartPayment"`` or ``"done.invoke.pay"``.
    :param data: the payload, exposed to expressions as ``_event.data``.
    :param type: ``"external"``, ``"internal"`` or ``"platform"``.
    :param sendid: the ``id`` of the ``<send>`` that produced it, if any.
    :param origin: a URI the receiver can reply to, e.g. ``"#_scxml_order-1"``.
    :param origintype: the I/O processor type of ``origin``.
    :param invokeid: set when the event comes from an invoked child session.
    :param raw: the raw message, for events that arrived over a wire protocol (Basic HTTP).
    :param idempotency_key: for an event handed to ``host.send``: apply it once per key
        (the same as ``host.send(..., idempotency_key=...)``). Never shown to the chart.
    """

    name: str
    data: Any = None
    type: str = "external"
    sendid: str | None = None
    origin: str | None = None
    origintype: str | None = None
    invokeid: str | None = None
    raw: str | None = None
    idempotency_key: str | None = None

    @classmethod
    def cancel(cls) -> Event:
        """The event that cancels a session: every state is exited, status becomes ``cancelled``."""
        return cls(CANCEL_EVENT, None, "platform")

    @property
    def is_cancel(self) -> bool:
        """True for the cancel event (a *platform* event named ``cancel``; senders cannot forge it
        with an ordinary external event)."""
        return self.type == "platform" and self.name == CANCEL_EVENT

    def to_dict(self) -> dict[str, Any]:
        """Return the event as a plain dict (what timer rows store)."""
        d = {
            "name": self.name, "data": self.data, "type": self.type, "sendid": self.sendid,
            "origin": self.origin, "origintype": self.origintype, "invokeid": self.invokeid,
            "raw": self.raw,
        }
        if self.idempotency_key is not None:
            d["idempotency_key"] = self.idempotency_key
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        """Rebuild an event from :meth:`to_dict` output."""
        return cls(d["name"], d.get("data"), d.get("type") or "external", d.get("sendid"),
                   d.get("origin"), d.get("origintype"), d.get("invokeid"), d.get("raw"),
                   d.get("idempotency_key"))
