"""Sessions inside a unit of work: starting one (a ``start`` or an SCXML ``<invoke>``),
and deleting one with every child it invoked.

An invoked child is an instance of its own, ``{parent}::{invokeid}``
(:func:`~statebound.host.routing.child_instance_id`), started and committed in the unit
that entered the invoking state. A chart named by ``<invoke src>`` or given by
``<content>`` is compiled here, under the parent's policy (its ``src`` containment; an
untrusted parent's children are untrusted too), and registered with the host.
Invoke types served by an invoke handler are not started here: they become outbox rows
(``outbox.py``).
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..chart.compiler import compile_content_child, compile_src_child
from ..chart.model import Chart
from ..effects import Invoke
from ..events import Event
from ..exceptions import BudgetExceeded, ChartError, SerializationError, StateboundError
from ..interpreter import Position
from ..interpreter.state import RUNNING
from . import tombstone
from .routing import child_instance_id, stamp
from .store import DELETED, check_instance_id
from .runner import fetch, load
from .unit import Entry, Unit

if TYPE_CHECKING:
    from .host import Host

__all__ = ["MAX_INVOKE_DEPTH", "invoke", "start_instance", "delete_instance", "inherit_limits"]

#: How deep invoked sessions may nest (a child's child's ...). Inline and src children nest at
#: most 8 deep when a chart loads; srcexpr and <content expr> could otherwise recurse for ever.
MAX_INVOKE_DEPTH = 16


def start_instance(h: Host, u: Unit, instance_id: str, chart: Chart, data: Mapping[str, Any] | None,
                   parent: str | None, invokeid: str | None, caller_context: Any) -> None:
    """Start a session in unit ``u`` and apply the effects of its start."""
    interp = h._interpreters[chart.name, chart.identity]
    existing = u.entries.get(instance_id)
    if existing is None and parent is not None:
        # a leftover child is replaced, not duplicated: loaded, so that the new one goes on
        # from its ordinals and its rows go (the replacing write purges nothing itself)
        try:
            load(h, u, instance_id)
        except StateboundError:   # one this host cannot decode: replaced all the same
            pass
        existing = u.entries.get(instance_id)
        record = existing.record if existing is not None else fetch(h, u, instance_id)
    else:
        record = existing.record if existing is not None else None
    # Over a deleted instance's tombstone, or in place of a live one (deleted earlier in this
    # call, or a leftover child), the ordinals go on: no row key, outbox key or invoke token
    # of the old instance is ever this one's, and no row of the old one is left to fire into it.
    after = tombstone.last_ordinal(record) if record is not None else 0
    if record is not None and record.status != DELETED:
        refs = existing.refs if existing is not None else list(record.timers)
        u.deletes.extend((instance_id, r.ordinal) for r in refs)
        if existing is not None and existing.position is not None:
            after = max(after, existing.position.ordinal)
    e = Entry(record, None, chart.name, [], parent)
    if h.history is not None:
        e.steps, e.started = [], {"data": dict(data) if data is not None else None, "parent": parent,
                                  "invokeid": invokeid}
        if after:   # (replay starts from the same ordinal)
            e.started["ordinal"] = after
    u.entries[instance_id] = e
    seed = stamp(h, u, Position(interp.chart, instance_id, RUNNING, ()))
    u.starts += 1
    pos, effects = interp.start(instance_id, data, parent=parent, invokeid=invokeid, routes=seed.routes,
                                ioprocessors=seed.ioprocessors, caller_context=caller_context,
                                only_declared=parent is not None, invokers=seed.invokers,
                                budget=u.budget, ordinal=after)
    e.position, e.dirty = pos, True
    h._apply(u, instance_id, effects, caller_context)


def invoke(h: Host, u: Unit, iid: str, pos: Position, eff: Invoke, ctx: Any) -> None:
    """Start the SCXML child an ``<invoke>`` asks for; a failure is ``error.execution`` to the parent."""
    chart = eff.chart
    try:
        if iid.count("::") >= MAX_INVOKE_DEPTH:  # a chart invoking itself by srcexpr, forever
            raise ChartError(f"invoked sessions nest deeper than {MAX_INVOKE_DEPTH}")
        if u.starts >= h.max_deliveries:  # ... or ten times over at every level
            raise ChartError(f"this call already started {u.starts} sessions (max_deliveries)")
        if chart is None and u.budget is not None and u.budget.spent:  # compiling costs CPU too
            raise ChartError("the call's CPU budget is spent; no chart was compiled")
        # Run-time children are loaded under the parent's policy: its src containment, and
        # an untrusted parent's children are untrusted too.
        if chart is None and eff.content is not None:
            if not isinstance(eff.content, str):
                raise ChartError("an SCXML <invoke>'s <content expr> must give the child's document as a string")
            name = f"{pos.chart.name}/{eff.state}.dyn{zlib.crc32(eff.content.encode('utf-8', 'replace'))}"
            chart = compile_content_child(pos.chart, eff.content, name)
        elif chart is None and eff.src:
            src = eff.src[5:] if eff.src.startswith("file:") else eff.src  # the name as it always was
            chart = compile_src_child(pos.chart, src, f"{pos.chart.name}/{eff.state}.src:{src}")
        if chart is None:
            raise ChartError("the <invoke> names no chart")
        # a parent id the store keys may be too long once ``::invokeid`` is added: refused by
        # the commit, it failed the parent's whole call on every retry
        cid = check_instance_id(child_instance_id(iid, eff.invokeid), getattr(h.store, "max_instance_id_bytes", None))
    except StateboundError as exc:
        u.queue.append((iid, Event("error.execution", {"message": f"invoke {eff.invokeid!r}: {exc}"},
                                   "platform"), ctx))
        return
    registered = h._revisions.get(chart.name, {}).get(chart.identity)
    if registered is None:
        h.register(chart)
        registered = chart
    if eff.chart is None:
        # the chart that runs it: the one first compiled under this name (its interpreter is
        # keyed by name and identity, so no other chart's limits reach it, nor its theirs)
        inherit_limits(pos.chart, registered)
    try:
        start_instance(h, u, cid, chart, eff.data, iid, eff.invokeid, ctx)
    except (BudgetExceeded, SerializationError) as exc:
        # the child did not settle, the call's budget ran out, or the parent's <param>s do
        # not fit the child's datamodel (bytes, or values nested too deep for ecmascript)
        u.entries.pop(cid, None)
        u.queue.append((iid, Event("error.execution", {"message": f"invoke {eff.invokeid!r}: {exc}"},
                                   "platform"), ctx))


#: Where ``set_limits`` keeps a chart's ECMAScript limits (``datamodel/ecmascript/limits.py``),
#: read here without importing QuickJS: a host whose charts have none never needs it.
_LIMITS_KEY = "ecmascript.limits"
def _tree(chart: Chart) -> list[Chart]:
    """``chart`` and every chart it invokes inline or by ``src``, nested."""
    out, todo = [], [chart]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.subcharts)
    return out


def inherit_limits(parent: Chart, child: Chart) -> None:
    """A child compiled at run time (``srcexpr``, ``<content expr>``) runs under ``parent``'s
    ECMAScript limits, as the inline and ``src`` children ``set_limits`` reaches do: under
    the defaults, a parent held to 2 MiB and 50 ms got 64 MiB and 1 s by invoking its code."""
    own = parent._caches.get(_LIMITS_KEY)
    for c in _tree(child):
        if own is None:
            c._caches.pop(_LIMITS_KEY, None)
        else:
            c._caches[_LIMITS_KEY] = own


def delete_instance(h: Host, u: Unit, iid: str) -> None:
    """Delete an instance in unit ``u``: its invoked children, its rows and its queued events too.

    A child deleted because its parent, driven in ``u``, left the invoking state (or was
    cancelled) has its handler invocations, and its descendants', cancelled as an exit
    cancels them: their cancel rows are the parent's, since the child's rows go with it.
    An instance deleted by ``Host.delete`` purges its rows, undelivered ones included.
    """
    e = load(h, u, iid)
    if e is None:
        return
    parent = u.entries.get(e.parent) if e.parent is not None else None
    keeper = e.parent if parent is not None and not parent.deleted and parent.position is not None else None
    _delete(h, u, iid, e, keeper)


def _delete(h: Host, u: Unit, iid: str, e: Entry, keeper: str | None) -> None:
    if e.position is not None:
        for inv in e.position.invocations:
            cid = child_instance_id(iid, inv.invokeid)
            child = load(h, u, cid)
            if child is not None:
                _delete(h, u, cid, child, keeper)
        if keeper is not None:
            h._outbox.cancel_ended(u, iid, keeper)
    for key in [k for k in u.puts if k[0] == iid]:
        del u.puts[key]
    e.deleted = True
    u.queue = deque(q for q in u.queue if q[0] != iid)
