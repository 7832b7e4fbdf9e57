"""The ecmascript datamodel prepared for a chart, and one drive's context over a shared realm."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import quickjs

from ...chart.model import Assign, Chart, Expr, Foreach, If, Script
from ...exceptions import EvaluationError, SerializationError
from ..base import MAX_NESTING, SYSTEM_VARIABLES, check_stored, too_deep
from ..budget import Budget
from .limits import Limits, get_limits
from .realm import Realm, acquire
from .values import _SAFE_INT, DataJSValue, JSValue, dumps, loads, plain, unstorable, xml_tree

__all__ = ["EcmaScriptDatamodel", "EcmaScriptContext"]

_NOTHING = object()
_ROOT = re.compile(r"^\s*\(*\s*([A-Za-z_$][\w$]*)")
_IN_WORD = re.compile(r"\bIn\b")
_IN_LITERAL = re.compile(r"\bIn\s*\(\s*(?:'([^'\\]*)'|\"([^\"\\]*)\")\s*\)")
_DEFINES_FUNCTION = re.compile(r"\bfunction\b|=>|\bclass\b")
_FUNCTION_LITERAL = re.compile(r"^\s*(?:async\s+)?(?:function\b|[A-Za-z_$][\w$]*\s*=>|\([^()]*\)\s*=>)")
_INT32 = 2 ** 31
#: Calls into JS that may skip reading the budget's clock in a row (see _invoke).
_UNCHECKED = 16


def _strip(src: str) -> str:
    s = src.strip()
    while s.endswith(";"):
        s = s[:-1].rstrip()
    return s


def _walk_actions(block: Any) -> Any:
    for a in block or ():
        yield a
        if isinstance(a, If):
            for _, acts in a.branches:
                yield from _walk_actions(acts)
        elif isinstance(a, Foreach):
            yield from _walk_actions(a.actions)


#: _refused_name's answers for short names (a chart makes up its globals' names: long ones,
#: or too many, are not kept).
_NAMES: dict[str, str | None] = {}


def _refused_name(name: str) -> str | None:
    """Why ``Position.from_bytes`` would refuse a variable named ``name`` (``None``: it would not).

    Asked of :func:`~statebound.datamodel.base.check_stored` itself, so that no variable is
    ever committed under a name the next load refuses (``""``, ``"__tmp"``).
    """
    try:
        return _NAMES[name]
    except KeyError:
        pass
    why = check_stored("ecmascript", {name: None})
    if len(name) <= 64:
        if len(_NAMES) >= 4096:
            _NAMES.clear()
        _NAMES[name] = why
    return why


#: How much of an expression's source an error message quotes. A chart's expression may be
#: megabytes long, and each failing evaluation's message goes into an event and a log: quoted
#: whole, one that fails in a loop filled gigabytes in a single host call.
QUOTE_CHARS = 200


def _quote(src: str) -> str:
    """``src`` as an error message shows it: its repr, cut after :data:`QUOTE_CHARS` characters."""
    return repr(src) if len(src) <= QUOTE_CHARS else repr(src[:QUOTE_CHARS]) + "…"


def _failure(r: Any) -> str:
    """The message of a failed call: the realm tags it ``"\x01e"``."""
    return r[2:] if isinstance(r, str) and r[:2] == "\x01e" else str(r)


#: What one object or array costs in the QuickJS heap beyond its JSON text, about (the
#: object, its shape or element storage, the slot that holds it: 104 bytes for an empty
#: array and 120 for an empty object, measured with quickjs-ng, rounded up).
OBJECT_BYTES = 128


def loaded_size(text: str) -> int:
    """About what the variables dumped as ``text`` take in the heap once loaded. Not the
    text's length: a drive can store one array under ten thousand names (``fill({})``), which
    is three bytes of JSON a slot and, loaded, ten thousand objects. Counted at that size at
    the commit, a value that committed loads again under the same cap."""
    return len(text) + OBJECT_BYTES * (text.count("[") + text.count("{"))


def _brackets() -> str:
    """64 opening brackets, each ``(`` or ``[`` at random, to compile a source inside first: one
    that is not a balanced expression cannot close what it cannot know (see the prelude's
    ``compile``). Fresh for every compile; the interpreter's results never depend on it."""
    bits = int.from_bytes(os.urandom(8), "big")
    return "".join("(["[(bits >> i) & 1] for i in range(64))


class EcmaScriptDatamodel:
    """The ecmascript datamodel prepared for one chart: what can be known before any drive."""

    name = "ecmascript"

    def __init__(self, chart: Chart) -> None:
        self.chart = chart
        exprs = chart.expressions
        n = len(exprs)
        self.failed: dict[tuple[str, int], str] = {}
        #: the source each expression is compiled from
        self.src = [_strip(e.src) for e in exprs]
        self._iop: dict[str, tuple[dict[str, Any], str]] = {}
        #: kind -> expression id -> (the realm's serial, the key it compiled the expression under)
        self.compiled: dict[str, list[Any]] = {k: [None] * n for k in ("expr", "cond", "set")}
        self.roots: list[str | None] = [None] * n
        self.state_ids = tuple(s.id for s in chart.states[1:])
        self.top_children = tuple(chart.states[c].id for c in chart.states[0].children)
        # In(): which state ids an expression needs to know about (None: it does not use In)
        full = any(_IN_WORD.search(e.src) and (e.kind == "script" or _DEFINES_FUNCTION.search(e.src))
                   for e in exprs)
        self.in_ids: list[Any] = [None] * n
        for e in exprs:
            if e.kind == "location":
                m = _ROOT.match(e.src)
                self.roots[e.id] = m.group(1) if m else None
            if not _IN_WORD.search(e.src):
                continue
            lits = [a or b for a, b in _IN_LITERAL.findall(e.src)]
            if len(lits) != len(_IN_WORD.findall(e.src)):
                self.in_ids[e.id] = True
            else:
                self.in_ids[e.id] = tuple(dict.fromkeys(lits))
        if full:  # a function may call In(): every evaluation needs the configuration
            self.in_ids = [True] * n
        self.full_in = full
        self.top_scripts = tuple(a.code for a in chart.script if isinstance(a, Script))
        self.top_script_ids = frozenset(e.id for e in self.top_scripts)
        root = chart.states[0]
        #: root <data expr="function..."> (code re-created on load)
        self.function_data = tuple((d.id, d.expr) for d in root.data
                                   if d.expr is not None and _FUNCTION_LITERAL.match(d.expr.src))
        self.function_data_ids = frozenset(i for i, _ in self.function_data)
        self.data_expr_ids = frozenset(d.expr.id for s in chart.states for d in s.data if d.expr is not None)
        self.has_top_code = bool(self.top_scripts or self.function_data)
        # XML content: <data> bodies/src and inline <assign> content that are XML documents
        self.xml_data: dict[str, str] = {}
        for s in chart.states:
            for d in s.data:
                if d.expr is None and d.has_value and xml_tree(d.value) is not None:
                    self.xml_data[d.id] = d.value
        self.xml_assign: dict[int, str] = {}
        blocks: list[Any] = [chart.script]
        for s in chart.states:
            blocks.extend(s.onentry)
            blocks.extend(s.onexit)
            blocks.extend(t.content for t in s.transitions)
            if s.initial is not None:
                blocks.append(s.initial.content)
            blocks.extend(i.finalize for i in s.invokes)
        for b in blocks:
            for a in _walk_actions(b):
                if isinstance(a, Assign) and a.expr is None and xml_tree(a.value) is not None:
                    self.xml_assign[a.location.id] = a.value

    def iop_text(self, session_id: str, ioprocessors: Mapping[str, Any] | None) -> str:
        """``_ioprocessors`` as the JSON the realm builds it from (kept per session: it rarely changes)."""
        iop = dict(ioprocessors or {})
        hit = self._iop.get(session_id)
        if hit is not None and hit[0] == iop:
            return hit[1]
        if len(self._iop) >= 1024:
            self._iop.clear()
        text = self._iop[session_id] = (iop, dumps(iop)[0])
        return text[1]

    @property
    def limits(self) -> Limits:
        """The limits in force for this chart (see :func:`set_limits`)."""
        return get_limits(self.chart)

    def open(self, variables: dict[str, Any], session_id: str, name: str,
             ioprocessors: Mapping[str, Any], in_state: Callable[[str], bool],
             budget: Budget | None = None) -> EcmaScriptContext:
        """Open a drive's context. It borrows its thread's realm on first use."""
        return EcmaScriptContext(self, variables, session_id, name, ioprocessors, in_state, budget)


class EcmaScriptContext:
    """One drive's view of its thread's QuickJS realm. See :class:`statebound.datamodel.base.Context`.

    The realm is borrowed when the drive first needs it and stays this context's until the
    context is gone; ``begin`` installs the session's variables in the freshly wiped realm.
    """

    __slots__ = (
        "__weakref__",
        "bad_names",
        "broken",
        "budget",
        "call",
        "cap",
        "dm",
        "dump_cache",
        "in_state",
        "ioprocessors",
        "js",
        "last",
        "limits",
        "name",
        "pending_event",
        "realm",
        "serial",
        "session_id",
        "short",
        "started",
        "unchecked",
        "vars",
    )

    def __init__(self, dm: EcmaScriptDatamodel, variables: dict[str, Any], session_id: str, name: str,
                 ioprocessors: Mapping[str, Any], in_state: Callable[[str], bool],
                 budget: Budget | None = None) -> None:
        self.dm = dm
        self.budget = budget
        self.short = False  # the runtime's time limit is below the cap (the budget is nearly spent)
        # After a dump failed as a whole: the names that failed on their own, and why. They are
        # not read again this drive (a looping getter costs a whole time slice per read).
        self.bad_names: dict[str, str] | None = None
        self.vars = variables
        self.session_id = session_id
        self.name = name
        self.ioprocessors = ioprocessors
        self.in_state = in_state
        self.js: Any = None
        self.call: Any = None
        self.realm: Realm | None = None
        self.serial = -1
        self.pending_event: Any = _NOTHING
        self.last: Any = _NOTHING
        self.dump_cache: dict[str, Any] | None = None
        self.limits = dm.limits
        self.cap = self.limits.time_ms / 1000.0
        self.unchecked = 0  # calls into JS that may skip the budget's clock (see _invoke)
        self.broken: str | None = None
        # A running position always has a child of the root active; the seed of start() has none.
        # (Checked now: once the drive runs, the configuration can be empty mid-transition.)
        self.started = dm.has_top_code and any(in_state(s) for s in dm.top_children)

    # ------------------------------------------------------------------ the runtime
    def _runtime(self) -> Any:
        if self.call is None:
            if self.broken is not None:
                raise EvaluationError(self.broken)
            try:
                self._materialize()
            except EvaluationError as exc:
                # nothing was changed: the stored variables stay as they are
                self.call = self.js = self.realm = None
                self.broken = str(exc)
                raise
            except BaseException:
                # A RecursionError (a caller deep in its stack) may stop the load half-way, with
                # the realm lent but the variables not installed: the drive goes on (the
                # interpreter makes it error.execution), and must not read that realm as loaded.
                self._release()
                raise
        self.dump_cache = None
        if self.pending_event is not _NOTHING:
            self._send_event(self.pending_event)  # one that fails stays pending: every read fails alike
            self.pending_event = _NOTHING
        return self.call

    def _release(self) -> None:
        """Give the realm back unused (the next call loads the variables into a wiped one)."""
        realm = self.realm
        if realm is not None and realm.owner is not None and realm.owner() is self:
            realm.owner = None
        self.call = self.js = self.realm = None
        self.serial = -1

    def _invoke(self, *args: Any) -> Any:
        """Call into JS on the drive's budget (issue 10: the time cap alone was per evaluation).

        The QuickJS time limit is set to what is left of the drive's CPU budget when that is
        less than the per-evaluation cap; an interruption is then the budget's, and ends the
        drive (``BudgetSpent``) instead of becoming ``error.execution``.

        Reading the clock costs more than many calls: after a read that left room for ``k + 2``
        caps, the next ``k`` calls (at most one cap each) skip it. Only Python work of more than
        two caps between two calls (which the interpreter's own budget checks stop) could then
        let one call run to its cap past the budget.
        """
        budget = self.budget
        if budget is not None:
            if self.unchecked > 0:
                self.unchecked -= 1
            else:
                left = budget.remaining_s()  # raises BudgetSpent when nothing is left
                cap = self.cap
                if left is not None and left < cap:
                    self.js.set_time_limit(max(left, 0.001))
                    self.short = True
                else:
                    if self.short:  # back to the cap after a short limit (set when the runtime started)
                        self.js.set_time_limit(cap)
                        self.short = False
                    self.unchecked = _UNCHECKED if left is None else min(_UNCHECKED, int(left / cap) - 2)
        try:
            return self.call(*args)
        except Exception as exc:  # JSException, StackOverflow, conversion errors
            if self.realm is not None:
                # Chart code cannot make an exception escape the dispatcher (it catches all it
                # can): this is an interruption or memory running out where no JS catch runs.
                # The realm is replaced before it is lent again.
                self.realm.retired = str(exc)[:200] or type(exc).__name__
            if budget is not None:
                budget.check()
            raise EvaluationError(self._binding_error(exc)) from None

    def _binding_error(self, exc: Exception) -> str:
        msg = str(exc).split("\n", 1)[0]
        if "interrupted" in msg:
            return f"evaluation exceeded the time limit ({self.limits.time_ms} ms of CPU)"
        if "out of memory" in msg or isinstance(exc, MemoryError):
            return f"evaluation exceeded the memory limit ({self.limits.memory_bytes} bytes)"
        if isinstance(exc, getattr(quickjs, "StackOverflow", ())) or "stack" in msg.lower():
            return "evaluation exceeded the stack limit"
        return f"{type(exc).__name__}: {msg}"

    def _materialize(self) -> None:
        lim = self.limits
        heap = lim.memory_bytes
        if self.budget is not None and self.budget.memory_bytes is not None:
            heap = min(heap, self.budget.memory_bytes)
        realm = acquire(self, heap_bytes=heap, time_s=lim.time_ms / 1000.0, stack_bytes=lim.stack_bytes)
        self.realm = realm
        self.serial = realm.serial
        self.js = realm.js
        self.call = realm.call
        dm = self.dm
        if self.vars:
            try:
                text, special = dumps(self.vars)
            except (TypeError, ValueError, RecursionError) as exc:  # a position from_bytes never passed
                raise EvaluationError(f"the stored variables could not be loaded: {type(exc).__name__}") from None
        else:
            text, special = "{}", False
        iop = dm.iop_text(self.session_id, self.ioprocessors)
        event: tuple[Any, ...] = (None, None, False)
        if not self.started and self.pending_event is not _NOTHING:  # (top-level code runs with no _event)
            try:
                event = self._event_args(self.pending_event)
                self.pending_event = _NOTHING
            except EvaluationError:
                pass  # the realm starts without it; each read of _event then fails (see _runtime)
        # Loading needs room of its own beside the values it makes: the JSON text, and what
        # JSON.parse builds it up in. A commit never paid for that, so near the cap a value that
        # committed would not load again, in any later drive. Loading is not chart code: it gets
        # that room (two bytes a character, twice, and the objects it makes: loaded_size),
        # and only while no chart code runs.
        room = 4 * len(text) + loaded_size(text) if self.vars else 0
        try:
            if room:
                realm.heap(heap + room)
            self._check(self._invoke("begin", self.session_id, self.name, iop, text if self.vars else None,
                                     special, *event, realm.seed()), "the stored variables could not be loaded")
        finally:
            if room:
                realm.heap(heap)
        if self.started:
            # Functions are code: re-create the chart's top-level ones, stored data wins.
            ids = self._ids(True) if dm.full_in else None
            for e in dm.top_scripts:
                self._invoke("script", *self._script(e), ids)
            for name, e in dm.function_data:
                try:
                    self.evaluate(e)
                    self._invoke("declare", name, "last", None, False, True)
                except EvaluationError:
                    pass
            self._invoke("code")
            self._invoke("drop")
            if self.vars:
                try:
                    realm.heap(heap + room)
                    self._check(self._invoke("install", text, special), "the stored variables could not be loaded")
                finally:
                    realm.heap(heap)

    @staticmethod
    def _check(r: Any, what: str) -> None:
        if r:
            raise EvaluationError(f"{what}: {_failure(r)}")

    def _ids(self, need: Any) -> str | None:
        if need is None:
            return None
        in_state = self.in_state
        if need is True:
            return "\x1f".join(s for s in self.dm.state_ids if in_state(s))
        return "\x1f".join(s for s in need if in_state(s))

    def _compile(self, expr: Expr, kind: str) -> int:
        """The realm's key of the compiled expression (each realm compiles a source once)."""
        realm = self.realm
        assert realm is not None
        dm = self.dm
        src = dm.src[expr.id]
        key = realm.keys.get((kind, src))
        if key is not None:
            dm.compiled[kind][expr.id] = (realm.serial, key)
            return key
        bad = dm.failed.get((kind, expr.id))
        if bad is None:
            key = len(realm.keys)
            r = self._invoke("compile", key, kind, src, _brackets())
            if not r:
                realm.keys[(kind, src)] = key
                realm.cached(512 + 16 * len(src))
                dm.compiled[kind][expr.id] = (realm.serial, key)
                return key
            bad = f"{_quote(expr.src)} does not compile: {r[1:]}"
            # Remembered for the chart only when the source is at fault: running out of memory
            # (the heap this drive filled) or stack says nothing about the next drive.
            if r[:1] == "s":
                dm.failed[(kind, expr.id)] = bad
        raise EvaluationError(bad)

    def _script(self, script: Expr) -> tuple[int, str | None]:
        """The realm's key of a ``<script>``, and its source when the realm does not have it yet."""
        realm = self.realm
        assert realm is not None
        key = realm.scripts.get(script.src)
        if key is not None:
            return key, None
        key = realm.scripts[script.src] = len(realm.scripts)
        realm.cached(64 + 2 * len(script.src))
        return key, script.src

    # ------------------------------------------------------------------ values out of JS
    def _result(self, r: Any, expr: Expr) -> Any:
        t = type(r)
        if t is str and self.budget is not None:
            self.budget.charge(len(r))  # values outlive the heap that made them (effects, events)
        if t is str:
            if r[:1] != "\x01":
                self.last = _NOTHING
                return r
            tag, body = r[1:2], r[2:]
            if tag == "e":
                self.last = _NOTHING
                raise EvaluationError(f"{_quote(expr.src)}: {body}")
            if tag in ("j", "J"):
                try:
                    v = loads(body, tag == "J")
                except (ValueError, RecursionError) as exc:
                    raise EvaluationError(f"{_quote(expr.src)}: the value cannot be read: {exc}") from None
                self.last = v if isinstance(v, (dict, list)) else _NOTHING
                return v
            kind, _, text = body.partition("\x02")
            v = DataJSValue(text or kind) if expr.id in self.dm.data_expr_ids else JSValue(kind, text)
            self.last = v
            return v
        self.last = _NOTHING
        if t is float and r.is_integer() and -_SAFE_INT <= r <= _SAFE_INT:
            return int(r)
        return r

    # ------------------------------------------------------------------ values into JS
    def _payload(self, value: Any, xml_source: str | None) -> tuple[str, Any, bool]:
        if value is self.last and value is not _NOTHING:
            return "last", None, False
        t = type(value)
        if t is float or t is bool or (t is int and -_INT32 <= value < _INT32):
            return "raw", value, False  # the binding carries these exactly (larger ints it truncates)
        if isinstance(value, (JSValue, DataJSValue)):
            raise EvaluationError(f"{value} cannot be stored in the datamodel")
        if xml_source is not None and type(value) is str and value == xml_source:
            # unescaped, as values.dumps writes them: the chart's XML cannot hold a lone surrogate
            return "xml", json.dumps(xml_tree(value), ensure_ascii=False), False
        try:
            text, special = dumps(value)
        except (TypeError, ValueError, RecursionError) as exc:
            raise EvaluationError(f"the value cannot be stored in the datamodel: {exc}") from None
        return "json", text, special

    # ------------------------------------------------------------------ the Context protocol
    def _ready(self, expr: Expr, kind: str) -> tuple[int, str | None]:
        """The runtime ready, and the key of ``expr`` compiled as ``kind`` with its In() ids."""
        if self.call is None or self.pending_event is not _NOTHING:
            self._runtime()
        self.dump_cache = None
        hit = self.dm.compiled[kind][expr.id]
        key = hit[1] if hit is not None and hit[0] == self.serial else self._compile(expr, kind)
        need = self.dm.in_ids[expr.id]
        return key, None if need is None else self._ids(need)

    def evaluate(self, expr: Expr) -> Any:
        """Evaluate an expression (a location is read as a value)."""
        return self._result(self._invoke("eval", *self._ready(expr, "expr")), expr)

    def evaluate_text(self, expr: Expr) -> str:
        """Evaluate ``expr`` and convert the value to a string with ECMAScript's ToString, as
        ``String(v)`` does (``undefined`` -> ``"undefined"``, ``[1, 2]`` -> ``"1,2"``, ``{}`` ->
        ``"[object Object]"``), for attributes whose value names something (``eventexpr``,
        ``sendidexpr``, ``srcexpr``).

        The conversion runs in JS, on the drive's budget like any evaluation: a ``toString`` that
        throws or loops past the time limit raises :class:`EvaluationError`, and so does a Symbol
        (ToString refuses it; only an explicit ``String(sym)`` would describe it).
        """
        v = self._result(self._invoke("text", *self._ready(expr, "expr")), expr)
        if type(v) is not str:  # the realm sends strings only; anything else is not this op's answer
            raise EvaluationError(f"{_quote(expr.src)}: the value could not be converted to a string")
        return v

    def cond(self, expr: Expr) -> bool:
        """Evaluate a condition with ECMAScript's ToBoolean."""
        r = self._invoke("cond", *self._ready(expr, "cond"))
        if r is True or r is False:
            return r
        raise EvaluationError(f"{_quote(expr.src)}: {_failure(r)}")

    def valid_location(self, location: Expr) -> bool:
        """Whether the location compiles as an assignment target rooted at a variable name."""
        if self.dm.roots[location.id] is None:
            return False
        self._runtime()
        try:
            self._compile(location, "set")
        except EvaluationError:
            return False
        return True

    def is_declared(self, location: Expr) -> bool:
        """Whether the location's root variable exists."""
        root = self.dm.roots[location.id]
        if root is None or root in SYSTEM_VARIABLES:
            return False
        self._runtime()
        return bool(self._invoke("isdecl", root))

    def assign(self, location: Expr, value: Any) -> None:
        """Assign, refusing system variables, undeclared roots and values with no stored form."""
        root = self.dm.roots[location.id]
        if root is None:
            raise EvaluationError(f"cannot assign to {_quote(location.src)}: it is not a location")
        if root in SYSTEM_VARIABLES:
            raise EvaluationError(f"cannot assign to {_quote(location.src)}: {root} is a read-only system variable")
        key, ids = self._ready(location, "set")
        mode, payload, special = self._payload(value, self.dm.xml_assign.get(location.id))
        r = self._invoke("assign", key, root, mode, payload, special, ids)
        self.last = _NOTHING
        if r:
            raise EvaluationError(f"cannot assign to {_quote(location.src)}: {_failure(r)}")

    def declare(self, name: str, value: Any) -> None:
        """Create (or overwrite) a global variable (``<data>``, foreach item/index)."""
        if name in SYSTEM_VARIABLES:
            raise EvaluationError(f"cannot declare {name!r}: it is a system variable")
        why = _refused_name(name)
        if why is not None:  # as the python datamodel: "__" names are not variables (nor is "")
            raise EvaluationError(f"cannot declare {name!r}: {why}")
        self._runtime()
        if value is None:
            mode, payload, special = "undef", None, False
        else:
            mode, payload, special = self._payload_for_declare(name, value)
        may_be_code = name in self.dm.function_data_ids
        r = self._invoke("declare", name, mode, payload, special, may_be_code)
        self.last = _NOTHING
        if r:
            raise EvaluationError(f"<data id={name!r}>: {_failure(r)}")
        if self.bad_names:
            self.bad_names.pop(name, None)  # a plain value now: read it again

    def _payload_for_declare(self, name: str, value: Any) -> tuple[str, Any, bool]:
        if value is self.last and value is not _NOTHING:
            return "last", None, False
        return self._payload(value, self.dm.xml_data.get(name))

    def execute(self, script: Expr) -> None:
        """Run a ``<script>`` as a global program."""
        self._runtime()
        r = self._invoke("script", *self._script(script), self._ids(True if self.dm.full_in else None))
        self.last = _NOTHING
        if script.id in self.dm.top_script_ids:
            self._invoke("code")
        if r:
            raise EvaluationError(f"<script> failed: {_failure(r)}")

    def set_event(self, event: Any) -> None:
        """Bind ``_event`` (sent to the runtime only when something reads it)."""
        self.pending_event = event
        self.dump_cache = None

    def _send_event(self, event: Any) -> None:
        self._invoke("event", *self._event_args(event))

    @staticmethod
    def _event_args(event: Any) -> tuple[str | None, str | None, bool]:
        """``_event`` as the realm builds it when it is first read: (JSON, data mode, special)."""
        if event is None:
            return None, None, False
        data = event.data
        fields = [event.name, event.type, event.sendid or None, event.origin or None, event.origintype or None,
                  event.invokeid or None, event.raw or None]
        mode = "none" if data is None else "json"
        tree = xml_tree(data) if type(data) is str else None
        if tree is not None:
            mode, data = "xml", tree
        try:
            text, special = dumps(fields + [data])
        except (TypeError, ValueError, RecursionError):
            text, special = None, False
        if text is None or (type(data) is not str and text.count("[") + text.count("{") > MAX_NESTING):
            # JSON recurses once per level on the caller's stack: past the cap, whether the
            # data loads would depend on how deep the host's caller happens to be
            if too_deep(data):
                raise EvaluationError(f"the data of event {event.name!r} nests more than {MAX_NESTING} levels deep")
            if text is None:
                text, special = EcmaScriptContext._plain_event(event, fields, data)
        return text, mode, special

    @staticmethod
    def _plain_event(event: Any, fields: list[Any], data: Any) -> tuple[str, bool]:
        """The event as JSON when a field or the data is not a JSON value (bytes, a set, an object).

        Each becomes its plain stand-in (:func:`.values.plain`), as data always did: the python
        datamodel shows such a field as it is, so a drive must not fail on it here either.
        """
        for f in fields:
            if f is not None and type(f) is not str and too_deep(f):
                raise EvaluationError(f"a field of event {event.name!r} nests more than {MAX_NESTING} levels deep")
        try:
            return dumps([f if f is None or type(f) is str else plain(f) for f in fields] + [plain(data)])
        except Exception as exc:  # plain() calls str() on the caller's objects, which may raise anything
            raise EvaluationError(f"event {event.name!r} cannot be shown to the chart: {type(exc).__name__}: {exc}"
                                  ) from None

    def variables(self) -> dict[str, Any]:
        """The variables as plain JSON-compatible values.

        A variable with no stored form comes back as an :class:`Unstorable` placeholder,
        which the commit refuses (the interpreter restores it and raises ``error.execution``).
        """
        if self.call is None:
            return self.vars
        if self.dump_cache is not None:
            return self.dump_cache
        r: Any = None
        try:
            if self.bad_names is not None:
                raise SerializationError("the dump failed before in this drive")
            r = self._invoke("dump")
            if self.budget is not None and isinstance(r, str):
                # held by the host call until it commits, at what loading it will take
                self.budget.hold(self.session_id, loaded_size(r))
            out, bad = self._parse_dump(r)
        except (EvaluationError, SerializationError):
            # The dump failed as a whole: a getter, toJSON or Proxy trap that loops (interrupted,
            # which no JS catch survives), or memory ran out. Dump the variables one at a time,
            # so only the culprits are refused (issue 10: this used to escape to the host).
            r = None
            out, bad = self._dump_each()
        # What nests too deep to load again from any caller's stack (MAX_NESTING) is refused
        # now; a dump with fewer brackets than that cannot hold it.
        if r is None or r.count("[") + r.count("{") > MAX_NESTING:
            bad.extend((k, f"values nest more than {MAX_NESTING} levels deep") for k, v in out.items()
                       if (type(v) is list or type(v) is dict) and too_deep(v))
        for k in SYSTEM_VARIABLES:
            out.pop(k, None)
        # A global no position may hold (``var __tmp`` in a <script>, ``globalThis[""]``) is not
        # stored, like a local: committed, it would make the session's position unloadable.
        # Refusing it instead would put error.execution on a common JS idiom.
        for k in [k for k in out if _refused_name(k) is not None]:
            del out[k]
        bad = [(name, why) for name, why in bad if _refused_name(name) is None]
        for name, why in bad:
            # The interpreter's commit refuses the placeholder: it restores the variable to its
            # value before the drive and raises error.execution with this text.
            out[name] = unstorable(f"{why} in variable {name!r} (the ecmascript datamodel stores "
                                    "JSON-like values only; functions are code)")
        self.dump_cache = out
        return out

    @staticmethod
    def _parse_dump(r: Any) -> tuple[dict[str, Any], list[Any]]:
        if not isinstance(r, str) or r[:1] not in ("j", "J"):
            raise SerializationError(f"the ECMAScript datamodel cannot be stored: {str(r)[:200]}")
        text, _, refused = r[1:].partition("\x03")
        try:
            out = loads(text, r[0] == "J")
            bad = json.loads(refused) if refused else []
        except (ValueError, RecursionError) as exc:
            raise SerializationError(f"the ECMAScript datamodel cannot be stored: {exc}") from None
        if type(out) is not dict or type(bad) is not list:
            raise SerializationError("the ECMAScript datamodel cannot be stored: not an object")
        return out, bad

    def _dump_each(self) -> tuple[dict[str, Any], list[Any]]:
        """``(stored values, [(name, why refused)])``, one JS call per variable."""
        try:
            names = json.loads(self._invoke("names"))
        except (EvaluationError, ValueError, TypeError) as exc:  # not even the names: keep what was stored
            return {}, [(k, f"the datamodel could not be read back ({exc})") for k in self.vars]
        out: dict[str, Any] = {}
        bad: list[Any] = []
        known = self.bad_names = self.bad_names if self.bad_names is not None else {}
        for name in names if type(names) is list else ():
            if type(name) is not str:
                continue
            if name in known:
                bad.append((name, known[name]))
                continue
            try:
                r = self._invoke("dumpone", name)
                if r == "-":
                    continue
                if not isinstance(r, str) or r[:1] not in ("j", "J"):
                    raise EvaluationError(r[1:] if isinstance(r, str) else repr(r))
                out[name] = loads(r[1:], r[0] == "J")
            except (EvaluationError, ValueError, RecursionError) as exc:
                if "time limit" in str(exc):
                    known[name] = str(exc)
                bad.append((name, str(exc)))
        return out, bad
