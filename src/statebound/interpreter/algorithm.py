"""The W3C SCXML algorithm (Appendix D), ported function for function.

=================================  ============================================
This module                        Appendix D
=================================  ============================================
``Machine.start``                  ``interpret`` (up to the first wait)
``Machine.process_external``       ``mainEventLoop``, the external-event half
``Machine.macrostep``              ``mainEventLoop``, the internal-event loop
``Machine.exit_interpreter``       ``exitInterpreter``
``select_eventless_transitions``   ``selectEventlessTransitions``
``select_transitions``             ``selectTransitions``
``remove_conflicting_transitions`` ``removeConflictingTransitions``
``microstep``                      ``microstep``
``exit_states``                    ``exitStates``
``compute_exit_set``               ``computeExitSet``
``execute_transition_content``     ``executeTransitionContent``
``enter_states``                   ``enterStates``
``compute_entry_set``              ``computeEntrySet``
``add_descendant_states_to_enter`` ``addDescendantStatesToEnter``
``add_ancestor_states_to_enter``   ``addAncestorStatesToEnter``
``is_in_final_state``              ``isInFinalState``
``get_transition_domain``          ``getTransitionDomain``
``find_lcca``                      ``findLCCA``
``get_effective_target_states``    ``getEffectiveTargetStates``
``get_proper_ancestors``           ``getProperAncestors``
=================================  ============================================

Deviations, with their reasons:

* **No queues across calls.** The external queue belongs to the host: one drive is one
  external event. Sends to the session itself come back as ``Send`` effects that the
  host feeds in as later drives, in FIFO order.
* **Round budget.** ``max_rounds`` bounds the microsteps of one drive, plus the internal
  events it dequeues that enable no transition (an eventless condition that fails on every
  evaluation raises ``error.execution`` forever without a microstep). A chart that
  never settles (``<transition event="e"><raise event="e"/>``...) returns the untouched
  position and a ``BudgetExhausted`` effect instead of hanging the host.
* **CPU and memory budget.** The loops whose work grows with the chart (and faster than
  linearly, for some hostile shapes) call ``self.tick()``; the datamodel's
  :class:`~statebound.datamodel.budget.Budget` reads the clock, never this module. A spent
  budget raises ``BudgetSpent`` and the drive ends like an exhausted round budget.
* **Caches.** Transition selection and microstep plans depend only on the configuration,
  the event name and (for conditions) the datamodel; what depends on neither conditions
  nor history values is computed once per chart and reused.
* **Halted configuration.** ``exitInterpreter`` empties the configuration; the position
  keeps the configuration the session halted in, because "which final state?" is what
  every caller asks next.
* **Document order = index order.** States are numbered in document order, so "sort by
  document order" is ``sorted()`` and "is descendant" is an index-range check.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..chart.model import Chart, StateNode, Transition
from ..datamodel.budget import Budget
from ..events import Event
from .content import ContentMixin
from .program import Program
from .state import ArmedTimeout, Invocation

__all__ = ["Machine", "OutOfRounds", "CACHE_LIMIT"]


class OutOfRounds(Exception):
    """Internal: the round budget ran out (the drive is abandoned)."""


#: Entries per cache before it is emptied: event names come from outside, so no cache
#: keyed by them may grow without bound.
CACHE_LIMIT = 4096


def _put(cache: dict[Any, Any], key: Any, value: Any) -> None:
    if len(cache) >= CACHE_LIMIT:
        cache.clear()
    cache[key] = value


def _name_match(descriptors: tuple[str, ...], name: str) -> bool:
    return any(d == "*" or d == name or (name.startswith(d) and name[len(d):len(d) + 1] == ".")
               for d in descriptors)


class Machine(ContentMixin):
    """The mutable working state of one drive. Built from a position, turned back into one.

    :param config: the set the datamodel's ``In()`` reads; the machine keeps it current.
    """

    __slots__ = ("_key", "_stamp", "cache", "caller_context", "cancelled", "chart", "config", "ctx",
                 "current_event", "current_sendid", "effects", "final_config", "history", "idle_no",
                 "initialized", "internal", "invocations", "invoke_counter", "invokers", "ioprocessors",
                 "late", "macrostep_no", "max_rounds", "microstep_no", "ordinal", "ordinal_at_microstep",
                 "parent", "prog", "round_no", "routes", "running", "send_counter", "session_id",
                 "start_data", "states", "states_to_invoke", "timeouts")

    def __init__(self, chart: Chart, prog: Program, ctx: Any, config: set[int], pos: Any, macrostep: int,
                 max_rounds: int, caller_context: Any, budget: Budget | None = None,
                 new_budget: Any = None, max_items: int | None = None) -> None:
        self.chart = chart
        self.states: tuple[StateNode, ...] = chart.states
        self.prog = prog
        self.ctx = ctx
        self.config = config
        self._key: tuple[int, ...] | None = None
        self.history: dict[int, tuple[int, ...]] = dict(pos.history) if pos.history else {}
        self.session_id: str = pos.session_id
        self.macrostep_no = macrostep
        self.send_counter: int = pos.send_counter
        self.ordinal: int = pos.ordinal
        self.invoke_counter: int = pos.invoke_counter
        self.invocations: list[Invocation] = list(pos.invocations)
        self.initialized: set[int] = set(pos.initialized) if pos.initialized else set()
        self.parent: str | None = pos.parent
        self.timeouts: dict[tuple[int, str], ArmedTimeout] = \
            {(t.state, t.name): t for t in pos.timeouts} if pos.timeouts else {}
        self.routes = pos.routes
        self.ioprocessors: Any = pos.ioprocessors
        self.invokers: Any = pos.invokers
        self.max_rounds = max_rounds
        self.caller_context = caller_context
        self.init_budget(budget, new_budget, max_items)
        self.internal: deque[Event] = deque()
        self.effects: list[Any] = []
        self.states_to_invoke: set[int] = set()
        self.running = True
        self.microstep_no = 0
        self.idle_no = 0  # internal events that enabled nothing (they count toward max_rounds)
        self.round_no = 0
        self.final_config: tuple[int, ...] | None = None
        self.cancelled = False
        self.cache: dict[str, dict[Any, Any]] = prog.algo
        self.late: bool = prog.late
        self.ordinal_at_microstep = self.ordinal
        self.current_event: str | None = None
        self.current_sendid: str | None = None
        self.start_data: dict[str, Any] | None = None
        self._stamp: Any = None

    def config_key(self) -> tuple[int, ...]:
        """The configuration in document order (the caches' key), computed once per change."""
        key = self._key
        if key is None:
            key = self._key = tuple(sorted(self.config))
        return key

    # ------------------------------------------------------------------ main loop
    def start(self) -> None:
        """``interpret``: initialise data, run the global script, take the initial transition."""
        root = self.states[0]
        if self.start_data:
            declared = {d.id for s in self.states for d in s.data}
            for k, v in self.start_data.items():
                if k not in declared:
                    self.ctx.declare(k, v)
        if not self.late:
            for s in self.states:
                self.initialize_data(s)
        else:
            for s in self.states:
                for d in s.data:
                    self.declare_unbound(d.id)
            self.initialize_data(root)
            self.initialized.add(0)
        if self.chart.script:
            self.execute_content(self.prog.block(self.chart.script), 0)
        assert root.initial is not None
        self.enter_states([root.initial])
        self.macrostep()

    def process_external(self, event: Event) -> None:
        """``mainEventLoop`` from the dequeue of an external event to the end of its macrostep."""
        # Appendix D: isCancelEvent -> running = false, then exitInterpreter (the cancel
        # event is a platform event: the type test spares the property call for the rest)
        if event.type == "platform" and event.is_cancel:
            self.running = False
            self.cancelled = True
            self.exit_interpreter()
            return
        if self.prog.reads_event:
            self.ctx.set_event(event)
        self.current_event = event.name
        self.current_sendid = event.sendid
        for inv in self.invocations:
            if event.invokeid and inv.invokeid == event.invokeid:
                spec = self.states[inv.state].invokes[inv.index]
                if spec.finalize:
                    self.execute_content(self.prog.block(spec.finalize), inv.state)
            if inv.autoforward:
                self.emit_autoforward(inv, event)
        enabled = self.select_transitions(event)
        if enabled:
            self.microstep(enabled)
        self.macrostep()

    def macrostep(self) -> None:
        """The internal half of ``mainEventLoop``: run until stable, then start invocations."""
        while self.running:
            while self.running:
                enabled = self.select_eventless_transitions()
                if not enabled:
                    if not self.internal:
                        break
                    ev = self.internal.popleft()
                    if self.prog.reads_event:
                        self.ctx.set_event(ev)
                    self.current_event = ev.name
                    self.current_sendid = ev.sendid
                    enabled = self.select_transitions(ev)
                    if not enabled:
                        self.idle_no += 1
                        if self.microstep_no + self.idle_no > self.max_rounds:
                            raise OutOfRounds()
                if enabled:
                    self.microstep(enabled)
            if not self.running:
                break
            if self.states_to_invoke:
                for s in sorted(self.states_to_invoke):
                    for k, inv in enumerate(self.states[s].invokes):
                        self.invoke(inv, k)
                self.states_to_invoke.clear()
            self.round_no += 1
            if not self.internal:
                break
        if not self.running:
            self.exit_interpreter()

    def exit_interpreter(self) -> None:
        """``exitInterpreter``: exit every state in exit order, report ``Done``."""
        self.final_config = self.config_key()
        onexit = self.prog.onexit
        for s in reversed(self.final_config):
            node = self.states[s]
            for block in onexit[s]:
                self.execute_content(block, s)
            self.cancel_invokes(s)
            self.cancel_timeouts(s)
            self.config.discard(s)
            self._key = None
            if node.kind == "final" and node.parent == 0:
                self.emit_done(node)

    # ------------------------------------------------------------------ selection
    def select_eventless_transitions(self) -> list[Transition]:
        """``selectEventlessTransitions``."""
        key = self._key
        if key is None:
            key = self.config_key()
        chains = self.cache["eventless"].get(key)
        if chains is None:
            chains = self._chains(key, None)
            _put(self.cache["eventless"], key, chains)
        if not chains:
            return []
        return self._pick(chains)

    def select_transitions(self, event: Event) -> list[Transition]:
        """``selectTransitions`` for an event (internal or external)."""
        config = self._key
        if config is None:
            config = self.config_key()
        key = (config, event.name)
        chains = self.cache["select"].get(key)
        if chains is None:
            chains = self._chains(key[0], event.name)
            _put(self.cache["select"], key, chains)
        if not chains:
            return []
        return self._pick(chains)

    def _chains(self, config: tuple[int, ...], name: str | None) -> tuple[tuple[Transition, ...], ...]:
        """Per atomic state, the candidate transitions (state then ancestors, document order)."""
        out = []
        states = self.states
        tick = self.tick
        for s in config:
            node = states[s]
            if not node.is_atomic:
                continue
            tick()
            chain = []
            for anc in (s, *node.ancestors):
                for t in states[anc].transitions:
                    if name is None:
                        if not t.events:
                            chain.append(t)
                    elif t.events and _name_match(t.events, name):
                        chain.append(t)
                if chain and chain[-1].cond is None:
                    break  # nothing after an unconditional match can be selected
            if chain:
                out.append(tuple(chain))
        return tuple(out)

    def _pick(self, chains: tuple[tuple[Transition, ...], ...]) -> list[Transition]:
        enabled: list[Transition] = []
        conds = self.prog.cond
        for chain in chains:
            for t in chain:
                cond = conds[t.index]
                if cond is None or self.condition_match(t, cond):
                    # an ancestor's transition can be picked for two atomic states: once is enough
                    for e in enabled:
                        if e is t:
                            break
                    else:
                        enabled.append(t)
                    break
        if len(enabled) < 2:
            return enabled
        return self.remove_conflicting_transitions(enabled)

    def remove_conflicting_transitions(self, enabled: list[Transition]) -> list[Transition]:
        """``removeConflictingTransitions``: optimal enabled set, document-order priority."""
        config = self._key
        if config is None:
            config = self.config_key()
        key = (config, tuple([t.index for t in enabled]))
        cached = self.cache["conflict"].get(key)
        if cached is not None:
            return list(cached)
        uses_history = [False]
        filtered: list[Transition] = []
        for t1 in enabled:
            preempted = False
            to_remove = []
            exit1 = self.compute_exit_set([t1], uses_history)
            for t2 in filtered:
                self.tick()
                if exit1 & self.compute_exit_set([t2], uses_history):
                    if self.states[t1.source].is_descendant_of(self.states[t2.source]):
                        to_remove.append(t2)
                    else:
                        preempted = True
                        break
            if not preempted:
                for t3 in to_remove:
                    filtered.remove(t3)
                filtered.append(t1)
        if not uses_history[0]:
            _put(self.cache["conflict"], key, tuple(filtered))
        return filtered

    # ------------------------------------------------------------------ microstep
    def microstep(self, enabled: list[Transition]) -> None:
        """``microstep``: exit, run transition content, enter."""
        self.microstep_no += 1
        if self.microstep_no + self.idle_no > self.max_rounds:
            raise OutOfRounds()
        # check_items(), inline: the tick and the bound are all it does on a drive's hot path
        self.ticks -= 1
        if self.ticks <= 0 or len(self.internal) + len(self.effects) > self.max_items:
            self.ticks += 1
            self.check_items()
        self.ordinal_at_microstep = self.ordinal
        # the key of the transition set (most microsteps take one transition: no comprehension)
        tkey = (enabled[0].index,) if len(enabled) == 1 else tuple([t.index for t in enabled])
        self.exit_states(enabled, tkey)
        self.execute_transition_content(enabled)
        self.enter_states(enabled, tkey)
        if self.timeouts:
            self.rearm_stays(enabled)

    def _exit_plan(self, enabled: list[Transition],
                   tkey: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], bool, bool]:
        """The exit set in exit order, whether any exited state records history, and
        whether any has work beyond leaving the configuration (onexit, invokes)."""
        key = (self.config_key(), tuple([t.index for t in enabled]) if tkey is None else tkey)
        plan = self.cache["plan"].get(key)
        if plan is None:
            uses_history = [False]
            exit_set = self.compute_exit_set(enabled, uses_history)
            st = self.states
            plan = (tuple(sorted(exit_set, reverse=True)), any(st[s].histories for s in exit_set),
                    any(st[s].onexit or st[s].invokes for s in exit_set))
            if not uses_history[0]:
                _put(self.cache["plan"], key, plan)
        return plan

    def _entry_plan(self, enabled: list[Transition], tkey: tuple[int, ...] | None = None) -> tuple[Any, ...]:
        """The entry set in entry order, default entries, default history content, and
        whether any entered state has work beyond joining the configuration.

        Computed after the exit (history values recorded by the exit matter) and cached
        only when no history state was consulted: then it depends on the transitions alone.
        """
        key = tuple([t.index for t in enabled]) if tkey is None else tkey
        plan = self.cache["entry"].get(key)
        if plan is None:
            uses_history = [False]
            to_enter: list[int] = []
            default_entry: set[int] = set()
            default_history: dict[int, Any] = {}
            self.compute_entry_set(enabled, to_enter, default_entry, default_history, uses_history)
            st = self.states
            busy = self.late or bool(default_history) or any(
                st[s].onentry or st[s].invokes or st[s].timeouts or st[s].kind == "final" or
                (s in default_entry and st[s].initial is not None and st[s].initial.content)  # type: ignore[union-attr]
                for s in to_enter)
            plan = (tuple(sorted(set(to_enter))), frozenset(default_entry), default_history, busy)
            if not uses_history[0]:
                _put(self.cache["entry"], key, plan)
        return plan

    def exit_states(self, enabled: list[Transition], tkey: tuple[int, ...] | None = None) -> None:
        """``exitStates``: record history, run onexit, cancel invokes, leave the configuration."""
        key = self._key
        plan = None if key is None or tkey is None else self.cache["plan"].get((key, tkey))
        to_exit, records_history, busy = self._exit_plan(enabled, tkey) if plan is None else plan
        if not to_exit:
            return
        self._key = None
        if not busy and not records_history and not self.timeouts:
            self.config.difference_update(to_exit)  # nothing to run: leaving is all there is
            return
        if self.states_to_invoke:
            for s in to_exit:
                self.states_to_invoke.discard(s)
        states = self.states
        if records_history:
            for s in to_exit:
                self.tick()
                node = states[s]
                for h in node.histories:
                    hnode = states[h]
                    if hnode.history_type == "deep":
                        val = tuple(c for c in sorted(self.config)
                                    if states[c].is_atomic and states[c].is_descendant_of(node))
                    else:
                        val = tuple(c for c in sorted(self.config) if states[c].parent == s)
                    self.history[h] = val
        onexit = self.prog.onexit
        for s in to_exit:
            for block in onexit[s]:
                self.execute_content(block, s)
            if states[s].invokes:
                self.cancel_invokes(s)
            if self.timeouts:
                self.cancel_timeouts(s)
            self.config.discard(s)

    def compute_exit_set(self, transitions: list[Transition], uses_history: list[bool]) -> set[int]:
        """``computeExitSet``: active descendants of each transition's domain."""
        out: set[int] = set()
        states = self.states
        for t in transitions:
            self.tick()
            if t.targets:
                domain = self.get_transition_domain(t, uses_history)
                if domain is None:
                    continue
                d = states[domain]
                for s in self.config:
                    if d.index < s <= d.last:
                        out.add(s)
        return out

    def execute_transition_content(self, enabled: list[Transition]) -> None:
        """``executeTransitionContent``."""
        content = self.prog.content
        for t in enabled:
            if t.content:
                self.execute_content(content[t.index], t.source)

    def enter_states(self, enabled: list[Transition], tkey: tuple[int, ...] | None = None) -> None:
        """``enterStates``: enter in entry order, run onentry, raise ``done.state.*``."""
        plan = None if tkey is None else self.cache["entry"].get(tkey)
        to_enter, default_entry, default_history, busy = self._entry_plan(enabled, tkey) if plan is None else plan
        if not busy:
            self.config.update(to_enter)  # nothing to run: joining is all there is
            self._key = None
            return
        states = self.states
        prog = self.prog
        onentry = prog.onentry
        for s in to_enter:
            node = states[s]
            self.config.add(s)
            self._key = None
            if node.invokes:  # statesToInvoke: a state without <invoke> would start nothing
                self.states_to_invoke.add(s)
            if self.late and s not in self.initialized:
                self.initialized.add(s)
                self.initialize_data(node)
            for block in onentry[s]:
                self.execute_content(block, s)
            if s in default_entry and node.initial is not None and node.initial.content:
                self.execute_content(prog.content[node.initial.index], s)
            if s in default_history:
                self.execute_content(prog.block(default_history[s]), s)
            if node.timeouts:
                self.arm_timeouts(node)
            if node.kind == "final":
                self.tick()  # is_in_final_state below walks the parallel's children each time
                if node.parent == 0:
                    self.running = False
                else:
                    parent = states[node.parent]
                    self.internal.append(Event("done.state." + parent.id, self.done_data(node), "internal"))
                    gp = parent.parent
                    if gp is not None and states[gp].kind == "parallel" and \
                            all(self.is_in_final_state(c) for c in states[gp].children):
                        self.internal.append(Event("done.state." + states[gp].id, None, "internal"))

    def compute_entry_set(self, transitions: list[Transition], to_enter: list[int], default_entry: set[int],
                          default_history: dict[int, Any], uses_history: list[bool]) -> None:
        """``computeEntrySet``."""
        for t in transitions:
            for s in t.targets:
                self.add_descendant_states_to_enter(s, to_enter, default_entry, default_history, uses_history)
            ancestor = self.get_transition_domain(t, uses_history)
            for s in self.get_effective_target_states(t, uses_history):
                self.add_ancestor_states_to_enter(s, ancestor, to_enter, default_entry, default_history,
                                                  uses_history)

    def add_descendant_states_to_enter(self, s: int, to_enter: list[int], default_entry: set[int],
                                       default_history: dict[int, Any], uses_history: list[bool]) -> None:
        """``addDescendantStatesToEnter``."""
        self.tick()
        node = self.states[s]
        if node.kind == "history":
            uses_history[0] = True
            recorded = self.history.get(s)
            if recorded:
                for r in recorded:
                    self.add_descendant_states_to_enter(r, to_enter, default_entry, default_history, uses_history)
                for r in recorded:
                    self.add_ancestor_states_to_enter(r, node.parent, to_enter, default_entry, default_history,
                                                      uses_history)
            else:
                t = node.initial
                assert t is not None and node.parent is not None
                if t.content:
                    default_history[node.parent] = t.content
                for r in t.targets:
                    self.add_descendant_states_to_enter(r, to_enter, default_entry, default_history, uses_history)
                for r in t.targets:
                    self.add_ancestor_states_to_enter(r, node.parent, to_enter, default_entry, default_history,
                                                      uses_history)
            return
        if s not in to_enter:
            to_enter.append(s)
        if node.kind == "compound":
            default_entry.add(s)
            assert node.initial is not None
            for r in node.initial.targets:
                self.add_descendant_states_to_enter(r, to_enter, default_entry, default_history, uses_history)
            for r in node.initial.targets:
                self.add_ancestor_states_to_enter(r, s, to_enter, default_entry, default_history, uses_history)
        elif node.kind == "parallel":
            for child in node.children:
                c = self.states[child]
                if not any(c.index <= e <= c.last for e in to_enter):
                    self.add_descendant_states_to_enter(child, to_enter, default_entry, default_history,
                                                        uses_history)

    def add_ancestor_states_to_enter(self, s: int, ancestor: int | None, to_enter: list[int],
                                     default_entry: set[int], default_history: dict[int, Any],
                                     uses_history: list[bool]) -> None:
        """``addAncestorStatesToEnter``."""
        for anc in self.get_proper_ancestors(s, ancestor):
            self.tick()
            if anc not in to_enter:
                to_enter.append(anc)
            node = self.states[anc]
            if node.kind == "parallel":
                for child in node.children:
                    c = self.states[child]
                    if not any(c.index <= e <= c.last for e in to_enter):
                        self.add_descendant_states_to_enter(child, to_enter, default_entry, default_history,
                                                            uses_history)

    def get_proper_ancestors(self, s: int, ancestor: int | None) -> list[int]:
        """``getProperAncestors``: ancestors of ``s`` below ``ancestor`` (root never included)."""
        out = []
        for a in self.states[s].ancestors:
            if a == ancestor or a == 0:
                break
            out.append(a)
        return out

    def is_in_final_state(self, s: int) -> bool:
        """``isInFinalState``."""
        node = self.states[s]
        if node.kind == "compound" or node.kind == "root":
            return any(self.states[c].kind == "final" and c in self.config for c in node.children)
        if node.kind == "parallel":
            return all(self.is_in_final_state(c) for c in node.children)
        return False

    def get_transition_domain(self, t: Transition, uses_history: list[bool]) -> int | None:
        """``getTransitionDomain``."""
        tstates = self.get_effective_target_states(t, uses_history)
        if not tstates:
            return None
        if t.source == 0:
            return 0
        src = self.states[t.source]
        if t.type == "internal" and src.kind == "compound" and all(src.index < s <= src.last for s in tstates):
            return t.source
        return self.find_lcca([t.source, *tstates])

    def find_lcca(self, states: list[int]) -> int:
        """``findLCCA``: the least common compound (or root) ancestor."""
        head, tail = states[0], states[1:]
        for anc in self.states[head].ancestors:
            a = self.states[anc]
            if a.kind in ("compound", "root") and all(a.index < s <= a.last for s in tail):
                return anc
        return 0

    def get_effective_target_states(self, t: Transition, uses_history: list[bool]) -> list[int]:
        """``getEffectiveTargetStates``: history states replaced by what they stand for."""
        out: list[int] = []
        for s in t.targets:
            self.tick()
            node = self.states[s]
            if node.kind == "history":
                uses_history[0] = True
                recorded = self.history.get(s)
                if recorded:
                    for r in recorded:
                        if r not in out:
                            out.append(r)
                else:
                    assert node.initial is not None
                    for r in self.get_effective_target_states(node.initial, uses_history):
                        if r not in out:
                            out.append(r)
            elif s not in out:
                out.append(s)
        return out
