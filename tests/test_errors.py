"""The error tree: every error statebound raises on purpose is a ``StateboundError``.

API mistakes (a setting out of range, start data that is not a map of variable names, an
empty idempotency key...) raise :class:`~statebound.InvalidArgument`, which is also the
``TypeError`` and ``ValueError`` they raised before it existed; a bad instance id raises
:class:`~statebound.InvalidInstanceId` whether the host's rules or the store's refuse it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import statebound as sb
from statebound.datamodel.budget import Budget

SRC = Path(sb.__file__).resolve().parent

COUNTER = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="counter"
       initial="s"><datamodel><data id="n" expr="0"/></datamodel>
  <state id="s"><transition event="inc"><assign location="n" expr="n + 1"/></transition></state>
</scxml>'''

#: where a builtin error is raised on purpose, and why it stays one: none reaches a caller
INTERNAL = {
    ("aws/_payload.py", "_no_constants"): "a json parse_constant hook; from_json turns it into PayloadNotJSON",
    ("datamodel/base.py", "_default"): "msgpack's default hook; pack_vars turns it into SerializationError",
    ("datamodel/ecmascript/values.py", "_json_default"): "json's default hook; its caller reports the value",
    ("datamodel/python.py", "_safe_type"): "type() inside chart code: becomes error.execution, as Python's would",
    ("_fastinit.py", "fast_init"): "a class-definition check of the library's own dataclasses",
    ("interpreter/values.py", "_setters"): "a class-definition check of the library's own values",
}
BUILTIN = {"ValueError", "TypeError", "KeyError"}


def _builtin_raises() -> set[tuple[str, str]]:
    found = set()
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                exc = node.exc if isinstance(node, ast.Raise) else None
                if isinstance(exc, ast.Call):
                    exc = exc.func
                if isinstance(exc, ast.Name) and exc.id in BUILTIN:
                    found.add((path.relative_to(SRC).as_posix(), fn.name))
    return found


def test_builtin_errors_are_raised_only_where_none_reaches_a_caller():
    found = _builtin_raises()
    assert found - set(INTERNAL) == set(), "raise a StateboundError subclass (InvalidArgument...) instead"
    assert set(INTERNAL) <= found, "an allowed site is gone: drop it from INTERNAL"


@pytest.fixture
def host():
    h = sb.Host([sb.Chart.from_scxml(COUNTER)], clock=sb.ManualClock(now_ms=0))
    h.start("counter", "c1")
    return h


MISTAKES = {
    "Budget cpu_ms": (lambda h: Budget(cpu_ms=0), ValueError),
    "Budget memory": (lambda h: Budget(memory_bytes=10), ValueError),
    "Host max_batch": (lambda h: sb.Host([], max_batch=0), ValueError),
    "Host.register": (lambda h: h.register("not a chart"), TypeError),
    "Interpreter chart": (lambda h: sb.Interpreter("not a chart"), TypeError),
    "Interpreter max_rounds": (lambda h: sb.Interpreter(h.chart("counter"), max_rounds=0), ValueError),
    "start data not a map": (lambda h: h.start("counter", "c2", ["n", 1]), TypeError),
    "start data key": (lambda h: h.start("counter", "c2", {"1n": 1}), ValueError),
    "empty idempotency key": (lambda h: h.send("c1", "inc", idempotency_key=""), ValueError),
    "long idempotency key": (lambda h: h.send("c1", "inc", idempotency_key="k" * 100_000), ValueError),
    "two keys": (lambda h: h.send("c1", sb.Event("inc", idempotency_key="a"), idempotency_key="b"), ValueError),
    "clock backwards": (lambda h: h.clock.advance(-1), ValueError),
    "Sweeper batch": (lambda h: sb.Sweeper(h, batch=0), ValueError),
    "invoke token": (lambda h: h.complete_invoke("c1", "inv", token="someone-else:inv:1"), ValueError),
    "history=": (lambda h: sb.Host([], history="yes"), TypeError),
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_api_mistakes_raise_invalid_argument_and_the_builtin_they_raised_before(host, name):
    call, before = MISTAKES[name]
    n = host.get("c1").datamodel["n"]
    with pytest.raises(sb.InvalidArgument) as info:
        call(host)
    assert isinstance(info.value, sb.StateboundError) and isinstance(info.value, before)
    assert str(info.value)                                         # says which argument and why
    assert host.get("c1").datamodel["n"] == n                      # nothing was done


@pytest.mark.parametrize("iid", ["", "a::b", "x" * 513, 7])
def test_a_bad_instance_id_is_invalid_instance_id_from_the_host_as_from_the_store(host, iid):
    with pytest.raises(sb.InvalidInstanceId) as info:
        host.start("counter", iid)
    assert isinstance(info.value, ValueError) and info.value.instance_id == iid
    assert host.store.list_positions() and [r.instance_id for r in host.store.list_positions()] == ["c1"]


def test_an_unknown_state_is_unknown_state_and_still_a_key_error():
    chart = sb.Chart.from_scxml(COUNTER)
    with pytest.raises(sb.UnknownState) as info:
        chart.state("nope")
    assert isinstance(info.value, KeyError) and isinstance(info.value, sb.ChartError)
    assert (info.value.chart, info.value.state_id) == ("counter", "nope")
    assert str(info.value) == "chart 'counter' has no state 'nope'"   # not KeyError's quoted repr
    assert chart.state("s").id == "s"


def test_the_cli_treats_an_invalid_argument_as_a_usage_error(tmp_path, capsys):
    from statebound.cli import EXIT_USAGE, main
    db = tmp_path / "c.db"
    chart = tmp_path / "counter.scxml"
    chart.write_text(COUNTER)
    assert main(["--store", str(db), "start", str(chart), "a::b"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'::' is reserved" in err


def _every_error_class() -> list[type[sb.StateboundError]]:
    import statebound.chart.compiler
    import statebound.position  # noqa: F401  (defines MigrationError, CodecUnavailable)
    out, todo = [], [sb.StateboundError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(set(out), key=lambda c: (c.__module__, c.__qualname__))


#: a value for each required constructor argument, by name
_ARGS = {"problems": [sb.Problem("a state has no id", line=3, column=5, element="state")],
         "expected": ("id1", "order", "v1"), "found": ("id2", "order", "v2"), "version": 9,
         "index": 4, "instance_id": "o-1", "key": "pay-1", "chart": sb.Chart.from_scxml(COUNTER)}


def _example(cls: type[sb.StateboundError]) -> sb.StateboundError:
    import inspect
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    args = [_ARGS.get(p.name, f"<{p.name}>") for p in params
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if cls.__init__ is BaseException.__init__ or not params or params[0].kind is params[0].VAR_POSITIONAL:
        args = ["what went wrong"]
    return cls(*args)


@pytest.mark.parametrize("cls", _every_error_class(), ids=lambda c: c.__qualname__)
def test_every_error_survives_pickle_as_it_was(cls):
    # before: 12 public errors could not be unpickled (their __init__ takes ids and reasons,
    # not the message pickle passes back) or came back with another message
    import pickle
    exc = _example(cls)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert (str(back), back.args) == (str(exc), exc.args)
    assert {k: v for k, v in vars(back).items() if k != "chart"} == {k: v for k, v in vars(exc).items()
                                                                     if k != "chart"}


def _refuse(instance_id: str) -> None:
    raise sb.InstanceNotFound(instance_id)


def test_a_process_pool_hands_a_workers_error_back_intact():
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(max_workers=1) as pool:
        err = pool.submit(_refuse, "o-42").exception(timeout=60)
    assert type(err) is sb.InstanceNotFound and err.instance_id == "o-42"
    assert str(err) == str(sb.InstanceNotFound("o-42"))
