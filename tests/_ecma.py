"""Helpers shared by the ecmascript test modules (imported only after quickjs is known to exist)."""

from __future__ import annotations

import statebound as sb
from statebound.datamodel import ecmascript as E

NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="ecmascript"'


def chart(body: str, datamodel: str = "", **limits) -> sb.Chart:
    """An ecmascript chart of ``body``, with ``<datamodel>`` content and sandbox limits."""
    c = sb.Chart.from_scxml(f"<scxml {NS}>{datamodel and '<datamodel>' + datamodel + '</datamodel>'}{body}</scxml>")
    if limits:
        E.set_limits(c, **limits)
    return c
