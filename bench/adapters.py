"""Engine adapters for the interpreter bench.

Every adapter turns one workload into a :class:`Runner`: ``run(n)`` sends ``n`` ``next``
events through the engine in a tight loop, and ``leaves()`` / ``counter()`` report the
active atomic states and the realistic chart's ``n``, so ``run.py`` can check that every
engine really took the transitions before it is timed.

Engines and what they execute
-----------------------------
statebound          ``sb.Chart.from_scxml(text)``, ``sb.Interpreter(chart)``,
                    ``interp.start(session_id=...)``, then ``pos, eff = interp.drive(pos, "next")``.
                    ``<log>`` becomes a ``Log`` effect in the returned tuple (no I/O).
sb no-cache         diagnostic: the same with ``Interpreter(chart, static_path=False)``: the
                    full W3C macrostep on every drive, no per-chart plans; see
                    :func:`statebound_full`. Not a peer, not in the ratios.
python-statemachine ``statemachine.io.load(text, format="scxml")`` (3.2.2, default
                    ``trusted=False``: the restricted AST evaluator) gives a ``StateChart``
                    class; ``sm = cls()``, then ``sm.send("next")``. The very same SCXML files.
                    Its ``<log>`` is a ``print()``; the bench points ``sys.stdout`` at
                    ``os.devnull`` while it runs, so the message is formatted and written to
                    the null device.
transitions         built in Python: ``Machine`` for flat/realistic, ``HierarchicalMachine``
                    for nested/parallel; ``model.next()``. ``<assign>`` is a callback doing
                    ``model.n += 1`` and ``<log>`` a call to a no-op ``log(label, value)``.
sismic              ``sismic.io.import_from_yaml(filepath=charts/<w>.sismic.yaml)``,
                    ``Interpreter(sc, initial_context={"log": no-op})``, then per event
                    ``queue("next")`` + ``execute_once()``. ``<assign>`` is ``n += 1`` in the
                    YAML's action code, ``<log>`` the same no-op ``log(label, value)``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

CHARTS = Path(__file__).resolve().parent / "charts"

WORKLOADS = ("flat", "nested", "parallel", "realistic")

#: atomic state ids per workload (used to read leaves out of each engine's configuration)
ATOMIC = {
    "flat": {"a", "b", "c"},
    "nested": {"s111", "s211"},
    "parallel": {"r1a", "r1b", "r2a", "r2b"},
    "realistic": {"a", "b", "c"},
}


def expected(workload: str, k: int) -> tuple[frozenset[str], int | None]:
    """Active atomic states, and ``n`` for the realistic chart, after ``k`` events."""
    if workload in ("flat", "realistic"):
        leaves = frozenset({"abc"[k % 3]})
    elif workload == "nested":
        leaves = frozenset({"s111" if k % 2 == 0 else "s211"})
    elif workload == "parallel":
        leaves = frozenset({"r1a", "r2a"} if k % 2 == 0 else {"r1b", "r2b"})
    else:  # pragma: no cover
        raise KeyError(workload)
    # realistic: the initial entry into `a` runs its onentry (n = 1), then +3 per event
    return leaves, (1 + 3 * k if workload == "realistic" else None)


def scxml_text(workload: str) -> str:
    return (CHARTS / f"{workload}.scxml").read_text()


@dataclass
class Runner:
    run: Callable[[int], None]
    leaves: Callable[[], frozenset[str]]
    counter: Callable[[], int | None]
    #: context manager active around timed runs (e.g. stdout to /dev/null)
    quiet: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


def _null_log(label, value):  # the peers' <log>: evaluate the value, hand it over, drop it
    return None


# --------------------------------------------------------------------------- statebound
def statebound_version() -> str:
    import statebound as sb

    # import-time check: the interpreter is being written; fail with the real reason
    sb.Chart, sb.Interpreter  # noqa: B018  (AttributeError if not there yet)
    return getattr(sb, "__version__", "?")


class _AlwaysMiss(dict):
    """Stands in for the static-path cache of a statebound from before ``static_path=``
    (the baseline of the macrostep section) and never answers, so each drive takes the
    full W3C macrostep."""

    def get(self, key, default=None):
        return None


def statebound(workload: str, *, full_path: bool = False) -> Runner:
    import statebound as sb

    chart = sb.Chart.from_scxml(scxml_text(workload), name=workload)
    interp = sb.Interpreter(chart, static_path=not full_path)
    pos, _effects = interp.start(session_id=f"bench-{workload}")
    box = [pos]
    drive = interp.drive
    atomic = ATOMIC[workload]

    def run(n: int) -> None:
        pos = box[0]
        for _ in range(n):
            pos, _eff = drive(pos, "next")
        box[0] = pos

    def counter():
        dm = box[0].datamodel
        return dm.get("n") if "n" in dm else None

    return Runner(run, lambda: frozenset(box[0].configuration) & atomic, counter)


def statebound_full(workload: str) -> Runner:
    """Diagnostic: statebound with its static path switched off.

    ``Interpreter.drive`` answers a macrostep whose shape does not depend on data from a
    per-chart plan (all four charts here; on ``realistic`` the conditions and content
    still run, compiled). ``Interpreter(chart, static_path=False)`` runs the full W3C
    macrostep every time, so the column shows what that costs on the same chart.
    """
    return statebound(workload, full_path=True)


# ------------------------------------------------------------------ python-statemachine
def psm_version() -> str:
    from importlib.metadata import version

    import statemachine.io  # noqa: F401

    return version("python-statemachine")


@contextlib.contextmanager
def _stdout_to_devnull():
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        yield


def python_statemachine(workload: str) -> Runner:
    from statemachine.io import load

    cls = load(scxml_text(workload), format="scxml")
    with _stdout_to_devnull():  # the realistic chart logs on its initial entry
        sm = cls()
    send = sm.send
    atomic = ATOMIC[workload]

    def run(n: int) -> None:
        for _ in range(n):
            send("next")

    def leaves():
        return frozenset(str(s) for s in sm.configuration_values) & atomic

    def counter():
        return getattr(sm.model, "n", None) if workload == "realistic" else None

    return Runner(run, leaves, counter, quiet=_stdout_to_devnull)


# --------------------------------------------------------------------------- transitions
def transitions_version() -> str:
    from importlib.metadata import version

    import transitions  # noqa: F401

    return version("transitions")


class _Model:
    n = 0


def transitions_(workload: str) -> Runner:
    from transitions import Machine
    from transitions.extensions import HierarchicalMachine

    model = _Model()
    atomic = ATOMIC[workload]
    if workload == "flat":
        Machine(
            model=model, states=["a", "b", "c"], initial="a", auto_transitions=False,
            transitions=[["next", "a", "b"], ["next", "b", "c"], ["next", "c", "a"]],
        )
    elif workload == "realistic":
        def bump(label):
            def cb(*_a, **_k):
                model.n += 1
                _null_log(label, model.n)
            return cb

        def guard(*_a, **_k):
            return model.n >= 0

        nxt = {"a": "b", "b": "c", "c": "a"}
        states = [
            {"name": s, "on_enter": bump(f"enter {s}"), "on_exit": bump(f"exit {s}")}
            for s in nxt
        ]
        # transitions runs before -> on_exit -> on_enter, SCXML runs onexit -> transition
        # content -> onentry: the order differs, the work per event (1 guard, 3 assigns,
        # 3 logs) is the same.
        trans = [
            {"trigger": "next", "source": s, "dest": t, "conditions": guard,
             "before": bump(f"{s} to {t}")}
            for s, t in nxt.items()
        ]
        model.n = 0
        Machine(model=model, states=states, transitions=trans, initial="a",
                auto_transitions=False)
        # SCXML enters `a` through its onentry at start (n = 1); Machine does not run
        # on_enter for the initial state, so mirror it by hand.
        model.n = 1
    elif workload == "nested":
        HierarchicalMachine(
            model=model, auto_transitions=False,
            states=[
                {"name": "s1", "initial": "s11", "children": [
                    {"name": "s11", "initial": "s111", "children": ["s111"]}]},
                {"name": "s2", "initial": "s21", "children": [
                    {"name": "s21", "initial": "s211", "children": ["s211"]}]},
            ],
            transitions=[["next", "s1_s11_s111", "s2_s21_s211"],
                         ["next", "s2_s21_s211", "s1_s11_s111"]],
            initial="s1",
        )
    elif workload == "parallel":
        def region(r):
            return {"name": r, "initial": f"{r}a", "children": [f"{r}a", f"{r}b"],
                    "transitions": [["next", f"{r}a", f"{r}b"], ["next", f"{r}b", f"{r}a"]]}

        HierarchicalMachine(
            model=model, auto_transitions=False,
            states=[{"name": "p", "parallel": [region("r1"), region("r2")]}],
            initial="p",
        )
    else:  # pragma: no cover
        raise KeyError(workload)

    trigger = model.next

    def run(n: int) -> None:
        for _ in range(n):
            trigger()

    def leaves():
        st = model.state
        names = st if isinstance(st, list) else [st]
        flat: list[str] = []

        def walk(x):
            if isinstance(x, (list, tuple)):
                for y in x:
                    walk(y)
            else:
                flat.append(str(x).split("_")[-1])

        walk(names)
        return frozenset(flat) & atomic

    return Runner(run, leaves, lambda: model.n if workload == "realistic" else None)


# -------------------------------------------------------------------------------- sismic
def sismic_version() -> str:
    from importlib.metadata import version

    import sismic  # noqa: F401

    return version("sismic")


def sismic(workload: str) -> Runner:
    from sismic.interpreter import Interpreter
    from sismic.io import import_from_yaml

    sc = import_from_yaml(filepath=str(CHARTS / f"{workload}.sismic.yaml"))
    interp = Interpreter(sc, initial_context={"log": _null_log})
    interp.execute_once()  # initial stabilization: enters the initial configuration
    queue, once = interp.queue, interp.execute_once
    atomic = ATOMIC[workload]

    def run(n: int) -> None:
        for _ in range(n):
            queue("next")
            once()

    def counter():
        return interp.context.get("n") if workload == "realistic" else None

    return Runner(run, lambda: frozenset(interp.configuration) & atomic, counter)


#: engine name -> (version probe, factory, workloads it runs)
ENGINES: dict[str, tuple[Callable[[], str], Callable[[str], Runner], tuple[str, ...]]] = {
    "statebound": (statebound_version, statebound, WORKLOADS),
    "sb no-cache": (statebound_version, statebound_full, WORKLOADS),
    "python-statemachine": (psm_version, python_statemachine, WORKLOADS),
    "transitions": (transitions_version, transitions_, WORKLOADS),
    "sismic": (sismic_version, sismic, WORKLOADS),
}

PEERS = ("python-statemachine", "transitions", "sismic")
