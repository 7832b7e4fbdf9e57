"""Chart commands: ``validate`` and ``diagram`` (Mermaid)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from typing import Any

from .. import Chart, Position
from ..host.store import TimerRow
from ._base import add_trust_option, emit, iso_ms, load_chart_file

__all__ = ["register", "mermaid", "instance_diagram"]


def cmd_validate(args: argparse.Namespace) -> int:
    chart, _ = load_chart_file(args.chart, args.trust)
    kinds: dict[str, int] = {}
    for s in chart.states[1:]:
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
    data = {"valid": True, "name": chart.name, "identity": chart.identity, "datamodel": chart.datamodel,
            "states": len(chart.states) - 1, "transitions": len(chart.transitions), "kinds": kinds}
    emit(args, data, f"{args.chart}: valid ({chart.name}, {len(chart.states) - 1} states, "
                     f"{chart.datamodel} datamodel)\n  identity {chart.identity}")
    return 0


def _node_names(chart: Chart) -> list[str]:
    """A Mermaid name per state: its id with what Mermaid cannot take as ``_``, and, where two
    ids come out the same (``a-b`` and ``a_b``), the state's index after it, so that no two
    states are drawn as one."""
    names = [re.sub(r"\W", "_", s.id) for s in chart.states]
    taken: dict[str, int] = {}
    for n in names:
        taken[n] = taken.get(n, 0) + 1
    return [f"{n}__{i}" if taken[n] > 1 else n for i, n in enumerate(names)]


def _label(text: str) -> str:
    # one line (a newline in a cond ended the statement), and ':' escaped (it starts the label)
    return " ".join(text.split()).replace(":", "\\:")


def mermaid(chart: Chart, *, active: Iterable[int] = (), notes: Iterable[tuple[int, str]] = ()) -> str:
    """Render a chart as a Mermaid ``stateDiagram-v2``.

    :param active: state indexes to highlight (class ``active``). Mermaid styles simple
        states only, so pass the atomic ones.
    :param notes: ``(state index, text)`` pairs, drawn as notes beside those states.
    """
    st = chart.states
    lines = ["stateDiagram-v2"]
    names = _node_names(chart)

    def name(i: int) -> str:
        return names[i]

    def histories(c: Any, indent: str) -> None:
        for h in c.histories:
            lines.append(f"{indent}state \"{st[h].id} (H{'*' if st[h].history_type == 'deep' else ''})\" "
                         f"as {name(h)}")

    def emit(i: int, indent: str) -> None:
        node = st[i]
        kids = list(node.children)
        if node.initial is not None and kids:
            for t in node.initial.targets:
                lines.append(f"{indent}[*] --> {name(t)}")
        for k in kids:
            c = st[k]
            if c.kind in ("compound", "parallel"):
                lines.append(f"{indent}state {name(k)} {{")
                if c.kind == "parallel":
                    for j, region in enumerate(c.children):
                        if j:
                            lines.append(f"{indent}    --")
                        r = st[region]
                        if r.children:
                            lines.append(f"{indent}    state {name(region)} {{")
                            emit(region, indent + "        ")
                            histories(r, indent + "        ")   # a region's own histories
                            lines.append(f"{indent}    }}")
                        else:
                            lines.append(f"{indent}    {name(region)}")
                else:
                    emit(k, indent + "    ")
                lines.append(f"{indent}}}")
            if c.kind == "final":
                lines.append(f"{indent}{name(k)} --> [*]")
            histories(c, indent)

    emit(0, "    ")
    for t in chart.transitions:
        if not t.targets or t.source == 0 or st[t.source].kind == "history":
            continue
        src = st[t.source]
        if src.initial is t:
            continue
        label = " ".join(t.events) or "(eventless)"
        if t.cond is not None:
            label += f" [{t.cond.src}]"
        label = _label(label)
        for tgt in t.targets:
            lines.append(f"    {name(t.source)} --> {name(tgt)} : {label}")
    for s in st[1:]:
        for tm in s.timeouts:
            lines.append(f"    note right of {name(s.index)} : timeout {tm.name} ({tm.kind})")
    for i, text in notes:
        # the block form: a one-line note ends its text at the first ':', and times have colons
        lines += [f"    note left of {name(i)}", f"        {text}", "    end note"]
    marked = sorted(set(active))
    if marked:
        lines.append("    classDef active fill:#ffd54f,stroke:#e65100,stroke-width:3px")
        lines.append(f"    class {','.join(name(i) for i in marked)} active")
    return "\n".join(lines)


def instance_diagram(pos: Position, timers: Iterable[TimerRow]) -> str:
    """The chart of ``pos`` with its active states highlighted and its pending timers as
    notes: a named timeout beside the state that armed it, any other timer beside the
    first active leaf state."""
    chart = pos.chart
    leaves = [i for i in pos.states if chart.states[i].kind in ("atomic", "final")]
    armed_by = {t.ordinal: t.state for t in pos.timeouts}
    notes = []
    for row in timers:
        where = armed_by.get(row.ordinal, leaves[0] if leaves else None)
        if where is None:
            continue
        what = row.name or row.event.get("name") or row.send_id
        notes.append((where, f"timer {row.ordinal} {what} due {iso_ms(row.ready_at_ms)} ({row.state})"))
    return mermaid(chart, active=leaves, notes=notes)



def cmd_diagram(args: argparse.Namespace) -> int:
    chart, _ = load_chart_file(args.chart)
    text = mermaid(chart)
    emit(args, {"mermaid": text}, text)
    return 0


def register(sub: Any) -> None:
    """Add this module's commands to the ``statebound`` parser."""
    s = sub.add_parser("validate", help="check a chart")
    s.add_argument("chart")
    add_trust_option(s)
    s.set_defaults(fn=cmd_validate)

    s = sub.add_parser("diagram", help="print a chart as a Mermaid stateDiagram-v2")
    s.add_argument("chart")
    s.set_defaults(fn=cmd_diagram)
