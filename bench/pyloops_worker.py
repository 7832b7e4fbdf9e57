#!/usr/bin/env python
"""One statebound version, timed on command: the worker behind ``bench_pyloops.py``.

``python pyloops_worker.py SRC`` imports ``statebound`` from ``SRC`` and answers JSON lines:
``{"cells": [...], "target": s}`` builds and calibrates a runner per workload (``{"n": ...}``);
``{"run": cell}`` drives ``n`` events and answers ``{"cpu": seconds}`` (process CPU time).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _chart(content: str, data: str = '<data id="n" expr="0"/>') -> str:
    return (f'<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" initial="a">'
            f'<datamodel>{data}</datamodel>'
            f'<state id="a"><transition event="next" target="b">{content}</transition></state>'
            f'<state id="b"><transition event="next" target="a">{content}</transition></state></scxml>')


CHARTS = {
    "genexp50": _chart('<assign location="n" expr="sum(x for x in range(50))"/>'),
    "for50": _chart("<script>t = 0\nfor x in range(50):\n    t += x\nn = t</script>"),
    "lambda": _chart('<assign location="n" expr="(lambda a: a + 1)(n)"/>'),
    "foreach10": _chart('<foreach array="xs" item="i"><assign location="n" expr="n + i"/></foreach>',
                        '<data id="n" expr="0"/><data id="xs" expr="list(range(10))"/>'),
}


def _make(sb: Any, cell: str) -> tuple[str, Any]:
    interp = sb.Interpreter(sb.Chart.from_scxml(CHARTS[cell], name=cell))
    box = [interp.start(session_id=f"bench-{cell}")[0]]
    drive = interp.drive

    def run(n: int) -> None:
        pos = box[0]
        for _ in range(n):
            pos, _eff = drive(pos, "next")
        if pos.datamodel.get("n") is None:
            raise AssertionError(f"the chart lost its counter: {pos.datamodel}")
        box[0] = pos
    return cell, run


def main() -> int:
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, str(HERE))
    import statebound as sb
    from macrostep_worker import serve

    CHARTS["realistic"] = (HERE / "charts" / "realistic.scxml").read_text()
    return serve(sb, _make)


if __name__ == "__main__":
    sys.exit(main())
