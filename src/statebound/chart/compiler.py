"""SCXML document -> validated, immutable :class:`Chart`.

Validation collects *every* problem before raising one :class:`ChartValidationError`,
because a chart author fixing problems one per run is a poor experience. Expressions are
not checked here: a broken expression is a run-time ``error.execution`` in SCXML, and the
chart layer does not know the datamodel's language.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
import os
import re
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ..exceptions import ChartError, ChartPolicyError, ChartSyntaxError, ChartValidationError, InvalidArgument, Problem
from .model import (INVOKE_SCXML_TYPES, Action, Assign, CancelAction, Chart, DataSpec, DoneData, Expr, Foreach,
                    If,
                    InvokeSpec, LogAction, Param, Raise, Script, SendAction, StateNode, TimeoutSpec,
                    Transition)
from .trust import (MAX_LOADED_CHARTS, TRUSTED, UNTRUSTED, UNTRUSTED_DATAMODELS, LoadBudget, check_trust,
                    read_file, read_src, roots_for)
from .xml import MAX_ELEMENTS, SB_NS, SCXML_NS, El, parse_xml, serialize

__all__ = ["compile_chart", "compile_file", "compile_src_child", "compile_content_child", "instant_ms", "parse_duration",
           "SUPPORTED_DATAMODELS"]

#: The datamodels a chart may name; ``ecmascript`` needs the ``ecmascript`` extra (QuickJS).
SUPPORTED_DATAMODELS = ("python", "null", "ecmascript")
_STATE_TAGS = ("state", "parallel", "final", "history")
_EXEC_TAGS = ("raise", "send", "cancel", "assign", "log", "if", "elseif", "else", "foreach", "script")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_EVENT_TOKEN = re.compile(r"^(\.?\*|[^\s*.]+(\.[^\s*.]+)*(\.\*|\.)?)$")
_ID = re.compile(r"^[A-Za-z_][\w.\-:]*$")


#: The longest delay accepted (2**53 ms, some 285,000 years): beyond it a due time is no
#: longer an exact float or a safe integer for the stores, so it can only be a mistake.
MAX_DELAY_MS = 2 ** 53
#: How deeply invoked charts (inline ``<content>`` or ``src``) may nest below the root chart.
MAX_CHILD_NESTING = 8


def parse_duration(text: str) -> int | None:
    """Parse an SCXML/CSS2 delay (``"5s"``, ``"100ms"``, ``"1h"``, ``"2d"``) into ms, or ``None``
    (also past :data:`MAX_DELAY_MS`: a store could not hold the due time)."""
    m = _DURATION.match(text)
    if not m:
        return None
    ms = float(m.group(1)) * _UNIT_MS[m.group(2)]  # (400 digits make an infinite float)
    return round(ms) if math.isfinite(ms) and ms <= MAX_DELAY_MS else None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def parse_instant(text: str) -> int | None:
    """Parse an ISO-8601 instant (``"2026-01-01T00:00:00Z"``) into epoch ms, or ``None``."""
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return instant_ms(dt)


def instant_ms(dt: datetime) -> int:
    """``dt`` (UTC unless it carries an offset) in epoch milliseconds, never before it.

    In whole numbers: ``int(dt.timestamp() * 1000)`` rounds through a float, and for about
    one millisecond instant in fifteen after 2034 it came out 1 ms early, so a deadline
    fired before the instant it named. A sub-millisecond remainder rounds up, for the same reason.
    """
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return -((_EPOCH - dt) // _MS)


def _normalise_text(text: str) -> str:
    lines = [ln.rstrip() for ln in textwrap.dedent(text.replace("\t", "    ")).splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _target_conflict(nodes: list[StateNode], targets: tuple[int, ...]) -> str | None:
    """Why a transition's (or an initial's) target set is not a legal one (SCXML 3.11: the
    states it enters must be able to be active together), or ``None``. Two targets conflict
    when one contains the other, or when they meet below a state that is not parallel:
    entered, they would leave a compound state with two active children, and the position
    could not be stored and loaded again.

    One walk up from each target, stopping where it meets an earlier target's path: linear
    in the targets times their depth. Comparing every pair was quadratic, and a transition
    to 8,000 regions of a ``<parallel>`` took 13 s to load (longer when built at run time
    for an ``<invoke><content expr>``, past the call's budget)."""
    distinct = sorted(set(targets))
    wanted = set(distinct)
    # ancestor -> (its child on the way up from the first target that reached it, that target)
    reached: dict[int, tuple[int, int]] = {}
    for t in distinct:
        if t in reached:                       # an earlier target lies inside this one
            return f"{nodes[reached[t][1]].id!r} is inside {nodes[t].id!r}"
        below = t
        for anc in nodes[t].ancestors:         # nearest first
            if anc in wanted:
                return f"{nodes[t].id!r} is inside {nodes[anc].id!r}"
            seen = reached.get(anc)
            if seen is None:
                reached[anc] = (below, t)
                below = anc
                continue
            if seen[0] != below and nodes[anc].kind != "parallel":
                where = nodes[anc].id or "<scxml>"
                return f"they meet in {where!r}, which is not a <parallel>, so only one of them can be active"
            break                              # the rest of the way up is an earlier target's
    return None


def _canonical(el: El) -> list[Any]:
    """A whitespace- and comment-insensitive form of the element tree (comments are never parsed)."""
    return [el.ns, el.tag, sorted(el.attrib.items()), _normalise_text(el.all_text()),
            [_canonical(c) for c in el.children]]


class _Compiler:
    def __init__(self, root: El, name: str | None, version: str | None, base_path: str | None,
                 source: str | None, depth: int, trust: str, roots: tuple[str, ...], budget: LoadBudget) -> None:
        self.root = root
        self.source = source
        self.base_path = base_path
        self.trust = trust
        self.roots = roots
        self.budget = budget
        self.policy_broken = False           # a problem is a policy refusal: raise ChartPolicyError
        self.problems: list[Problem] = []
        self.exprs: list[Expr] = []
        self.states: list[dict[str, Any]] = []
        self.by_id: dict[str, int] = {}
        self.el_index: dict[int, int] = {}   # id(El) -> document element index
        self.transitions: list[Transition] = []
        self.external: list[str] = []        # hashes of loaded src files (identity)
        self.subcharts: list[Chart] = []
        self.depth = depth
        self.name = name
        self.version = version

    # -- helpers ----------------------------------------------------------------
    def problem(self, el: El | None, message: str) -> None:
        self.problems.append(Problem(message, el.line if el else None, el.column if el else None,
                                     el.tag if el else None))

    def expr(self, src: str, kind: str, el: El) -> Expr:
        e = Expr(len(self.exprs), src, kind, el.line)
        self.exprs.append(e)
        return e

    def opt_expr(self, el: El, attr: str, kind: str = "expr") -> Expr | None:
        v = el.attrib.get(attr)
        return None if v is None else self.expr(v, kind, el)

    def exclusive(self, el: El, *attrs: str, required: bool = False) -> None:
        present = [a for a in attrs if a in el.attrib]
        if len(present) > 1:
            self.problem(el, f"<{el.tag}> may have only one of {', '.join(attrs)} (found {', '.join(present)})")
        elif required and not present:
            self.problem(el, f"<{el.tag}> needs one of {', '.join(attrs)}")

    def read_src(self, el: El, src: str) -> tuple[str, str] | None:
        """``(real path, text)`` of a ``src`` inside the chart's roots; ``None`` if it is missing.

        A refusal (containment, file type, size) is a policy problem of this chart.
        """
        try:
            got = read_src(src, self.base_path, self.roots, self.budget)
        except ChartPolicyError as exc:
            self.policy_broken = True
            for p in exc.problems:
                self.problem(el, p.message)
            return None
        if got is not None:
            self.external.append(hashlib.sha256(got[1].encode()).hexdigest())
        return got

    # -- pass 1: states ------------------------------------------------------------
    def number(self) -> None:
        counter = 0

        def walk(el: El) -> None:
            nonlocal counter
            self.el_index[id(el)] = counter
            counter += 1
            for c in el.children:
                walk(c)
        walk(self.root)

        def visit(el: El, parent: int | None, depth: int) -> int:
            idx = len(self.states)
            kind = "root" if parent is None else el.tag
            sid = el.attrib.get("id", "") if parent is not None else ""
            rec: dict[str, Any] = {"el": el, "index": idx, "kind": kind, "parent": parent, "children": [],
                   "histories": [], "depth": depth, "id": sid}
            self.states.append(rec)
            if parent is not None:
                if not sid:
                    sid = f"_sb_{el.tag}{idx}"
                    rec["id"] = sid
                elif sid.startswith("_sb_"):
                    # the ids the compiler gives anonymous states: one written by the author
                    # could be given a second time, to another state
                    self.problem(el, f"state id {sid!r}: ids starting with '_sb_' are reserved for the "
                                     "ids statebound gives states that have none")
                elif sid in self.by_id:
                    self.problem(el, f"duplicate state id {sid!r}")
                if sid not in self.by_id:
                    self.by_id[sid] = idx
            for c in el.children:
                if c.ns == SCXML_NS and c.tag in _STATE_TAGS:
                    # a state inside <final>/<history>, or a top-level <history>, is reported
                    # once, by build()'s per-kind allowed-children check
                    cidx = visit(c, idx, depth + 1)
                    (rec["histories"] if c.tag == "history" else rec["children"]).append(cidx)
            rec["last"] = len(self.states) - 1
            if kind == "state":
                rec["kind"] = "compound" if rec["children"] else "atomic"
            return idx
        visit(self.root, None, 0)

    def resolve(self, el: El, ids: str, what: str) -> tuple[int, ...]:
        out = []
        for tid in ids.split():
            if tid not in self.by_id:
                self.problem(el, f"{what} refers to unknown state {tid!r}")
            else:
                out.append(self.by_id[tid])
        return tuple(out)

    # -- executable content ------------------------------------------------------
    def content_value(self, el: El, allow_chart: bool = False) -> Any:
        """``<content>``: ("expr", Expr), ("value", v), ("chart", Chart) or None."""
        if "expr" in el.attrib:
            if el.children or el.all_text().strip():
                self.problem(el, "<content> may not have both expr and a body")
            return ("expr", self.expr(el.attrib["expr"], "expr", el))
        kids = el.children
        if kids:
            if allow_chart and len(kids) == 1 and kids[0].ns == SCXML_NS and kids[0].tag == "scxml":
                return ("chart", kids[0])
            return ("value", "".join(serialize(k) for k in kids) if len(kids) > 1 else serialize(kids[0]))
        return ("value", _text_value(el.all_text()))

    def params(self, el: El) -> tuple[Param, ...]:
        out = []
        for p in el.scxml_children("param"):
            if "name" not in p.attrib:
                self.problem(p, "<param> needs a name")
            self.exclusive(p, "expr", "location")
            out.append(Param(p.attrib.get("name", ""), self.opt_expr(p, "expr"),
                             self.opt_expr(p, "location", "location")))
        return tuple(out)

    def namelist(self, el: El) -> tuple[Expr, ...]:
        return tuple(self.expr(n, "location", el) for n in el.attrib.get("namelist", "").split())

    def block(self, el: El) -> tuple[Action, ...]:
        acts: list[Action] = []
        for c in el.children:
            if c.ns != SCXML_NS:
                continue  # foreign-namespace content is ignored, as the spec allows
            a = self.action(c)
            if a is not None:
                acts.append(a)
        return tuple(acts)

    def action(self, el: El) -> Action | None:
        ci = self.el_index[id(el)]
        t = el.tag
        if t == "raise":
            if "event" not in el.attrib:
                self.problem(el, "<raise> needs an event")
            return Raise(ci, el.attrib.get("event", ""))
        if t == "send":
            self.exclusive(el, "event", "eventexpr")
            self.exclusive(el, "target", "targetexpr")
            self.exclusive(el, "type", "typeexpr")
            self.exclusive(el, "id", "idlocation")
            self.exclusive(el, "delay", "delayexpr")
            contents = el.scxml_children("content")
            if contents and ("namelist" in el.attrib or el.scxml_children("param")):
                self.problem(el, "<send> may not have <content> together with namelist or <param>")
            if contents and "event" not in el.attrib and "eventexpr" not in el.attrib:
                pass  # allowed: content-only sends (the spec makes event optional then)
            if len(contents) > 1:
                self.problem(el, "<send> may have at most one <content>")
            delay = el.attrib.get("delay")
            if delay is not None and parse_duration(delay) is None:
                self.problem(el, f"<send> delay {delay!r} is not a duration like '5s' or '100ms' "
                                 "(up to 2**53 ms)")
            if delay is not None and el.attrib.get("target") == "#_internal":
                self.problem(el, "<send> to #_internal may not have a delay")
            return SendAction(
                ci, el.attrib.get("event"), self.opt_expr(el, "eventexpr"), el.attrib.get("target"),
                self.opt_expr(el, "targetexpr"), el.attrib.get("type"), self.opt_expr(el, "typeexpr"),
                el.attrib.get("id"), self.opt_expr(el, "idlocation", "location"), delay,
                self.opt_expr(el, "delayexpr"), self.namelist(el), self.params(el),
                self.content_value(contents[0]) if contents else None)
        if t == "cancel":
            self.exclusive(el, "sendid", "sendidexpr", required=True)
            return CancelAction(ci, el.attrib.get("sendid"), self.opt_expr(el, "sendidexpr"))
        if t == "assign":
            if "location" not in el.attrib:
                self.problem(el, "<assign> needs a location")
            body = el.children or el.all_text().strip()
            if "expr" in el.attrib and body:
                self.problem(el, "<assign> may not have both expr and a body")
            value = None
            if "expr" not in el.attrib:
                value = self.content_value(el)[1] if (el.children or el.all_text().strip()) else None
            return Assign(ci, self.expr(el.attrib.get("location", ""), "location", el),
                          self.opt_expr(el, "expr"), value)
        if t == "log":
            return LogAction(ci, el.attrib.get("label"), self.opt_expr(el, "expr"))
        if t == "if":
            if "cond" not in el.attrib:
                self.problem(el, "<if> needs a cond")
            branches: list[tuple[Expr | None, tuple[Action, ...]]] = []
            cond: Expr | None = self.opt_expr(el, "cond", "cond")
            cur: list[Action] = []
            seen_else = False
            for c in el.children:
                if c.ns != SCXML_NS:
                    continue
                if c.tag in ("elseif", "else"):
                    if seen_else:
                        self.problem(c, f"<{c.tag}> after <else>")
                    branches.append((cond, tuple(cur)))
                    cur = []
                    if c.tag == "elseif":
                        if "cond" not in c.attrib:
                            self.problem(c, "<elseif> needs a cond")
                        cond = self.opt_expr(c, "cond", "cond")
                    else:
                        seen_else = True
                        cond = None
                    continue
                a = self.action(c)
                if a is not None:
                    cur.append(a)
            branches.append((cond, tuple(cur)))
            return If(ci, tuple(branches))
        if t in ("elseif", "else"):
            self.problem(el, f"<{t}> is only allowed inside <if>")
            return None
        if t == "foreach":
            for attr in ("array", "item"):
                if attr not in el.attrib:
                    self.problem(el, f"<foreach> needs {attr}")
            return Foreach(ci, self.expr(el.attrib.get("array", ""), "expr", el),
                           self.expr(el.attrib.get("item", ""), "location", el),
                           self.opt_expr(el, "index", "location"), self.block(el))
        if t == "script":
            return self.script(el)
        self.problem(el, f"<{t}> is not executable content")
        return None

    def script(self, el: El) -> Script:
        ci = self.el_index[id(el)]
        code = _normalise_text(el.all_text())
        if "src" in el.attrib:
            if code:
                self.problem(el, "<script> may not have both src and a body")
            got = self.read_src(el, el.attrib["src"])
            if got is None:
                self.problem(el, f"<script src={el.attrib['src']!r}> could not be loaded")
            code = _normalise_text(got[1] if got is not None else "")
        return Script(ci, self.expr(code, "script", el))

    # -- pass 2: per-state structure -------------------------------------------------
    def transition(self, el: El, source: int) -> Transition:
        ev = el.attrib.get("event")
        events: tuple[str, ...] = ()
        if ev is not None:
            toks = ev.split()
            if not toks:
                self.problem(el, "<transition event=''> has no event descriptor")
            for tok in toks:
                if not _EVENT_TOKEN.match(tok):
                    self.problem(el, f"bad event descriptor {tok!r}")
            events = tuple(_norm_descriptor(t) for t in toks)
        ttype = el.attrib.get("type", "external")
        if ttype not in ("external", "internal"):
            self.problem(el, f"transition type must be 'internal' or 'external', not {ttype!r}")
        targets = self.resolve(el, el.attrib.get("target", ""), "transition target")
        t = Transition(len(self.transitions), source, events, self.opt_expr(el, "cond", "cond"),
                       targets, ttype, self.block(el), self.el_index[id(el)], el.line)
        self.transitions.append(t)
        return t

    def build(self) -> tuple[list[StateNode], tuple[Action, ...]]:
        nodes: list[StateNode] = []
        allowed = {
            "root": {"state", "parallel", "final", "datamodel", "script"},
            "atomic": {"onentry", "onexit", "transition", "initial", "state", "parallel", "final",
                       "history", "datamodel", "invoke"},
            "compound": {"onentry", "onexit", "transition", "initial", "state", "parallel", "final",
                         "history", "datamodel", "invoke"},
            "parallel": {"onentry", "onexit", "transition", "state", "parallel", "history",
                         "datamodel", "invoke"},
            "final": {"onentry", "onexit", "donedata"},
            "history": {"transition"},
        }
        top_script: list[Action] = []
        for rec in self.states:
            el: El = rec["el"]
            kind: str = rec["kind"]
            idx: int = rec["index"]
            transitions: list[Transition] = []
            onentry: list[tuple[Action, ...]] = []
            onexit: list[tuple[Action, ...]] = []
            invokes: list[InvokeSpec] = []
            data: list[DataSpec] = []
            timeouts: list[TimeoutSpec] = []
            donedata: DoneData | None = None
            initial_el: El | None = None
            for c in el.children:
                if c.ns == SB_NS:
                    if c.tag == "timeout" and kind in ("atomic", "compound", "parallel"):
                        timeouts.append(self.timeout(c, idx, timeouts))
                    else:
                        self.problem(c, f"<sb:{c.tag}> is not allowed inside <{el.tag}>")
                    continue
                if c.ns != SCXML_NS:
                    continue
                if c.tag not in allowed[kind]:
                    self.problem(c, f"<{c.tag}> is not allowed inside <{el.tag}>")
                    continue
                if c.tag == "transition":
                    transitions.append(self.transition(c, idx))
                elif c.tag == "onentry":
                    onentry.append(self.block(c))
                elif c.tag == "onexit":
                    onexit.append(self.block(c))
                elif c.tag == "datamodel":
                    for d in c.children:
                        if d.ns == SCXML_NS and d.tag == "data":
                            data.append(self.data(d))
                        elif d.ns == SCXML_NS:
                            self.problem(d, f"<{d.tag}> is not allowed inside <datamodel>")
                elif c.tag == "invoke":
                    invokes.append(self.invoke(c, idx, rec["id"], len(invokes)))
                elif c.tag == "donedata":
                    if donedata is not None:
                        self.problem(c, "<final> may have only one <donedata>")
                    contents = c.scxml_children("content")
                    if contents and c.scxml_children("param"):
                        self.problem(c, "<donedata> may not have both <content> and <param>")
                    donedata = DoneData(self.content_value(contents[0]) if contents else None,
                                        self.params(c))
                elif c.tag == "initial":
                    if initial_el is not None:
                        self.problem(c, "a state may have only one <initial>")
                    initial_el = c
                elif c.tag == "script":
                    top_script.append(self.script(c))
            initial = self.initial(rec, initial_el)
            history_type = None
            if kind == "history":
                history_type = el.attrib.get("type", "shallow")
                if history_type not in ("shallow", "deep"):
                    self.problem(el, f"history type must be 'shallow' or 'deep', not {history_type!r}")
                initial = self.history_default(rec, transitions, history_type)
                transitions = []
            if kind == "root" or kind == "compound":
                pass
            ancestors = []
            p = rec["parent"]
            while p is not None:
                ancestors.append(p)
                p = self.states[p]["parent"]
            nodes.append(StateNode(
                idx, rec["id"], kind, rec["parent"], tuple(rec["children"]), tuple(rec["histories"]),
                rec["last"], rec["depth"], tuple(ancestors), initial, tuple(transitions),
                tuple(onentry), tuple(onexit), tuple(invokes), tuple(data), donedata, history_type,
                tuple(timeouts), el.line))
        return nodes, tuple(top_script)

    def initial(self, rec: dict[str, Any], initial_el: El | None) -> Transition | None:
        el: El = rec["el"]
        kind = rec["kind"]
        attr = el.attrib.get("initial")
        if kind not in ("compound", "root"):
            if attr is not None:
                self.problem(el, f"initial= is only allowed on compound states, not on a {kind} state")
            if initial_el is not None:
                self.problem(initial_el, f"<initial> is only allowed in compound states, not in a {kind} state")
            return None
        if kind == "root" and not rec["children"]:
            self.problem(el, "<scxml> has no states")
            return None
        if attr is not None and initial_el is not None:
            self.problem(el, "a state may not have both initial= and <initial>")
        if initial_el is not None:
            trans = initial_el.scxml_children("transition")
            if len(trans) != 1:
                self.problem(initial_el, "<initial> must contain exactly one <transition>")
                return self.default_initial(rec)
            tel = trans[0]
            if "event" in tel.attrib or "cond" in tel.attrib:
                self.problem(tel, "the <initial> transition may not have an event or a cond")
            t = self.transition(tel, rec["index"])
            self.check_descendants(tel, rec, t.targets, "<initial> target")
            if not t.targets:
                self.problem(tel, "the <initial> transition needs a target")
            return t
        if attr is not None:
            targets = self.resolve(el, attr, "initial")
            if not attr.split():
                self.problem(el, "initial= is empty")
            self.check_descendants(el, rec, targets, "initial")
            t = Transition(len(self.transitions), rec["index"], (), None, targets, "external", (),
                           self.el_index[id(el)], el.line)
            self.transitions.append(t)
            return t
        return self.default_initial(rec)

    def default_initial(self, rec: dict[str, Any]) -> Transition | None:
        if not rec["children"]:
            return None
        t = Transition(len(self.transitions), rec["index"], (), None, (rec["children"][0],), "external",
                       (), self.el_index[id(rec["el"])], rec["el"].line)
        self.transitions.append(t)
        return t

    def check_descendants(self, el: El, rec: dict[str, Any], targets: tuple[int, ...], what: str) -> None:
        for t in targets:
            if not (rec["index"] < t <= rec["last"]):
                self.problem(el, f"{what} {self.states[t]['id']!r} is not a descendant of "
                                 f"{rec['id'] or '<scxml>'!r}")

    def history_default(self, rec: dict[str, Any], transitions: list[Transition], htype: str) -> Transition | None:
        el: El = rec["el"]
        if len(transitions) != 1:
            self.problem(el, f"<history id={rec['id']!r}> needs exactly one default <transition>")
            return None
        t = transitions[0]
        if t.events or t.cond is not None:
            self.problem(el, f"the default transition of history {rec['id']!r} may not have an event or a cond")
        if not t.targets:
            self.problem(el, f"the default transition of history {rec['id']!r} needs a target")
        parent = self.states[rec["parent"]]
        for tgt in t.targets:
            trec = self.states[tgt]
            ok = (trec["parent"] == parent["index"]) if htype == "shallow" else \
                (parent["index"] < tgt <= parent["last"])
            if not ok or trec["kind"] == "history":
                rel = "a child" if htype == "shallow" else "a descendant"
                self.problem(el, f"history {rec['id']!r} default target {trec['id']!r} is not {rel} of "
                                 f"{parent['id']!r}")
        return t

    def data(self, el: El) -> DataSpec:
        if "id" not in el.attrib:
            self.problem(el, "<data> needs an id")
        elif el.attrib["id"].startswith("__"):
            # no position may hold such a variable (the datamodels keep the names to themselves):
            # an ecmascript session that declared one could never be loaded again
            self.problem(el, f"<data id={el.attrib['id']!r}>: names starting with '__' are reserved")
        self.exclusive(el, "expr", "src")
        body = el.children or el.all_text().strip()
        if body and ("expr" in el.attrib or "src" in el.attrib):
            self.problem(el, "<data> may not have a body together with expr or src")
        value: Any = None
        has_value = False
        if "src" in el.attrib:
            got = self.read_src(el, el.attrib["src"])
            value = ("error", f"could not load {el.attrib['src']!r}") if got is None else _text_value(got[1])
            has_value = True
        elif body:
            value = self.content_value(el)[1]
            has_value = True
        return DataSpec(el.attrib.get("id", ""), self.opt_expr(el, "expr"), value, has_value, el.line)

    def invoke(self, el: El, state: int, state_id: str, k: int) -> InvokeSpec:
        self.exclusive(el, "type", "typeexpr")
        self.exclusive(el, "src", "srcexpr")
        self.exclusive(el, "id", "idlocation")
        contents = el.scxml_children("content")
        if contents and ("src" in el.attrib or "srcexpr" in el.attrib):
            self.problem(el, "<invoke> may not have both src and <content>")
        if el.scxml_children("param") and "namelist" in el.attrib:
            self.problem(el, "<invoke> may not have both namelist and <param>")
        fins = el.scxml_children("finalize")
        if len(fins) > 1:
            self.problem(el, "<invoke> may have only one <finalize>")
        for c in el.children:
            if c.ns == SCXML_NS and c.tag not in ("content", "param", "finalize"):
                self.problem(c, f"<{c.tag}> is not allowed inside <invoke>")
        sub_name = f"{self.name or 'chart'}/{state_id}.invoke{k}"
        chart = None
        content = None
        # A literal type other than SCXML names a host invoke handler: its src and content
        # are that handler's input, so they are never read or compiled as a chart.
        scxml = "typeexpr" in el.attrib or el.attrib.get("type") in (None, "", *INVOKE_SCXML_TYPES)
        if contents:
            content = self.content_value(contents[0], allow_chart=scxml)
            if content and content[0] == "chart":
                chart = self.subchart(content[1], sub_name, el)
                content = None
        src = el.attrib.get("src")
        if src is None or not scxml:
            pass  # no src, or a handler's src: its input, never read as a chart
        elif self.depth >= MAX_CHILD_NESTING:
            self.problem(el, "invoked charts nested too deeply")
        elif self.budget.charts_left <= 0:  # read nothing more
            self.policy_broken = True
            self.problem(el, f"the load has compiled its {MAX_LOADED_CHARTS} charts")
        else:
            got = self.read_src(el, src)
            if got is not None:
                chart = self.subchart_text(got[1], sub_name, el, src, os.path.dirname(got[0]))
        return InvokeSpec(self.el_index[id(el)], state, el.attrib.get("type"), self.opt_expr(el, "typeexpr"),
                          src, self.opt_expr(el, "srcexpr"), el.attrib.get("id"),
                          self.opt_expr(el, "idlocation", "location"), self.namelist(el), self.params(el),
                          el.attrib.get("autoforward", "false") == "true", content, chart,
                          self.block(fins[0]) if fins else ())

    def subchart(self, el: El, name: str, at: El, base_path: str | None = None) -> Chart | None:
        if self.depth >= MAX_CHILD_NESTING:
            self.problem(at, "invoked charts nested too deeply")
            return None
        try:
            c = _compile_root(el, name, self.version, base_path or self.base_path, self.source, self.depth + 1,
                              self.trust, self.roots, self.budget)
        except ChartError as exc:
            self.policy_broken = self.policy_broken or isinstance(exc, ChartPolicyError)
            self.problem(at, f"invoked chart is invalid: {_brief(exc)}")
            return None
        self.subcharts.append(c)
        return c

    def subchart_text(self, text: str, name: str, at: El, src: str, base_path: str) -> Chart | None:
        try:
            root = _parse(text, src, self.budget)
        except ChartSyntaxError as exc:
            self.policy_broken = self.policy_broken or isinstance(exc, _LoadTooBig)
            self.problem(at, f"invoked chart {src!r} is not well-formed: {exc}")
            return None
        return self.subchart(root, name, at, base_path)

    def timeout(self, el: El, state: int, seen: list[TimeoutSpec]) -> TimeoutSpec:
        ci = self.el_index[id(el)]
        event = el.attrib.get("event", "")
        if not event:
            self.problem(el, "<sb:timeout> needs an event")
        name = el.attrib.get("name", event)
        if any(t.name == name for t in seen):
            self.problem(el, f"duplicate timeout name {name!r} on state {self.states[state]['id']!r}")
        kinds = [k for k in ("after", "afterexpr", "at", "atexpr") if k in el.attrib]
        if len(kinds) != 1:
            self.problem(el, "<sb:timeout> needs exactly one of after, afterexpr, at, atexpr"
                             + (f" (found {', '.join(kinds)})" if kinds else ""))
        kind = kinds[0] if kinds else "after"
        spec: dict[str, Any] = {}
        if kind == "after":
            ms = parse_duration(el.attrib.get("after", ""))
            if ms is None and kinds:  # no kind at all was reported just above
                self.problem(el, f"<sb:timeout> after={el.attrib.get('after')!r} is not a duration like '5s' "
                                 "(up to 2**53 ms)")
            spec["duration_ms"] = ms or 0
        elif kind == "at":
            at = parse_instant(el.attrib["at"])
            if at is None:
                self.problem(el, f"<sb:timeout> at={el.attrib['at']!r} is not an ISO-8601 instant")
            spec["at_ms"] = at or 0
        else:
            spec["expr"] = self.expr(el.attrib[kind], "expr", el)
        return TimeoutSpec(ci, state, name, event, kind, namelist=self.namelist(el),
                           data=self.opt_expr(el, "data"), **spec)


def _brief(exc: ChartError) -> str:
    """A child's error, short: nested children would otherwise repeat every message at every level."""
    problems = getattr(exc, "problems", None)
    if not problems:
        return str(exc)[:500]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return str(problems[0])[:500] + more


def _norm_descriptor(tok: str) -> str:
    if tok == ".*":  # the W3C suite writes the wildcard this way too
        return "*"
    if tok.endswith(".*"):
        return tok[:-2]
    if tok.endswith(".") and tok != ".":
        return tok[:-1]
    return tok


def _text_value(text: str) -> Any:
    """Inline text content: JSON when it parses as JSON, else the whitespace-normalised string."""
    s = text.strip()
    if not s:
        return None
    try:
        return json.loads(s)
    except (ValueError, RecursionError):  # nested past the recursion limit: not usable JSON
        return " ".join(s.split())


@functools.cache
def _ecmascript_available() -> bool:
    """Whether the ``ecmascript`` extra (the ``quickjs`` module of quickjs-ng) is installed."""
    try:
        return importlib.util.find_spec("quickjs") is not None
    except (ImportError, ValueError):
        return False


class _LoadTooBig(ChartSyntaxError):
    """Internal: a document took the load over its element budget (a policy refusal)."""


def _parse(text: str | bytes, source: str | None, budget: LoadBudget) -> El:
    """Parse one document of a load, charging its elements to the load's budget."""
    if budget.elements_left <= 0:
        raise _LoadTooBig(f"the load has compiled its {MAX_ELEMENTS} elements", source=source)
    try:
        root = parse_xml(text, source=source, max_elements=budget.elements_left)
    except ChartSyntaxError as exc:
        if budget.elements_left < MAX_ELEMENTS and "more than" in str(exc) and "elements" in str(exc):
            raise _LoadTooBig(f"the load has compiled its {MAX_ELEMENTS} elements", source=source) from None
        raise
    budget.elements_left -= _count(root)
    return root


def _count(el: El) -> int:
    n = 0
    todo = [el]
    while todo:
        e = todo.pop()
        n += 1
        todo.extend(e.children)
    return n


def _compile_root(root: El, name: str | None, version: str | None, base_path: str | None,
                  source: str | None, depth: int, trust: str, roots: tuple[str, ...],
                  budget: LoadBudget) -> Chart:
    if root.ns != SCXML_NS or root.tag != "scxml":
        raise ChartValidationError([Problem(
            f"root element must be <scxml> in namespace {SCXML_NS}, found <{root.tag}>"
            + (f" in {root.ns!r}" if root.ns else " without a namespace"), root.line, root.column, root.tag)],
            source)
    if not budget.take_chart():
        raise ChartPolicyError([Problem(f"the load has compiled its {MAX_LOADED_CHARTS} charts",
                                        root.line, root.column, root.tag)], source)
    dm = root.attrib.get("datamodel", "python")
    if trust == UNTRUSTED and dm not in UNTRUSTED_DATAMODELS:
        raise ChartPolicyError([Problem(
            f"an untrusted chart may use only the {' or '.join(UNTRUSTED_DATAMODELS)} datamodel, not {dm!r}"
            + (" (the default: write datamodel=\"ecmascript\")" if "datamodel" not in root.attrib else ""),
            root.line, root.column, root.tag)], source)
    if dm == "ecmascript" and not _ecmascript_available():
        raise ChartError("datamodel='ecmascript' needs the QuickJS binding: pip install 'statebound[ecmascript]'")
    if dm not in SUPPORTED_DATAMODELS:
        raise ChartError(f"unknown datamodel {dm!r} (supported: {', '.join(SUPPORTED_DATAMODELS)}; "
                         "ecmascript with the extra)")
    name = name or root.attrib.get("name") or "chart"
    c = _Compiler(root, name, version, base_path, source, depth, trust, roots, budget)
    binding = root.attrib.get("binding", "early")
    if binding not in ("early", "late"):
        c.problem(root, f"binding must be 'early' or 'late', not {binding!r}")
    if root.attrib.get("version", "1.0") != "1.0":
        c.problem(root, f"version must be '1.0', not {root.attrib['version']!r}")
    c.number()
    nodes, script = c.build()
    for t in c.transitions:
        if len(set(t.targets)) > 1 and (why := _target_conflict(nodes, t.targets)) is not None:
            c.problems.append(Problem(f"the targets {' '.join(repr(nodes[x].id) for x in t.targets)} cannot be "
                                      f"active together: {why}", t.line, None, "transition"))
    seen_data: dict[str, int] = {}
    for n in nodes:
        for d in n.data:
            if d.id in seen_data:
                c.problems.append(Problem(f"duplicate <data id={d.id!r}>", d.line, None, "data"))
            seen_data[d.id] = n.index
    if c.problems:
        raise (ChartPolicyError if c.policy_broken else ChartValidationError)(c.problems, source)
    digest = hashlib.sha256()
    # The trust level is part of what the chart *is*: a position written under an untrusted
    # chart never loads against the same text trusted (trusted identities stay as they were).
    identity_input: list[Any] = [_canonical(root), c.external]
    if trust == UNTRUSTED:
        identity_input.append(UNTRUSTED)
    digest.update(json.dumps(identity_input, separators=(",", ":"), ensure_ascii=False).encode())
    return Chart(name=name, version=version, identity="sha256:" + digest.hexdigest(), datamodel=dm,
                 binding=binding, states=tuple(nodes), transitions=tuple(c.transitions),
                 expressions=tuple(c.exprs), script=script, base_path=base_path,
                 subcharts=tuple(c.subcharts), trust=trust, src_roots=roots, _by_id=dict(c.by_id))


def _check_label(value: Any, what: str) -> None:
    """A chart's name or version goes into every position blob's header: it must be text that
    UTF-8 can hold (it was an AttributeError or a UnicodeEncodeError at the first to_bytes)."""
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidArgument(f"a chart {what} must be a string, not {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"the chart {what} {value!r} is not valid Unicode (a lone surrogate)") from None


def compile_chart(text: str | bytes, name: str | None = None, version: str | None = None,
                  base_path: str | None = None, source: str | None = None, *, trust: str = TRUSTED,
                  allow_dirs: Any = ()) -> Chart:
    """Parse, validate and compile SCXML text (see :meth:`Chart.from_scxml`)."""
    check_trust(trust)
    if not isinstance(text, (str, bytes, bytearray)):
        # bytes(5) would be five NUL bytes, and None a TypeError deep in the parser
        raise InvalidArgument(f"the SCXML document must be a str or bytes, not {type(text).__name__}")
    if base_path is not None and not isinstance(base_path, (str, os.PathLike)):
        raise InvalidArgument(f"base_path must be a path, not {type(base_path).__name__}")
    _check_label(name, "name")
    _check_label(version, "version")
    roots = roots_for(base_path, allow_dirs)
    budget = LoadBudget()
    return _compile_root(_parse(text, source, budget), name, version, base_path, source, 0, trust, roots, budget)


def compile_file(path: Any, name: str | None = None, version: str | None = None, *, trust: str = TRUSTED,
                 allow_dirs: Any = ()) -> Chart:
    """Read and compile an SCXML file (see :meth:`Chart.from_file`)."""
    check_trust(trust)
    _check_label(name, "name")
    _check_label(version, "version")
    p = Path(os.fspath(path))
    text = read_file(str(p))
    base = str(p.parent.resolve())
    budget = LoadBudget()
    root = _parse(text, str(p), budget)
    return _compile_root(root, name or root.attrib.get("name") or p.stem, version, base, str(p), 0, trust,
                         roots_for(base, allow_dirs), budget)


def compile_src_child(parent: Chart, src: str, name: str) -> Chart:
    """The chart an ``<invoke src|srcexpr>`` of ``parent`` names, loaded under ``parent``'s policy.

    It resolves against ``parent``'s base directory, inside ``parent``'s roots, and is as
    trusted as ``parent``.

    :raises ChartPolicyError: the src is refused.
    :raises ChartError: the file does not exist, or is not a valid chart.
    """
    budget = LoadBudget()
    got = read_src(src, parent.base_path, parent.src_roots, budget)
    if got is None:
        raise ChartError(f"<invoke src={src!r}>: no such file")
    root = _parse(got[1], src, budget)
    return _compile_root(root, name, None, os.path.dirname(got[0]), src, 0, parent.trust, parent.src_roots,
                         budget)


def compile_content_child(parent: Chart, text: str, name: str) -> Chart:
    """The chart an ``<invoke><content expr>`` of ``parent`` evaluated to, under ``parent``'s policy."""
    budget = LoadBudget()
    return _compile_root(_parse(text, None, budget), name, None, parent.base_path, None, 0, parent.trust,
                         parent.src_roots, budget)
