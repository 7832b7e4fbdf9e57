"""Executable content, data initialisation, invocations and named timeouts.

These are the parts of Appendix D that the pseudo-code leaves to "executeContent",
"initializeDataModel", "invoke", "cancelInvoke", "applyFinalize" and "returnDoneEvent".
Everything that leaves the session becomes an effect; nothing here performs I/O.
"""

from __future__ import annotations

from sys import getsizeof
from typing import Any

from ..chart.compiler import MAX_DELAY_MS, parse_duration, parse_instant
from ..chart.model import (INVOKE_SCXML_TYPES, CancelAction, DoneData, Foreach, InvokeSpec, Param, SendAction,
                           StateNode, TimeoutSpec)
from ..datamodel.base import check_serializable
from ..datamodel.budget import ITEM_BYTES
from ..effects import Autoforward, Cancel, CancelInvoke, Done, Invoke, Log, Send, SendDelayed
from ..events import BASICHTTP_PROCESSOR, SCXML_PROCESSOR, Event
from ..exceptions import EvaluationError
from .state import ArmedTimeout, Invocation

__all__ = ["ContentMixin", "SCXML_TYPES", "INVOKE_SCXML_TYPES"]

#: Spellings of the SCXML event I/O processor type accepted on ``<send type>``.
SCXML_TYPES = frozenset({SCXML_PROCESSOR, "scxml", "http://www.w3.org/TR/scxml/#SCXMLEventProcessor/"})
_BASICHTTP_TYPES = frozenset({BASICHTTP_PROCESSOR, "basichttp"})


def _copy(value: Any) -> Any:
    """A private copy of a compile-time constant, so the datamodel never aliases the chart."""
    return _copied(value)[0]


def _copied(value: Any) -> tuple[Any, int]:
    """:func:`_copy` of ``value``, and about how many bytes the copy stands for.

    Only the lists and dicts are new: strings and numbers cannot change, so the copy shares
    them with the chart (one ``<send>`` of a 7 MB inline ``<content>`` in a loop made a 7 MB
    copy a round). The bytes count the shared strings all the same: a host writes each
    event and effect out whole. A loop, not recursion: nesting is the chart's to choose.
    """
    t = type(value)
    if t is not list and t is not dict:
        return value, len(value) if t is str else 0
    top = list(value) if t is list else dict(value)
    size = getsizeof(top)
    todo = [top]
    while todo:
        c = todo.pop()
        for k, v in (c.items() if type(c) is dict else enumerate(c)):
            tv = type(v)
            if tv is list or tv is dict:
                v = c[k] = list(v) if tv is list else dict(v)
                size += getsizeof(v)
                todo.append(v)
            elif tv is str:
                size += len(v)
            if type(k) is str:
                size += len(k)
    return top, size


#: Ticks between two checks of the budget's clock.
_TICKS = 16
_NO_LIMIT = 1 << 62


class ContentMixin:
    """Executable content for :class:`~statebound.interpreter.algorithm.Machine`."""

    __slots__ = ("budget", "max_items", "new_budget", "ticks")

    # attributes provided by Machine (declared for type checkers)
    chart: Any
    states: Any
    ctx: Any
    config: set[int]
    internal: Any
    effects: list[Any]
    running: bool
    prog: Any
    _stamp: Any
    budget: Any
    max_items: int
    new_budget: Any
    ticks: int

    # ------------------------------------------------------------------ the budget
    def init_budget(self, budget: Any, new_budget: Any, max_items: int | None) -> None:
        """Set the budget slots: ``new_budget`` makes the drive's own budget at its first
        check when it has none; a given budget's own item cap replaces ``max_items``."""
        self.budget = budget
        self.new_budget = new_budget
        self.ticks = _TICKS  # work left before the next read of the budget's clock
        if budget is not None:
            max_items = budget.max_items
        self.max_items = _NO_LIMIT if max_items is None else max_items

    def tick(self) -> None:
        """A unit of work was done: read the budget's clock once every few (it costs a syscall)."""
        self.ticks -= 1
        if self.ticks <= 0:
            self.tock()

    def tock(self) -> None:
        """Check the budget now; ``BudgetSpent`` if it has run out.

        A drive given no budget makes its own here, at its first check (``new_budget``):
        its clock would start at that check anyway, and most drives never reach one.
        """
        self.ticks = _TICKS
        budget = self.budget
        if budget is None:
            if self.new_budget is None:
                return
            budget = self.budget = self.new_budget(None)
        budget.check()

    def check_items(self) -> None:
        """Spend a tick, and bound the events and effects this drive holds (its memory budget).

        Called per microstep and per ``<foreach>`` iteration: between two calls one block of
        executable content runs, and the chart's element limit bounds how much it can queue.
        """
        self.ticks -= 1
        if self.ticks <= 0:
            self.tock()
        if len(self.internal) + len(self.effects) > self.max_items:
            if self.budget is None and self.new_budget is not None:
                self.budget = self.new_budget(None)
            if self.budget is not None:
                self.budget.check_items(len(self.internal) + len(self.effects))

    def charge(self, nbytes: int) -> None:
        """Count ``nbytes`` an event or effect of this drive holds against its memory budget.

        Each is reckoned at ``ITEM_BYTES`` already (:meth:`check_items`): only what is larger
        is counted again, so the common small one costs a comparison.
        """
        if nbytes <= ITEM_BYTES:
            return
        if self.budget is None:
            if self.new_budget is None:
                return
            self.budget = self.new_budget(None)
        self.budget.charge(nbytes)

    # ------------------------------------------------------------------ helpers
    def stamp(self) -> dict[str, int]:
        """The ``macrostep``/``microstep``/``round`` every effect carries, as keyword arguments."""
        key = (self.microstep_no, self.round_no)  # type: ignore[attr-defined]
        cached = self._stamp
        if cached is not None and cached[0] == key:
            return cached[1]
        d = {"macrostep": self.macrostep_no, "microstep": key[0], "round": key[1]}  # type: ignore[attr-defined]
        self._stamp = (key, d)
        return d

    def raise_error(self, name: str, message: str, sendid: str | None = None) -> None:
        """Place ``error.execution``/``error.communication`` on the internal queue.

        A ``Log`` effect labelled with the error's name goes with it: a chart that has no
        transition for the error would otherwise drop it without a trace in any log.
        """
        self.internal.append(Event(name, {"message": message}, "platform", sendid))
        self.effects.append(Log(label=name, value=message, **self.stamp()))
        self.charge(len(message))  # (one string, held by both)

    def condition_match(self, t: Any, cond: Any = None) -> bool:
        """``conditionMatch``: a failing condition is false and raises ``error.execution``.

        :param cond: ``t``'s compiled condition, when the caller has it at hand.
        """
        try:
            return (self.prog.cond[t.index] if cond is None else cond)(self.ctx)
        except EvaluationError as exc:
            self.raise_error("error.execution", str(exc))
            return False

    def execute_content(self, block: tuple[Any, ...], owner: int) -> None:
        """``executeContent``: run a compiled block; the first error aborts the rest of the block."""
        try:
            for run in block:
                self.ticks -= 1  # the budget, inline: this is the hottest loop in a drive
                if self.ticks <= 0:
                    self.tock()
                run(self, owner)
        except EvaluationError as exc:
            self.raise_error("error.execution", str(exc), getattr(exc, "sendid", None))
        except RecursionError:
            # Nested <if>/<foreach> recurse once a level on the caller's stack: from a caller
            # already deep, a chart within the nesting cap can still reach Python's limit.
            # Unwound to here, the stack is the block's again (the datamodels leave nothing
            # half-done on a RecursionError: see EcmaScriptContext._runtime).
            self.raise_error("error.execution", "the content nests too deep for the stack left to this call")

    def foreach(self, a: Foreach, body: tuple[Any, ...], owner: int) -> None:
        """``<foreach>`` over a shallow copy of the array; a failing child stops it all."""
        ctx = self.ctx
        seq = ctx.evaluate(a.array)
        if isinstance(seq, (dict, str, bytes)) or not hasattr(seq, "__iter__"):
            raise EvaluationError(f"<foreach array={_quote(a.array.src)}> is not an array")
        if isinstance(seq, (set, frozenset)):
            # a set's order is its hashes', which differ between processes: the same drive
            # would store a different position in each
            raise EvaluationError(f"<foreach array={_quote(a.array.src)}> is a set, whose order differs between "
                                  "processes; iterate a list (sorted(...), for one)")
        items = list(seq)  # iterate a shallow copy: the body may change the array
        for loc in (a.item, a.index):
            if loc is not None and not ctx.valid_location(loc):
                raise EvaluationError(f"<foreach> {_quote(loc.src)} is not a valid variable name")
        for loc in (a.item, a.index):
            # only a plain name is declared: a path (``a.b``) became a variable of that very
            # name, stored beside the error its assignment then raised
            if loc is not None and not ctx.is_declared(loc) and loc.src.strip().replace("$", "_").isidentifier():
                ctx.declare(loc.src.strip(), None)
        for i, v in enumerate(items):
            self.check_items()
            ctx.assign(a.item, v)
            if a.index is not None:
                ctx.assign(a.index, i)
            for run in body:
                self.ticks -= 1
                if self.ticks <= 0:
                    self.tock()
                run(self, owner)

    # ------------------------------------------------------------------ data
    def declare_unbound(self, name: str) -> None:
        """Create a variable with no value yet (late binding, or after a failed ``<data>``)."""
        try:
            self.ctx.declare(name, None)
        except EvaluationError:
            pass

    def initialize_data(self, node: StateNode) -> None:
        """``initializeDataModel`` for one state's ``<data>`` (start data overrides declarations)."""
        overrides = getattr(self, "start_data", None) or {}
        for d in node.data:
            try:
                if d.id in overrides:
                    value = overrides[d.id]
                elif d.expr is not None:
                    value = self.ctx.evaluate(d.expr)
                elif d.has_value:
                    if isinstance(d.value, tuple) and d.value and d.value[0] == "error":
                        raise EvaluationError(d.value[1])
                    value = _copy(d.value)
                else:
                    value = None
                check_serializable(value, f"<data id={d.id!r}>")
                self.ctx.declare(d.id, value)
            except EvaluationError as exc:
                self.declare_unbound(d.id)
                self.raise_error("error.execution", str(exc))

    # ------------------------------------------------------------------ send / cancel
    def _params(self, namelist: tuple[Any, ...], params: tuple[Param, ...]) -> dict[str, Any]:
        ctx = self.ctx
        out: dict[str, Any] = {}
        for loc in namelist:
            out[loc.src.strip()] = ctx.evaluate(loc)
        for p in params:
            if p.expr is not None:
                out[p.name] = ctx.evaluate(p.expr)
            elif p.location is not None:
                out[p.name] = ctx.evaluate(p.location)
        return out

    def _content(self, content: Any) -> Any:
        if content is None:
            return None
        if content[0] == "expr":
            return self.ctx.evaluate(content[1])
        value, size = _copied(content[1])
        self.charge(size)
        return value

    def send(self, a: SendAction, owner: int) -> None:
        """``<send>``: evaluate everything, then emit ``Send``/``SendDelayed`` or enqueue."""
        ctx = self.ctx
        m = self  # the Machine
        if a.id is not None:
            send_id, from_author = a.id, True
        else:
            m.send_counter += 1  # type: ignore[attr-defined]
            send_id, from_author = f"send.{m.send_counter}", False  # type: ignore[attr-defined]
            if a.idlocation is not None:
                ctx.assign(a.idlocation, send_id)
        try:
            event = a.event if a.eventexpr is None else ctx.evaluate_text(a.eventexpr)
            target = a.target if a.targetexpr is None else ctx.evaluate(a.targetexpr)
            typ = a.type if a.typeexpr is None else ctx.evaluate(a.typeexpr)
            delay: int | None
            if a.delayexpr is not None:
                delay = _delay_ms(ctx.evaluate(a.delayexpr), "<send delayexpr>")
            else:
                delay = parse_duration(a.delay) if a.delay else 0
            if a.content is not None:
                data = self._content(a.content)
            elif a.namelist or a.params:
                data = self._params(a.namelist, a.params)
            else:
                data = None
            _check_storable(data, "send data")
            # a store keeps a delayed (or not yet delivered) event as UTF-8: a lone surrogate
            # failed the whole host call there, on every attempt, instead of this <send>
            if event is not None and not _text(event):
                raise EvaluationError("<send> event names must be text a store can hold (no lone surrogates)")
        except EvaluationError as exc:
            exc.sendid = send_id  # type: ignore[attr-defined]
            raise
        if target is not None and not isinstance(target, str):
            raise _with_id(EvaluationError(f"<send> target {target!r} is not a string"), send_id)
        typ = SCXML_PROCESSOR if typ in (None, "") else str(typ)
        iop = getattr(self, "ioprocessors", None) or {}
        if typ in _BASICHTTP_TYPES and (BASICHTTP_PROCESSOR in iop or "basichttp" in iop):
            typ = BASICHTTP_PROCESSOR
        elif typ in SCXML_TYPES:
            typ = SCXML_PROCESSOR
        elif typ not in iop or typ in _BASICHTTP_TYPES:
            offered = sorted({"scxml", *(k for k in iop if "://" not in k)})
            raise _with_id(EvaluationError(
                f"<send type={typ!r}> names no event I/O processor this host offers ({', '.join(offered)}); "
                f"a host sends it once given one: Host(processors={{{typ!r}: ...}})"), send_id)
        # else: a host send processor; the host writes it to its outbox
        stamp = self.stamp()
        origin = f"#_scxml_{m.session_id}"  # type: ignore[attr-defined]
        name = event or ""
        if not name and typ == SCXML_PROCESSOR:
            # no session takes an event without a name: as a row, it failed at its fire, after
            # the chart could have heard of it
            raise _with_id(EvaluationError("<send> to an SCXML session needs a non-empty event name"), send_id)
        if typ == BASICHTTP_PROCESSOR and not target:
            self.raise_error("error.communication", "a Basic HTTP <send> needs a target URL", send_id)
            return
        if typ == SCXML_PROCESSOR:
            if target == "#_internal":
                self.internal.append(Event(name, data, "external", send_id if from_author else None,
                                           origin, SCXML_PROCESSOR))
                return
            if target == f"#_scxml_{m.session_id}":  # type: ignore[attr-defined]
                target = None
            if target is not None:
                reachable = self._reachable(target)
                if reachable is None:
                    raise _with_id(EvaluationError(f"<send target={target!r}> is not a valid SCXML target"),
                                   send_id)
                if not reachable:
                    self.raise_error("error.communication", f"target {target!r} is unreachable", send_id)
                    return
        if delay and delay > 0:
            m.ordinal += 1  # type: ignore[attr-defined]
            self.effects.append(SendDelayed(
                event=name, target=target, type=typ, data=data, send_id=send_id, delay_ms=delay, c_index=a.c_index,
                owner=owner, ordinal=m.ordinal, id_from_author=from_author, origin=origin,  # type: ignore[attr-defined]
                caller_context=m.caller_context, **stamp))  # type: ignore[attr-defined, arg-type]
        else:
            self.effects.append(Send(event=name, target=target, type=typ, data=data, send_id=send_id,
                                     c_index=a.c_index, owner=owner, origin=origin, id_from_author=from_author,
                                     caller_context=m.caller_context, **stamp))  # type: ignore[attr-defined]

    def _reachable(self, target: str) -> bool | None:
        """True/False for a syntactically valid SCXML target, ``None`` for an invalid one."""
        m = self
        if target == "#_parent":
            return m.parent is not None  # type: ignore[attr-defined]
        if target.startswith("#_scxml_"):
            routes = m.routes  # type: ignore[attr-defined]
            return True if routes is None else bool(routes(target[8:]))
        if target.startswith("#_"):
            inv = target[2:]
            return any(i.invokeid == inv for i in m.invocations)  # type: ignore[attr-defined]
        return None

    def cancel(self, a: CancelAction, owner: int) -> None:
        """``<cancel>``: a ``Cancel`` effect (the host deletes matching rows; no match is fine)."""
        send_id = a.sendid if a.sendidexpr is None else self.ctx.evaluate_text(a.sendidexpr)
        m = self
        m.ordinal += 1  # type: ignore[attr-defined]
        self.effects.append(Cancel(send_id=str(send_id), c_index=a.c_index, owner=owner,
                                   ordinal=m.ordinal, caller_context=m.caller_context,  # type: ignore[attr-defined]
                                   **self.stamp()))

    # ------------------------------------------------------------------ invoke
    def invoke(self, spec: InvokeSpec, k: int) -> None:
        """``invoke``: evaluate the ``<invoke>`` and emit an ``Invoke`` effect."""
        m = self
        ctx = self.ctx
        node = self.states[spec.state]
        if spec.id is not None:
            invokeid = spec.id
        else:
            m.invoke_counter += 1  # type: ignore[attr-defined]
            invokeid = f"{node.id}.inv{m.invoke_counter}"  # type: ignore[attr-defined]
        try:
            if spec.idlocation is not None:
                ctx.assign(spec.idlocation, invokeid)
            typ = spec.type if spec.typeexpr is None else ctx.evaluate(spec.typeexpr)
            handler = typ not in (None, "") and typ not in INVOKE_SCXML_TYPES
            if handler and typ not in (getattr(self, "invokers", None) or ()):
                raise EvaluationError(
                    f"<invoke type={typ!r}> names no invoke handler this host serves (it runs SCXML "
                    f"children itself); a host starts it once given one: Host(invokers={{{typ!r}: ...}})")
            src = spec.src if spec.srcexpr is None else ctx.evaluate_text(spec.srcexpr)
            data = self._params(spec.namelist, spec.params)
            content = self._content(spec.content) if spec.content is not None else None
            _check_storable(data, "invoke data")
            if handler:
                _check_storable(content, "invoke content")
        except EvaluationError as exc:
            self.raise_error("error.execution", str(exc))
            return
        if not handler and content is not None and not isinstance(content, str):
            self.raise_error("error.execution", "<invoke> content must be an SCXML document")
            return
        m.invocations.append(Invocation(invokeid, spec.state, k, spec.autoforward))  # type: ignore[attr-defined]
        if handler:
            # a host invoke handler: src and content are the handler's input, never a chart
            self.effects.append(Invoke(invokeid=invokeid, type=str(typ), chart=None, src=src, content=content,
                                       data=data, autoforward=spec.autoforward, state=node.id,
                                       c_index=spec.c_index, **self.stamp()))
            return
        self.effects.append(Invoke(invokeid=invokeid, type="http://www.w3.org/TR/scxml/", chart=spec.chart,
                                   src=None if spec.chart is not None else src, content=content, data=data,
                                   autoforward=spec.autoforward, state=node.id, c_index=spec.c_index,
                                   **self.stamp()))

    def cancel_invokes(self, s: int) -> None:
        """``cancelInvoke`` for every active invocation owned by state ``s``."""
        m = self
        keep = []
        for inv in m.invocations:  # type: ignore[attr-defined]
            if inv.state == s:
                self.effects.append(CancelInvoke(invokeid=inv.invokeid, **self.stamp()))
            else:
                keep.append(inv)
        m.invocations[:] = keep  # type: ignore[attr-defined]

    def emit_autoforward(self, inv: Invocation, event: Event) -> None:
        """Ask the host to forward an external event to an ``autoforward`` child."""
        self.effects.append(Autoforward(invokeid=inv.invokeid, event=event, **self.stamp()))

    # ------------------------------------------------------------------ done
    def done_data(self, node: StateNode) -> Any:
        """Evaluate a final state's ``<donedata>``; errors raise ``error.execution`` and give ``None``."""
        dd: DoneData | None = node.donedata
        if dd is None:
            return None
        try:
            data = self._content(dd.content) if dd.content is not None else self._params((), dd.params)
            # done data travels like a send's: to the parent, into rows when the call keeps
            # the event for later; a value no store can hold failed the parent's call there
            _check_storable(data, "donedata")
            return data
        except EvaluationError as exc:
            self.raise_error("error.execution", str(exc))
            return None

    def emit_done(self, node: StateNode) -> None:
        """``returnDoneEvent``: the session reached a top-level final state."""
        self.effects.append(Done(donedata=self.done_data(node), **self.stamp()))

    # ------------------------------------------------------------------ named timeouts
    def _deadline(self, spec: TimeoutSpec) -> tuple[int | None, int | None]:
        """``(delay_ms, at_ms)`` for a timeout spec; raises ``EvaluationError``."""
        if spec.kind == "after":
            return spec.duration_ms, None
        if spec.kind == "at":
            return None, spec.at_ms
        v = self.ctx.evaluate(spec.expr)
        if spec.kind == "afterexpr":
            return _delay_ms(v, "<sb:timeout afterexpr>"), None
        at = (int(v) if v == v and -MAX_DELAY_MS <= v <= MAX_DELAY_MS else None) \
            if isinstance(v, (int, float)) and not isinstance(v, bool) else \
            (parse_instant(v) if isinstance(v, str) else None)
        if at is None:  # (NaN, infinity and absurd numbers too: int() of them raised bare errors)
            raise EvaluationError(f"<sb:timeout atexpr> gave {v!r}, not epoch ms or an ISO-8601 instant")
        return None, at

    def arm_timeout(self, spec: TimeoutSpec, delay: int | None, at: int | None,
                    replacing: ArmedTimeout | None = None) -> None:
        """Emit the next generation of ``spec`` (after a ``Cancel`` of ``replacing``, if given).

        The payload is evaluated and checked first, so an ``EvaluationError`` leaves no
        effect behind (in particular no ``Cancel`` without its replacement).
        """
        m = self
        data = None
        if spec.data is not None:
            data = self.ctx.evaluate(spec.data)
        elif spec.namelist:
            data = self._params(spec.namelist, ())
        _check_storable(data, "<sb:timeout> data")
        node = self.states[spec.state]
        send_id = f"sb.timeout.{node.id}.{spec.name}"
        if replacing is not None:
            m.ordinal += 1  # type: ignore[attr-defined]
            self.effects.append(Cancel(send_id=replacing.send_id, c_index=None, owner=replacing.state,
                                       ordinal=m.ordinal, caller_context=m.caller_context,  # type: ignore[attr-defined]
                                       **self.stamp()))
        m.ordinal += 1  # type: ignore[attr-defined]
        self.effects.append(SendDelayed(
            event=spec.event, target=None, type=SCXML_PROCESSOR, data=data, send_id=send_id, delay_ms=delay,
            at_ms=at, c_index=spec.c_index, owner=spec.state, ordinal=m.ordinal,  # type: ignore[attr-defined]
            # delivered with this sendid, so a stay can tell which of two same-event timers fired
            id_from_author=True, origin=f"#_scxml_{m.session_id}", name=spec.name,  # type: ignore[attr-defined]
            caller_context=m.caller_context, **self.stamp()))  # type: ignore[attr-defined]
        m.timeouts[(spec.state, spec.name)] = ArmedTimeout(spec.state, spec.name, m.ordinal,  # type: ignore[attr-defined]
                                                           send_id, at)

    def arm_timeouts(self, node: StateNode) -> None:
        """Entering a state arms every timeout it declares."""
        for spec in node.timeouts:
            try:
                delay, at = self._deadline(spec)
                self.arm_timeout(spec, delay, at)
            except EvaluationError as exc:
                self.raise_error("error.execution", str(exc))

    def cancel_timeouts(self, s: int) -> None:
        """Exiting a state cancels every name it declared."""
        m = self
        for key in [k for k in m.timeouts if k[0] == s]:  # type: ignore[attr-defined]
            armed = m.timeouts.pop(key)  # type: ignore[attr-defined]
            m.ordinal += 1  # type: ignore[attr-defined]
            self.effects.append(Cancel(send_id=armed.send_id, c_index=None, owner=s, ordinal=m.ordinal,  # type: ignore[attr-defined]
                                       caller_context=m.caller_context, **self.stamp()))  # type: ignore[attr-defined]

    def rearm_stays(self, enabled: list[Any]) -> None:
        """A stay re-arms the timer whose event triggered it, and an ``atexpr`` that moved."""
        m = self
        trigger = m.current_event  # type: ignore[attr-defined]
        sendid = m.current_sendid  # type: ignore[attr-defined]
        # A timeout's own row arrives with its send id: then exactly that timer is "the one
        # whose event triggered the stay", even when another timer shares the event name.
        by_row = sendid is not None and sendid.startswith("sb.timeout.")
        for (s, name), armed in list(m.timeouts.items()):  # type: ignore[attr-defined]
            if s not in self.config or armed.ordinal > m.ordinal_at_microstep:  # type: ignore[attr-defined]
                continue  # exited, or armed by this very microstep
            spec = next(t for t in self.states[s].timeouts if t.name == name)
            triggered = trigger is not None and trigger == spec.event and any(t.events for t in enabled) \
                and (not by_row or armed.send_id == sendid)
            if not triggered and spec.kind != "atexpr":
                continue
            try:
                delay, at = self._deadline(spec)
                # an absolute deadline that did not move is left alone, even when its own event
                # triggered the stay: once the instant has passed, a new row would fire at once, forever
                if at is not None and at == armed.at_ms:
                    continue
                self.arm_timeout(spec, delay, at, replacing=armed)
            except EvaluationError as exc:
                self.raise_error("error.execution", str(exc))


def _check_storable(value: Any, what: str) -> None:
    """Raise :class:`EvaluationError` unless every store can hold ``value`` (as UTF-8 text too)."""
    check_serializable(value, what)
    if type(value) is str and not _text(value):
        raise EvaluationError(f"{what} must be text a store can hold (no lone surrogates)")


def _text(s: str) -> bool:
    """Whether ``s`` encodes as UTF-8 (what every store writes), lone surrogates being the exception."""
    if s.isascii():
        return True
    try:
        s.encode()
    except UnicodeEncodeError:
        return False
    return True


def _delay_ms(value: Any, what: str) -> int:
    """A delay from an expression: ms as a number, or a duration string like ``'5s'``.

    Anything else (NaN, infinity, a negative or absurd number, ``'soon'``) is an
    ``EvaluationError``, which the caller turns into ``error.execution`` as the spec says.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        ms: int | None = int(value) if value == value and 0 <= value <= MAX_DELAY_MS else None
    else:
        ms = parse_duration(str(value))  # None past MAX_DELAY_MS too
    if ms is None:
        raise EvaluationError(f"{what} gave {value!r}, not a duration like '5s' or a number of ms >= 0")
    return ms


def _quote(src: str) -> str:
    """``src`` as an error message shows it: cut after 200 characters, as the datamodels cut
    theirs (each failing ``<foreach>`` puts its message in an event and a log)."""
    return repr(src) if len(src) <= 200 else repr(src[:200]) + "…"


def _with_id(exc: EvaluationError, send_id: str) -> EvaluationError:
    exc.sendid = send_id  # type: ignore[attr-defined]
    return exc
