"""DESIGN.md's public contract, called the way an outside check calls it.

DESIGN.md says its names "are the public contract. Docs, examples, tests and outside tools
rely on them". This file walks it section by section and calls each promise exactly as
DESIGN.md spells it (keywords, positional arguments, return shapes). Where a test elsewhere
already holds a promise through the same public spelling, a comment names that test instead
of repeating it; what is tested here is what nothing else pins down.

Stores: SQLite for real; DynamoDB on in-process moto (``mock_aws``), which is enough where no
two writers race. The CLI runs in-process through ``statebound.cli.main``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import json
import re
import sqlite3
import typing
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

import statebound as sb
from dynamo.conftest import _shared_client, aws_env, mock_client  # noqa: F401  (in-process moto fixtures)
from statebound.cli import build_parser
from statebound.cli import main as cli
from statebound.dynamodb import DynamoStore

ROOT = Path(__file__).resolve().parents[1]
ORDER = ROOT / "examples" / "order" / "order.scxml"
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'


def _dump(path: Path) -> list[str]:
    """Every row of a SQLite file, to compare before and after a refused call."""
    with sqlite3.connect(path) as con:
        return list(con.iterdump())


# ============================================================================ Layers

SRC = ROOT / "src" / "statebound"
#: DESIGN.md's layers, in order; the value modules (errors, events, effects, strict JSON) sit
#: under all of them, and ``statebound/__init__.py`` and each package's ``__init__`` are facades
LAYERS = {"exceptions": 0, "jsonio": 0, "events": 0, "effects": 0, "chart": 1, "datamodel": 2, "interpreter": 3,
          "position": 4, "host": 5, "host.sqlite": 6, "dynamodb": 6, "aws": 6, "storeurl": 6, "cli": 7}
#: what a pure core never imports: I/O, randomness, the backends
IMPURE = {"random", "secrets", "uuid", "socket", "sqlite3", "boto3", "botocore", "subprocess", "http", "urllib",
          "asyncio"}


def _layer(module: str) -> int | None:
    parts = module.split(".")[1:]
    return LAYERS.get(".".join(parts[:2]), LAYERS.get(parts[0])) if parts else None


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(module imported, line, at module level)`` for every import in ``path``."""
    module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    top_level = {id(n) for n in ast.parse(path.read_text()).body}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            name = ".".join(filter(None, [base, node.module]))
            names = [name] if node.module else [f"{name}.{a.name}" for a in node.names]
            found += [(n, node.lineno, id(node) in top_level) for n in names]
    return found


def test_imports_go_one_way_and_the_core_stays_pure():
    """chart -> datamodel -> interpreter -> position -> host -> backends -> cli: no module
    imports a later layer (a package ``__init__`` may load one of its own modules lazily: that
    is a facade). chart, datamodel, interpreter, position, effects and events import no I/O,
    no randomness and no backend; the only clock is the CPU budget's (ADR 0017)."""
    backwards, impure, clocks = [], [], []
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
        layer = _layer(module)
        for target, line, top in _imports(path):
            if target.startswith("statebound."):
                later = _layer(target)
                facade = path.name == "__init__.py" and not top and target.startswith(module + ".")
                if layer is not None and later is not None and later > layer and not facade:
                    backwards.append(f"{module}:{line} imports {target}")
            elif layer is not None and layer <= LAYERS["position"]:
                if target.split(".")[0] in IMPURE:
                    impure.append(f"{module}:{line} imports {target}")
                if target.split(".")[0] == "time":
                    clocks.append(module)
    assert backwards == [] and impure == [] and clocks == ["statebound.datamodel.budget"]
    # the check sees what it should: the CLI imports the host, the host the interpreter
    assert any(t.startswith("statebound.host") for t, _, _ in _imports(SRC / "cli" / "_base.py"))
    assert _layer("statebound.host.sqlite") > _layer("statebound.host.host") > _layer("statebound.interpreter.state")


# ============================================================================ Core API

def test_chart_loaders_take_the_keywords_design_names(tmp_path):
    text = ORDER.read_text()
    from_file = sb.Chart.from_file(ORDER)
    chart = sb.Chart.from_scxml(text, name="order", version="3", base_path=None)
    assert (chart.name, chart.version) == ("order", "3")
    # "sha256:<hex>", over the compiled chart: the labels and the file's bytes do not enter it
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", chart.identity)
    assert chart.identity == from_file.identity
    reformatted = tmp_path / "order.scxml"
    reformatted.write_text(text.replace("  ", "\t").replace("<scxml ", "<!-- a comment -->\n<scxml ", 1))
    assert sb.Chart.from_file(reformatted).identity == from_file.identity
    # <data src> and <invoke src> resolving beside the file: tests/test_chart.py::
    # test_from_file_names_by_stem_and_resolves_src_beside_it


def test_state_kind_is_one_of_the_five_names():
    chart = sb.Chart.from_scxml(f"""<scxml {NS} datamodel="null">
      <state id="Pending"><history id="h"><transition target="a"/></history><state id="a"/></state>
      <parallel id="p"><state id="r1"/><state id="r2"/></parallel><final id="f"/></scxml>""")
    kinds = {sid: chart.state(sid).kind for sid in chart.state_ids}
    assert kinds == {"Pending": "compound", "h": "history", "a": "atomic", "p": "parallel", "r1": "atomic",
                     "r2": "atomic", "f": "final"}


def test_interpreter_start_and_drive_as_design_writes_them():
    chart = sb.Chart.from_file(ORDER)
    interp = sb.Interpreter(chart)
    assert interp.max_rounds == 10_000
    pos, effects = interp.start(session_id="order-1", data={"amount": 10})
    assert isinstance(pos.configuration, frozenset) and pos.configuration == {"Pending"}
    assert pos.status == "running" and effects == ()
    pos, effects = interp.drive(pos, sb.Event("StartPayment", data={"card": "x"}))
    assert pos.configuration == {"Started"} and pos.datamodel["card"] == "x"
    assert any(isinstance(e, sb.effects.SendDelayed) for e in effects)
    pos, effects = interp.drive(pos, "Complete")                # a bare name is an external event
    assert pos.status == "done" and isinstance(effects[-1], sb.effects.Done)
    assert isinstance(pos.datamodel, Mapping)
    with pytest.raises(TypeError):
        pos.datamodel["amount"] = 0                              # read-only
    # held elsewhere through the same calls:
    # - ancestors in the configuration: tests/test_interpreter.py::test_start_enters_initial_configuration_with_ancestors
    # - "cancelled": tests/test_host.py::test_fire_discards_when_target_missing_or_halted (host.cancel)
    # - sb.NotRunning on a halted position: tests/test_interpreter.py::test_drive_on_halted_position_raises_not_running
    # - error.execution, never raised: tests/test_interpreter.py::test_errors_never_reach_the_caller
    # - max_rounds, the unchanged position and one BudgetExhausted:
    #   tests/test_interpreter.py::test_budget_exhausted_returns_unchanged_position


DETERMINISM = f"""<scxml {NS} datamodel="python" name="ids" initial="a">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="a">
    <invoke><content><scxml {NS} datamodel="null"><state id="c"/></scxml></content></invoke>
    <transition event="go" target="b">
      <send event="later" delay="5s"/><send event="now" target="#_scxml_other"/>
      <assign location="n" expr="n + 1"/>
    </transition>
  </state>
  <state id="b"><onentry><cancel sendidexpr="'nothing'"/></onentry></state>
</scxml>"""


def test_the_same_inputs_give_a_byte_identical_position_and_the_same_effects():
    """Two interpreters of one chart: send ids, invoke ids and ordinals are counters, so the
    blobs are equal byte for byte and the effects equal."""
    chart = sb.Chart.from_scxml(DETERMINISM)

    def run() -> tuple[bytes, tuple]:
        interp = sb.Interpreter(chart)
        pos, started = interp.start(session_id="s-1", data={"n": 1})
        pos, driven = interp.drive(pos, sb.Event("go", data={"k": [1, 2]}))
        return pos.to_bytes(), started + driven
    blob, effects = run()
    again, effects_again = run()
    assert blob == again and effects == effects_again
    kinds = {type(e).__name__ for e in effects}
    assert {"Invoke", "SendDelayed", "Send", "Cancel", "CancelInvoke"} <= kinds


# ============================================================================ Effects

#: the fields DESIGN.md lists for each effect; a class may carry more (``origin``, ``name``...)
DESIGN_FIELDS = {
    "SendDelayed": {"event", "target", "type", "data", "send_id", "delay_ms", "c_index", "owner", "ordinal",
                    "id_from_author", "caller_context"},
    "Send": {"event", "target", "type", "data", "send_id", "c_index", "owner", "id_from_author", "caller_context"},
    "Cancel": {"send_id", "c_index", "owner", "ordinal", "caller_context"},
    "Invoke": set(), "CancelInvoke": set(), "Autoforward": set(),
    "Log": {"label", "value"},
    "Done": {"donedata"},
    "BudgetExhausted": set(),
}


@pytest.mark.parametrize("name", sorted(DESIGN_FIELDS))
def test_every_effect_is_a_frozen_dataclass_with_the_design_field_names(name):
    cls = getattr(sb.effects, name)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    fields = {f.name for f in dataclasses.fields(cls)}
    assert {"macrostep", "microstep", "round"} | DESIGN_FIELDS[name] <= fields
    # values and the ordinal counter: tests/test_effects.py::test_effects_carry_macrostep_microstep_round,
    # ::test_ordinal_increases_on_every_send_delayed_and_cancel_across_drives


# ============================================================================ Position blob

def test_to_bytes_and_from_bytes_as_design_writes_them():
    chart = sb.Chart.from_file(ORDER)
    pos, _ = sb.Interpreter(chart).start(session_id="order-1", data={"amount": 10})
    blob = pos.to_bytes()                                  # msgpack by default
    cbor = pos.to_bytes(codec="cbor")
    assert blob[:4] == cbor[:4] == b"SB\x00P" and (blob[5:6], cbor[5:6]) == (b"m", b"c")
    assert sb.Position.from_bytes(blob, chart) == sb.Position.from_bytes(cbor, chart) == pos
    # layout, per-driver fields, the chart never inside: tests/test_position.py::test_layout_header,
    # ::test_per_driver_fields_are_not_stored, ::test_small_chart_blob_is_small
    # export()/import_() reporting every unknown id at once:
    # tests/test_position.py::test_import_renamed_state_needs_mapping_and_lists_every_unknown_id


# ============================================================================ Host

def test_host_defaults_to_the_system_clock():
    host = sb.Host([sb.Chart.from_file(ORDER)])
    assert isinstance(host.clock, sb.SystemClock)
    assert abs(host.clock.now_ms() - sb.SystemClock().now_ms()) < 60_000


def test_host_calls_as_design_writes_them(tmp_path):
    chart = sb.Chart.from_file(ORDER)
    clock = sb.ManualClock(now_ms=0)
    host = sb.Host(charts=[chart], store=sb.SQLiteStore(str(tmp_path / "statebound.db")), clock=clock)
    host.start(chart, "order-1", data=None)
    host.start("order", "order-2", data={"payment_timeout": "2h"})       # or the chart's name
    host.send("order-1", "StartPayment", data=None)
    host.send("order-2", "StartPayment", data=None)
    assert host.next_due() == 3_600_000                                  # epoch ms of the earliest timer
    [row] = host.pending_timers("order-1")
    assert (row.instance_id, row.due_at_ms, row.event["name"]) == ("order-1", 3_600_000, "PaymentTimeout")
    assert host.fire_due(limit=100) == []                                # nothing due yet
    clock.advance(3_600_000)
    [fired] = host.fire_due(limit=100)                                   # returns what it did
    assert (fired.key, fired.outcome) == ((row.instance_id, row.ordinal), "fired")
    assert host.get("order-1").configuration == {"Cancelled"}
    clock.set(7_200_000)
    assert [r.outcome for r in host.fire_due(limit=100)] == ["fired"]
    host.delete("order-1")
    with pytest.raises(sb.InstanceNotFound):
        host.get("order-1")
    assert host.pending_timers("order-1") == [] and host.next_due() is None
    # one call, one atomic unit: tests/test_host.py::test_one_commit_per_call_and_versions,
    # ::test_immediate_self_sends_are_fifo_in_one_call, ::test_conflict_between_two_hosts_reloads_and_retries;
    # a crash at any point: tests/test_host_crash.py::test_crash_before_and_after_every_statement;
    # children purged by delete: tests/test_host.py::test_delete_purges_position_timers_and_children


# ============================================================================ Timers
# All held elsewhere through host calls:
# - row key (instance_id, ordinal), due_at_ms computed once, send_id, dedup fields, cancel of every row of a
#   send_id, a cancel of nothing: tests/test_host.py::test_timer_rows_key_due_and_cancel_by_send_id
# - caller_context on the row: tests/test_tracing.py (the traceparent a fire links back to)
# - liveness at fire time, reason recorded: tests/test_host.py::test_fire_discards_when_target_missing_or_halted
# - delivery and completion in one commit: tests/test_host.py::test_fire_only_when_due_and_in_order
# - attempts, backoff, dead and listed: tests/test_host.py::test_failed_delivery_backs_off_then_parks_dead_then_retry
# - a dead sweeper's claim lapses with its lease: tests/test_host.py::test_expired_claim_is_taken_over_and_fires_once

# ============================================================================ DynamoDB
# - one table, pk = instance id, one item per position and per timer: tests/dynamo/test_dynamo_store.py::test_item_layout
# - the sparse due index holds pending rows only: tests/dynamo/test_dynamo_store.py::test_due_index_holds_pending_rows_only
# - one GetItem and one write (PutItem, or TransactWriteItems when rows change) per external event:
#   tests/dynamo/test_dynamo_host.py::test_an_external_event_is_one_read_and_one_write
# - leases: tests/dynamo/test_dynamo_server.py, tests/dynamo/test_dynamo_handover.py


# ============================================================================ Acting on the world, trust, operations

def test_second_round_names_as_design_writes_them(tmp_path):
    chart = sb.Chart.from_file(ORDER)
    store = sb.SQLiteStore(str(tmp_path / "shop.db"))
    charges, receipts = [], []

    class Payment:
        def start(self, request):
            charges.append(request.idempotency_key)
            return {"charge": f"ch_{len(charges)}"}

    host = sb.Host([chart], store, processors={"receipts": lambda d: receipts.append(d.idempotency_key)},
                   invokers={"payment": Payment()})
    for i in (1, 2, 3):
        host.start("order", f"order-{i}", {"amount": i})
    host.send("order-1", "StartPayment", {"card": "x"}, idempotency_key="req-17")   # applied once per key
    host.send("order-1", "StartPayment", {"card": "x"}, idempotency_key="req-17")
    assert host.get("order-1").configuration == {"Done"} and len(charges) == len(receipts) == 1
    groups = host.metrics.get("group_commits", 0)
    results = host.send_many([("order-2", "StartPayment"), ("order-3", "StartPayment")])   # group commit
    assert [r.ok for r in results] == [True, True] and host.metrics["group_commits"] == groups + 1
    assert {host.get(f"order-{i}").status for i in (2, 3)} == {"done"} and len(charges) == 3
    # outbox rows, at least once with a stable key, error.communication when one fails for good:
    # tests/test_outbox.py; 4 processes racing 50 keys: tests/test_idempotency.py, tests/dynamo/test_dynamo_outbox.py


ECMA = f"""<scxml {NS} datamodel="ecmascript" name="partner">
  <datamodel><data id="n" expr="1"/></datamodel><state id="a"/></scxml>"""


def test_from_file_takes_trust_untrusted(tmp_path):
    pytest.importorskip("quickjs")
    (tmp_path / "partner.scxml").write_text(ECMA)
    (tmp_path / "python.scxml").write_text(ECMA.replace("ecmascript", "python"))
    chart = sb.Chart.from_file(tmp_path / "partner.scxml", trust="untrusted")
    trusted = sb.Chart.from_file(tmp_path / "partner.scxml")                # "trusted" is the default
    assert chart.identity != trusted.identity                               # the policy travels with it
    with pytest.raises(sb.ChartPolicyError):
        sb.Chart.from_file(tmp_path / "python.scxml", trust="untrusted")
    # every chart it reaches, src containment for every chart: tests/security/


def test_from_scxml_takes_trust_and_a_bad_level_is_a_typed_error(tmp_path):
    """``from_scxml(text, ..., trust=...)`` applies the same policy as ``from_file``; a level
    that is neither name is refused with a typed error (still a ``ValueError``)."""
    text = ECMA.replace("ecmascript", "null").replace('<data id="n" expr="1"/>', "")
    chart = sb.Chart.from_scxml(text, name="partner", base_path=str(tmp_path), trust="untrusted")
    assert chart.state("a").kind == "atomic"
    with pytest.raises(sb.ChartPolicyError) as refused:
        sb.Chart.from_scxml(text.replace('datamodel="null"', 'datamodel="python"'), trust="untrusted")
    assert "python" in str(refused.value)
    (tmp_path / "partner.scxml").write_text(text)
    for load in (lambda t: sb.Chart.from_scxml(text, trust=t), lambda t: sb.Chart.from_file(tmp_path / "partner.scxml",
                                                                                          trust=t)):
        for level in ("bogus", "Untrusted", None):
            with pytest.raises(sb.InvalidTrustLevel) as err:
                load(level)
            assert isinstance(err.value, sb.ChartError) and isinstance(err.value, ValueError)


def test_open_store_dynamodb_url_runs_a_host(mock_client):  # noqa: F811  (the fixture)
    """In-process moto: the URL DESIGN.md shows (``endpoint_url`` aside: in-process moto
    answers only AWS's own endpoints) opens a store a host runs on. The URL with
    ``endpoint_url`` is parsed in tests/test_storeurl.py and served by a moto server in
    tests/cli/test_cli.py::test_real_subprocess_on_moto_server."""
    store = sb.open_store("dynamodb://orders-table?region=eu-west-1")
    DynamoStore.create_table("orders-table", store.client)
    host = sb.Host([sb.Chart.from_file(ORDER)], store)
    host.start("order", "order-1")
    host.send("order-1", "StartPayment")
    assert store.client.meta.region_name == "eu-west-1"
    assert host.get("order-1").configuration == {"Started"} and len(host.pending_timers("order-1")) == 1


# ---------------------------------------------------------------------------- the CLI's --store URL

@pytest.fixture(params=["sqlite-path", "sqlite-url", "dynamodb"])
def store_url(request, tmp_path, monkeypatch):
    """A fresh store's URL. ``$STATEBOUND_STORE`` names a decoy: only ``--store`` reaches the store."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STATEBOUND_DB", raising=False)
    monkeypatch.setenv("STATEBOUND_STORE", str(tmp_path / "decoy.db"))
    monkeypatch.setenv("STATEBOUND_HISTORY", "100")
    if request.param == "sqlite-path":
        yield "cli.db"
    elif request.param == "sqlite-url":
        yield f"sqlite:///{tmp_path / 'cli.db'}"
    else:
        request.getfixturevalue("mock_client")
        yield "dynamodb://contract-table?region=us-east-1"
    assert not (tmp_path / "decoy.db").exists()


def _run(capsys, *argv: str) -> dict | list:
    code = cli(["--json", *argv])
    out, err = capsys.readouterr()
    assert code == 0, (argv, err)
    return json.loads(out)


def test_every_cli_command_takes_store_url(store_url, capsys, tmp_path):
    """Every command, each given ``--store URL``, alternately before and after its name; none
    of them may fall back to the environment's store."""
    ran: set[str] = set()

    def before(*argv: str) -> dict | list:
        ran.add(argv[0])
        return _run(capsys, "--store", store_url, *argv)

    def after(*argv: str) -> dict | list:
        ran.add(argv[0])
        return _run(capsys, *argv, "--store", store_url)

    if store_url.startswith("dynamodb://"):
        assert after("dynamodb", "create-table")["table"] == "contract-table"
        assert before("dynamodb", "create-table")["created"] is True
    chart = str(ORDER)
    assert before("start", chart, "o1", "--data", '{"payment_timeout": "1h"}')["status"] == "running"
    assert after("send", "o1", "StartPayment")["configuration"] == ["Started"]
    assert before("show", "o1")["configuration"] == ["Started"]
    [row] = after("timers", "o1")
    assert row["event"] == "PaymentTimeout"
    assert before("timers", "--window", "2h")["count"] == 1
    after("suspend", "o1")
    before("resume", "o1")
    assert after("timers", "--dead")["count"] == 0
    assert before("redrive", "--all-dead")["count"] == 0
    assert after("sweep", "--until-idle")["fired"] == 0
    assert before("purge", "--older-than", "7d")["purged"] == 0
    assert [r["kind"] for r in after("history", "o1")][:2] == ["start", "event"]
    assert before("replay", "o1")["identical"] is True
    (tmp_path / "events.jsonl").write_text('{"instance": "o2", "start": "order"}\n'
                                           '{"instance": "o2", "event": "Cancel"}\n')
    assert after("drive", "events.jsonl")["ok"] == 2
    (tmp_path / "v2.scxml").write_text(ORDER.read_text().replace(
        '<transition event="Complete" target="Done"/>',
        '<transition event="Complete" target="Done"/><transition event="Void" target="Cancelled"/>'))
    assert before("migrate", "--chart", "order", "--to", "v2.scxml", "--dry-run")["counts"] == {"would-move": 2}
    assert after("delete", "o2")["deleted"] == "o2"
    # the commands that read no store accept it all the same
    assert after("validate", chart)["valid"] is True
    assert "stateDiagram-v2" in before("diagram", chart)["mermaid"]
    pos, _ = sb.Interpreter(sb.Chart.from_file(ORDER)).start(session_id="blob")
    (tmp_path / "blob.bin").write_bytes(pos.to_bytes())
    assert after("inspect", "blob.bin", "--chart", chart)["position"]["configuration"] == ["Pending"]
    # and the store the URL names is the one that was written
    assert sb.Host([sb.Chart.from_file(ORDER)], sb.open_store(store_url)).get("o1").configuration == {"Started"}
    # every command there is (a new one joins this test)
    [commands] = [a.choices for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert ran == set(commands) - ({"dynamodb"} if not store_url.startswith("dynamodb://") else set())


# ============================================================================ the layout's modules

def test_each_layout_module_holds_what_design_lists(tmp_path):
    """DESIGN.md's layout, module by module, through the names each one is said to hold."""
    from importlib.metadata import entry_points

    import statebound.dynamodb.lambda_handlers as lambda_adapters
    import statebound.effects
    import statebound.host
    import statebound.position
    chart = sb.Chart.from_file(ORDER)
    pos, _ = sb.Interpreter(chart).start(session_id="o")
    # position.py: Position, to_bytes/from_bytes, export/import
    P = statebound.position
    assert P.Position is sb.Position and P.from_bytes(P.to_bytes(pos), chart) == pos
    assert P.import_(P.export(pos), chart) == sb.Position.import_(pos.export(), chart)
    # host/: Host, Store protocol, MemoryStore, SQLiteStore, Sweeper, clocks
    H = statebound.host
    stores = [H.MemoryStore(), H.SQLiteStore(str(tmp_path / "h.db"))]
    assert all(isinstance(store, H.Store) for store in stores) and H.SQLiteStore is sb.SQLiteStore
    clock = H.ManualClock(now_ms=0)
    host = H.Host([chart], stores[1], clock)
    host.start("order", "o", {"payment_timeout": "1s"})
    host.send("o", "StartPayment")
    clock.advance(1_000)
    assert H.Sweeper(host).run_once().fired == 1 and host.get("o").status == "done"
    assert isinstance(H.SystemClock().now_ms(), int)
    # effects.py: the effect dataclasses, each of them in the ``Effect`` union
    exported = {n for n in statebound.effects.__all__ if dataclasses.is_dataclass(getattr(statebound.effects, n))}
    assert set(DESIGN_FIELDS) <= exported
    assert {getattr(statebound.effects, n) for n in exported} == set(typing.get_args(statebound.effects.Effect))
    # dynamodb/: DynamoStore, leases, Lambda adapters
    # (at work on moto: tests/dynamo/, tests/aws_lambda/test_wakeups.py)
    from statebound.dynamodb import ShardLeases
    assert (DynamoStore.__module__, ShardLeases.__module__) == ("statebound.dynamodb.store", "statebound.dynamodb.leases")
    assert lambda_adapters.handle_wakeup_event.__doc__ and lambda_adapters.wakeups_in_event({"Records": []}) == ([], [])
    # cli: the `statebound` command
    [script] = [e for e in entry_points(group="console_scripts") if e.name == "statebound"]
    assert script.load() is cli


# ============================================================================ the Lambda example
# DESIGN.md: a sweeper fires due timers "from an AWS Lambda function"; examples/lambda deploys it.

LAMBDA = ROOT / "examples" / "lambda"


def _template_handlers() -> dict[str, str]:
    """``{function resource: Handler}`` from template.yaml (CloudFormation tags read as nothing)."""
    class Loader(yaml.SafeLoader):
        pass
    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    resources = yaml.load((LAMBDA / "template.yaml").read_text(), Loader)["Resources"]
    return {name: r["Properties"]["Handler"] for name, r in resources.items()
            if r["Type"] == "AWS::Serverless::Function"}


def _local_imports(module: str) -> set[str]:
    """The example's own modules ``module`` imports, transitively."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        tree = ast.parse((LAMBDA / f"{todo.pop()}.py").read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                if (LAMBDA / f"{name}.py").is_file() and name not in seen:
                    seen.add(name)
                    todo.append(name)
    return seen


def test_every_lambda_handler_is_packaged_and_takes_event_and_context():
    """Each function's ``Handler: module.function`` names a function of two parameters in a
    module that package.py ships, with every example module it imports. (wake.py was left
    out of the package: WakeFunction could not have started.)"""
    spec = importlib.util.spec_from_file_location("lambda_package", LAMBDA / "package.py")
    assert spec and spec.loader
    package = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(package)
    handlers = _template_handlers()
    assert {"EventsFunction", "SweeperFunction", "WakeFunction", "SqsEventsFunction"} <= set(handlers)
    for function, handler in handlers.items():
        module, name = handler.split(".")
        assert {f"{module}.py"} | {f"{m}.py" for m in _local_imports(module)} <= set(package.HANDLER_FILES), function
        [fn] = [n for n in ast.parse((LAMBDA / f"{module}.py").read_text()).body
                if isinstance(n, ast.FunctionDef) and n.name == name]
        assert [a.arg for a in fn.args.args] == ["event", "context"], handler
    # the README's table names the same file for each function
    table = dict(re.findall(r"^\| `(\w+Function)` \| `(\w+\.py)` \|", (LAMBDA / "README.md").read_text(), re.M))
    assert table == {function: handler.split(".")[0] + ".py" for function, handler in handlers.items()}


# ============================================================================ Exceptions

def test_the_errors_design_names_share_the_root_and_their_layer_base():
    """DESIGN.md's errors by name, under one root with a base per layer; each one that the
    tests above provoke is caught by ``except sb.StateboundError``."""
    bases = {sb.ChartError: [sb.ChartSyntaxError, sb.ChartValidationError, sb.ChartPolicyError],
             sb.PositionError: [sb.NotAPosition, sb.UnsupportedFormatVersion, sb.ChartIdentityMismatch,
                                sb.CorruptPosition],
             sb.StoreError: [sb.ConflictError, sb.ItemTooLarge, sb.InvalidStoreURL],
             sb.StateboundError: [sb.NotRunning, sb.EvaluationError, sb.SerializationError, sb.InstanceNotFound]}
    for base, errors in bases.items():
        assert issubclass(base, sb.StateboundError) and all(issubclass(e, base) for e in errors), base
    with pytest.raises(sb.StateboundError):
        sb.Chart.from_scxml("<scxml")
    with pytest.raises(sb.StateboundError):
        sb.Position.from_bytes(b"not a blob", sb.Chart.from_file(ORDER))
    with pytest.raises(sb.StateboundError):
        sb.open_store("nosuch://x")


def test_every_error_class_statebound_defines_has_the_root():
    """Walk every module: an exception class is a ``StateboundError`` unless it is private
    (its name or module starts with ``_``) or says it is internal control flow that no
    public call lets out (``OutOfRounds``, ``BudgetSpent``)."""
    import importlib
    import pkgutil
    outside, seen = [], 0
    for info in pkgutil.walk_packages(sb.__path__, "statebound."):
        if info.name.endswith("__main__"):
            continue
        for name, obj in vars(importlib.import_module(info.name)).items():
            if not (isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == info.name):
                continue
            seen += 1
            private = name.startswith("_") or any(part.startswith("_") for part in info.name.split("."))
            internal = (obj.__doc__ or "").startswith("Internal:")
            if not (issubclass(obj, sb.StateboundError) or private or internal):
                outside.append(f"{info.name}.{name}")
    assert outside == [] and seen > 40


# ============================================================================ Bad input
# Each bullet of DESIGN.md's list: the typed error, and nothing lost. "Event data is data": tests/test_datamodel.py::
# test_external_event_data_is_never_evaluated and tests/test_ecmascript.py::test_event_data_is_data_never_code.

@pytest.mark.parametrize("text", [
    # an external entity: never fetched
    '<?xml version="1.0"?>\n<!DOCTYPE scxml [<!ENTITY x SYSTEM "file:///etc/passwd">]>\n'
    f'<scxml {NS}><state id="a">&x;</state></scxml>',
    # an external DTD: never fetched
    f'<?xml version="1.0"?>\n<!DOCTYPE scxml SYSTEM "http://example.com/x.dtd">\n<scxml {NS}/>',
    # entity expansion (billion laughs)
    '<?xml version="1.0"?>\n<!DOCTYPE l [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;&a;">]>\n'
    f'<scxml {NS}>&b;</scxml>',
    # malformed
    f'<scxml {NS}>\n  <state id="a">\n</scxml>',
])
def test_bad_input_malformed_or_hostile_xml_is_a_syntax_error_with_line_and_column(text):
    with pytest.raises(sb.ChartSyntaxError) as err:
        sb.Chart.from_scxml(text)
    assert err.value.line is not None and err.value.column is not None
    assert f"line {err.value.line}, column {err.value.column}" in str(err.value)
    # that nothing is read: tests/test_chart.py::test_external_entity_is_refused_and_never_read


def test_bad_input_a_chart_that_fails_validation_lists_every_problem():
    with pytest.raises(sb.ChartValidationError) as err:
        sb.Chart.from_scxml(f"""<scxml {NS} initial="nope">
          <state id="a"><transition event="e" target="zz"/></state>
          <state id="a"/></scxml>""")
    assert isinstance(err.value, sb.ChartError) and len(err.value.problems) == 3
    assert all(p.line is not None for p in err.value.problems)


def _blob_cases() -> dict[str, tuple[bytes, type]]:
    chart = sb.Chart.from_file(ORDER)
    blob = sb.Interpreter(chart).start(session_id="o")[0].to_bytes()
    future = blob[:4] + bytes([blob[4] + 1]) + blob[5:]
    return {
        "corrupt": (blob[:-3] + b"\xc1\xc1\xc1", sb.CorruptPosition),
        "truncated": (blob[: len(blob) // 2], sb.CorruptPosition),
        "from another chart": (sb.Interpreter(sb.Chart.from_scxml(f'<scxml {NS} datamodel="null">'
                                                                  '<state id="a"/></scxml>')).start()[0].to_bytes(),
                               sb.ChartIdentityMismatch),
        "from a future format": (future, sb.UnsupportedFormatVersion),
        "not a position": (b'{"json": true}', sb.NotAPosition),
    }


@pytest.mark.parametrize("case", list(_blob_cases()))
def test_bad_input_a_bad_blob_is_a_position_error(case):
    blob, error = _blob_cases()[case]
    with pytest.raises(error) as err:
        sb.Position.from_bytes(blob, sb.Chart.from_file(ORDER))
    assert isinstance(err.value, sb.PositionError)
    # every other input as well: tests/test_position_fuzz.py


BIG = f"""<scxml {NS} datamodel="python" name="big">
  <datamodel><data id="v" expr="''"/></datamodel>
  <state id="a"><transition event="grow"><assign location="v" expr="_event.data"/></transition></state>
</scxml>"""


def test_bad_input_an_item_over_400_kb_is_refused_before_anything_is_written(mock_client):  # noqa: F811
    """In-process moto, through the host: the refused event writes nothing, and the instance
    still has its position and takes the next event."""
    DynamoStore.create_table("big-items", mock_client)
    host = sb.Host([sb.Chart.from_scxml(BIG)], DynamoStore("big-items", mock_client))
    host.start("big", "i")
    sent: list[str] = []

    def record(model, **_):
        sent.append(model.name)
    mock_client.meta.events.register("before-call.dynamodb", record)
    try:
        with pytest.raises(sb.ItemTooLarge) as err:
            host.send("i", "grow", "x" * 500_000)
    finally:
        mock_client.meta.events.unregister("before-call.dynamodb", record)
    assert isinstance(err.value, sb.StoreError) and err.value.size > err.value.limit
    assert sent and set(sent) == {"GetItem"}                       # reads only: no write was sent
    assert host.store.load("i").version == 1 and host.get("i").datamodel["v"] == ""
    assert host.send("i", "grow", "fits").datamodel["v"] == "fits"
    # the limit at the store, rows and transactions too: tests/dynamo/test_dynamo_store.py


UNSTORABLE = f"""<scxml {NS} datamodel="python" name="keep">
  <datamodel><data id="v" expr="None"/><data id="err" expr="None"/></datamodel>
  <state id="a">
    <transition event="keep"><assign location="v" expr="_event.data"/></transition>
    <transition event="error.execution"><assign location="err" expr="_event.name"/></transition>
  </state>
</scxml>"""


def test_bad_input_datamodel_values_that_cannot_be_serialized(tmp_path):
    path = tmp_path / "s.db"
    host = sb.Host([sb.Chart.from_scxml(UNSTORABLE)], sb.SQLiteStore(str(path)))
    host.start("keep", "i")
    before = _dump(path)
    with pytest.raises(sb.SerializationError):
        host.start("keep", "j", {"v": object()})                  # refused, nothing written
    with pytest.raises(sb.SerializationError):
        sb.Interpreter(sb.Chart.from_scxml(UNSTORABLE)).start(data={"v": {1, 2}})
    assert _dump(path) == before and not host.exists("j")
    # inside a chart the spec's rule: error.execution, the variable unchanged, the rest commits
    pos = host.send("i", "keep", object())
    assert pos.datamodel["v"] is None and pos.datamodel["err"] == "error.execution"


@pytest.mark.parametrize("event", ["", sb.Event(""), sb.Event(None), 5, None])
def test_bad_input_an_event_without_a_name_is_refused_and_nothing_is_written(tmp_path, event):
    """Neither the interpreter nor the host drives an event with no name: before, an empty
    name or ``None`` was driven and committed, and a number failed deep inside with an
    AttributeError."""
    path = tmp_path / "s.db"
    host = sb.Host([sb.Chart.from_file(ORDER)], sb.SQLiteStore(str(path)))
    host.start("order", "o1")
    before = _dump(path)
    with pytest.raises(sb.InvalidEvent):
        host.send("o1", event)
    [result] = host.send_many([("o1", event)])
    assert isinstance(result.error, (sb.InvalidEvent, sb.InvalidBatchItem))       # the item is not (id, name)
    assert _dump(path) == before and host.get("o1").configuration == {"Pending"}
    pos, _ = sb.Interpreter(sb.Chart.from_file(ORDER)).start(session_id="o1")
    with pytest.raises(sb.InvalidEvent) as err:
        sb.Interpreter(sb.Chart.from_file(ORDER)).drive(pos, event)
    assert isinstance(err.value, (TypeError, ValueError))
    version = host.store.load("o1").version
    assert cli(["--store", str(path), "send", "o1", ""]) == 2          # a usage error, one line
    assert host.store.load("o1").version == version


def test_bad_input_an_event_to_a_missing_finished_or_deleted_instance(tmp_path):
    path = tmp_path / "s.db"
    host = sb.Host([sb.Chart.from_file(ORDER)], sb.SQLiteStore(str(path)))
    host.start("order", "finished")
    host.send("finished", "Cancel")
    host.start("order", "deleted")
    host.delete("deleted")
    before = _dump(path)
    with pytest.raises(sb.InstanceNotFound):
        host.send("missing", "StartPayment")
    with pytest.raises(sb.NotRunning) as halted:
        host.send("finished", "StartPayment")
    with pytest.raises(sb.InstanceNotFound):
        host.send("deleted", "StartPayment")
    assert halted.value.status == "done" and _dump(path) == before
