"""Chart commands: ``validate`` and ``diagram`` (Mermaid)."""

from __future__ import annotations

import argparse
from typing import Any

from .. import Chart
from ._base import emit, load_chart_file

__all__ = ["register", "mermaid"]


def cmd_validate(args: argparse.Namespace) -> int:
    chart, _ = load_chart_file(args.chart)
    kinds: dict[str, int] = {}
    for s in chart.states[1:]:
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
    data = {"valid": True, "name": chart.name, "identity": chart.identity, "datamodel": chart.datamodel,
            "states": len(chart.states) - 1, "transitions": len(chart.transitions), "kinds": kinds}
    emit(args, data, f"{args.chart}: valid ({chart.name}, {len(chart.states) - 1} states, "
                     f"{chart.datamodel} datamodel)\n  identity {chart.identity}")
    return 0


def mermaid(chart: Chart) -> str:
    """Render a chart as a Mermaid ``stateDiagram-v2``."""
    st = chart.states
    lines = ["stateDiagram-v2"]

    def name(i: int) -> str:
        return st[i].id.replace("-", "_").replace(".", "_").replace(":", "_")

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
                            lines.append(f"{indent}    }}")
                        else:
                            lines.append(f"{indent}    {name(region)}")
                else:
                    emit(k, indent + "    ")
                lines.append(f"{indent}}}")
            if c.kind == "final":
                lines.append(f"{indent}{name(k)} --> [*]")
            for h in c.histories:
                lines.append(f"{indent}state \"{st[h].id} (H{'*' if st[h].history_type == 'deep' else ''})\" "
                             f"as {name(h)}")

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
        label = label.replace(":", "\\:")
        for tgt in t.targets:
            lines.append(f"    {name(t.source)} --> {name(tgt)} : {label}")
    for s in st[1:]:
        for tm in s.timeouts:
            lines.append(f"    note right of {name(s.index)} : timeout {tm.name} ({tm.kind})")
    return "\n".join(lines)


def cmd_diagram(args: argparse.Namespace) -> int:
    chart, _ = load_chart_file(args.chart)
    text = mermaid(chart)
    emit(args, {"mermaid": text}, text)
    return 0


def register(sub: Any) -> None:
    """Add this module's commands to the ``statebound`` parser."""
    s = sub.add_parser("validate", help="check a chart")
    s.add_argument("chart")
    s.set_defaults(fn=cmd_validate)

    s = sub.add_parser("diagram", help="print a chart as a Mermaid stateDiagram-v2")
    s.add_argument("chart")
    s.set_defaults(fn=cmd_diagram)
