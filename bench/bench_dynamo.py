"""Bench sections ``dynamodb`` (requests per operation, fires/s) and ``dynamo-timers``
(issue #13's figures: idle cost, wake-up lag, handover, exactly-once, pool speed-up), on
**moto** (not AWS).

The request counts are exact (botocore's ``before-call`` hook sees every request) and the
lags are on a manual clock. The rates only say how fast statebound drives moto, which
deep-copies items on every request; they are no estimate of DynamoDB's throughput.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from typing import Any

import statebound as sb

ORDER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" xmlns:sb="urn:statebound" version="1.0"
  datamodel="python" name="order" initial="Pending">
  <state id="Pending"><transition event="StartPayment" target="Started"/></state>
  <state id="Started"><sb:timeout event="PaymentTimeout" after="1s"/>
    <transition event="Complete" target="Done"/><transition event="PaymentTimeout" target="Cancelled"/>
    <transition event="Note"/></state>
  <final id="Done"/><final id="Cancelled"/>
</scxml>"""


def _fake_credentials() -> None:
    """moto needs credentials to sign with; never a real profile's."""
    for k, v in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "eu-west-1"}.items():
        os.environ.setdefault(k, v)


def register(section: Any) -> None:
    """Register the sections with bench/run.py's decorator."""
    _register_timers(section)

    @section("dynamodb", "DynamoDB on moto (in-process mock_aws; moto, not AWS): requests per "
                         "operation and operations/s", formats={"requests": "{}"})
    def dynamodb(ctx: Any) -> list[dict]:
        try:
            import boto3
            from moto import mock_aws

            from statebound.dynamodb import DynamoStore
        except ImportError as e:  # pragma: no cover - the aws/test extras are missing
            ctx.note(f"skipped: {e}")
            return []
        _fake_credentials()
        n_fire = 200 if ctx.repeats <= 2 else 500
        rows = []
        with mock_aws():
            client = boto3.client("dynamodb", region_name="eu-west-1")
            DynamoStore.create_table("bench", client=client)
            clock = sb.ManualClock(now_ms=1_700_000_000_000)
            chart = sb.Chart.from_scxml(ORDER)
            store = DynamoStore("bench", client=client)
            store.batch_workers = 1   # in-process moto is not safe across threads (group commit's pool)
            host = sb.Host([chart], store=store, clock=clock)
            calls: Counter[str] = Counter()
            client.meta.events.register("before-call.dynamodb",
                                        lambda event_name, **kw: calls.update([event_name.split(".")[-1]]))

            def counted(fn: Any) -> str:
                calls.clear()
                fn()
                return " + ".join(f"{v} {k}" for k, v in sorted(calls.items()))

            host.start(chart, "probe")
            rows.append({"operation": "event arming a timer (StartPayment)",
                         "requests": counted(lambda: host.send("probe", "StartPayment"))})
            rows.append({"operation": "event with no timer change (Note)",
                         "requests": counted(lambda: host.send("probe", "Note"))})
            rows.append({"operation": "event cancelling a timer (Complete)",
                         "requests": counted(lambda: host.send("probe", "Complete"))})
            host.start(chart, "probe2")
            host.send("probe2", "StartPayment")
            clock.advance(1000)
            rows.append({"operation": "first sweep of a new table, one due row (0.1-table check + a read per shard)",
                         "requests": counted(lambda: host.fire_due(limit=10))})

            # rates (moto): external events, then fires
            for i in range(n_fire):
                host.start(chart, f"o{i}")
            t0 = time.perf_counter()
            for i in range(n_fire):
                host.send(f"o{i}", "StartPayment")
            dt = time.perf_counter() - t0
            rows.append({"operation": f"events/s on moto ({n_fire} StartPayment)", "requests": "",
                         "rate/s": n_fire / dt})
            clock.advance(1000)
            sweeper = sb.Sweeper(host, batch=100)
            calls.clear()
            t0 = time.perf_counter()
            report = sweeper.run_until_idle()
            dt = time.perf_counter() - t0
            per_fire = " + ".join(f"{v / max(report.fired, 1):.2f} {k}" for k, v in sorted(calls.items()))
            rows.append({"operation": f"steady sweep: requests per fire ({report.fired} due rows)",
                         "requests": per_fire})
            rows.append({"operation": f"fires/s on moto ({report.fired} due rows, one sweeper)", "requests": "",
                         "rate/s": report.fired / dt})
        ctx.note("moto, not AWS: the counts are what DynamoDB would bill; the rates are moto's")
        return rows


# ---------------------------------------------------------------------------- issue #13

TICK = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python" name="tick"
  initial="waiting">
  <datamodel><data id="delay" expr="'200ms'"/><data id="n" expr="0"/></datamodel>
  <state id="waiting">
    <onentry><send event="go" delayexpr="delay"/></onentry>
    <transition event="go" target="fired"/>
    <transition event="tick"><assign location="n" expr="n + 1"/></transition>
  </state>
  <final id="fired"/>
</scxml>"""

_SERVER = """
import sys
from werkzeug.serving import make_server
from moto.server import DomainDispatcherApplication, create_backend_app
server = make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app),
                     threaded=sys.argv[1] == "threaded")
print(server.server_port, flush=True)
server.serve_forever()
"""


class _MotoServer:
    """A moto server subprocess on a free port: ``threaded`` serves requests in parallel,
    otherwise one at a time (each conditional write atomic, as on DynamoDB)."""

    def __init__(self, threaded: bool) -> None:
        import subprocess
        import sys
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "eu-west-1"})
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, "threaded" if threaded else "serial"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{self.proc.stdout.readline().strip()}"

    def client(self) -> Any:
        import boto3
        return boto3.session.Session().client("dynamodb", endpoint_url=self.url, region_name="eu-west-1",
                                              aws_access_key_id="bench", aws_secret_access_key="bench")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class _Latency:
    """A client whose every request first waits a network round trip (moto answers in-host;
    DynamoDB answers in a few milliseconds), so a pool's overlap shows as it would on AWS."""

    def __init__(self, client: Any, seconds: float) -> None:
        self._client, self._seconds = client, seconds

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            time.sleep(self._seconds)
            return attr(*args, **kwargs)
        return call


class _RecordingSQS:
    """Plays SQS on the manual clock: keeps (visible at, body) for each message sent."""

    def __init__(self, clock: Any) -> None:
        self.clock, self.queue = clock, []

    def send_message_batch(self, QueueUrl: str, Entries: list[dict]) -> dict:
        for e in Entries:
            self.queue.append((self.clock.now_ms() + e["DelaySeconds"] * 1000, e["MessageBody"]))
        return {"Successful": [{"Id": e["Id"]} for e in Entries]}


def _counter(client: Any) -> Counter[str]:
    calls: Counter[str] = Counter()
    client.meta.events.register("before-call.dynamodb", lambda event_name, **kw: calls.update([event_name.split(".")[-1]]))
    return calls


def _register_timers(section: Any) -> None:
    @section("dynamo-timers", "issue #13 on moto: idle cost, wake-up lag, handover, exactly once, pool",
             formats={"value": "{}"})
    def dynamo_timers(ctx: Any) -> list[dict]:
        try:
            import boto3
            from moto import mock_aws

            from statebound.dynamodb import DynamoStore, ShardLeases, SQSWakeup
            from statebound.dynamodb.lambda_handlers import handle_wakeup_event
            from statebound.host import WakeupRequest
            from statebound.host.store import Commit, TimerRow
        except ImportError as e:  # pragma: no cover - the aws/test extras are missing
            ctx.note(f"skipped: {e}")
            return []
        _fake_credentials()
        chart = sb.Chart.from_scxml(TICK)
        t0 = 1_800_000_000_000
        rows: list[dict] = []

        def row(figure: str, value: Any, target: str) -> None:
            rows.append({"figure": figure, "value": value, "done when": target})

        def store(client: Any, table: str, **kw: Any) -> Any:
            st = DynamoStore(table, client, sleep=lambda s: None, **kw)
            if not str(client.meta.endpoint_url).startswith("http://127.0.0.1"):
                st.batch_workers = 1   # in-process moto is not safe across threads
            return st

        # idle: 1,000 rows an hour out, a leased sweeper sweeping for ten simulated minutes
        with mock_aws():
            client = boto3.client("dynamodb", region_name="eu-west-1")
            DynamoStore.create_table("idle", client=client)
            writer = store(client, "idle")
            tick = sb.Event("tick").to_dict()
            for first in range(0, 1_000, 50):
                writer.commit(Commit(timers_put=tuple(TimerRow(f"later-{n}", 1, f"later-{n}", t0 + 3_600_000 + n,
                                                               "s", tick) for n in range(first, first + 50))))
            clock = sb.ManualClock(t0)
            leases = ShardLeases(client, "idle", "idle-node", 16, 30_000, clock)
            sweeper = sb.Sweeper(sb.Host([chart], store=store(client, "idle", owned_shards=leases), clock=clock))
            calls = _counter(client)
            while clock.now_ms() < t0 + 10 * 60_000:
                sweeper.run_once()
                clock.sleep(sweeper.sleep_time())
            row("idle: requests per shard per minute (1,000 rows 1 h out, 16 shards, leases on)",
                f"{sum(calls.values()) / 16 / 10:.2f} ({dict(calls)})", "<= 2")
            row("idle: Scans", calls["Scan"], "0")

        # wake-ups: 200 timers due 1-120 s out, SQS played on the manual clock
        with mock_aws():
            client = boto3.client("dynamodb", region_name="eu-west-1")
            DynamoStore.create_table("wake", client=client)
            clock = sb.ManualClock(t0)
            sqs = _RecordingSQS(clock)
            wakeup = SQSWakeup("https://sqs.invalid/q", client=sqs)
            writer_host = sb.Host([chart], store=store(client, "wake"), clock=clock, wakeup=wakeup)
            for i, ms in enumerate(random.Random(13).sample(range(1_000, 120_001), 200)):
                writer_host.start(chart, f"w{i}", data={"delay": f"{ms}ms"})
            sweeper = sb.Sweeper(sb.Host([chart], store=store(client, "wake"), clock=clock, wakeup=wakeup))
            calls = _counter(client)
            while sqs.queue:
                sqs.queue.sort()
                at = sqs.queue[0][0]
                clock.set(max(at, clock.now_ms()))
                due = [b for t, b in sqs.queue if t <= clock.now_ms()]
                sqs.queue = [(t, b) for t, b in sqs.queue if t > clock.now_ms()]
                handle_wakeup_event({"Records": [{"messageId": str(i), "body": b} for i, b in enumerate(due)]}, sweeper)
            m = sweeper.metrics
            row("wake-ups: 200 timers due 1-120 s, fired", m.fired, "200")
            row("wake-ups: worst lag (ms, manual clock; SQS granularity 1 s)", m.max_lag_ms, "<= 1,000 + 1,000")
            row("wake-ups: requests per fire", f"{sum(calls.values()) / max(m.fired, 1):.2f} ({dict(calls)})",
                "no Query, no Scan")

        # handover: B starts while A holds every lease; then A is abandoned (a kill -9)
        with mock_aws():
            client = boto3.client("dynamodb", region_name="eu-west-1")
            DynamoStore.create_table("hand", client=client)
            clock = sb.ManualClock(t0)
            a_leases = ShardLeases(client, "hand", "a", 16, 30_000, clock)
            a_host = sb.Host([chart], store=store(client, "hand", owned_shards=a_leases), clock=clock)
            a_leases.acquire()
            for i in range(40):
                a_host.start(chart, f"h{i}")
            clock.set(t0 + 100)
            b_leases = ShardLeases(client, "hand", "b", 16, 30_000, clock)
            b_sweeper = sb.Sweeper(sb.Host([chart], store=store(client, "hand", owned_shards=b_leases), clock=clock))
            b_sweeper.run_once()
            lags = []
            while clock.now_ms() < t0 + 1_200:
                clock.sleep(b_sweeper.sleep_time())
                lags += b_sweeper.run_once().lag_ms
            row("handover: B's share of 40 due rows fired while A holds every lease", len(lags), "> 0")
            row("handover: B's worst lag (ms)", max(lags, default=0), "< 1,000")
            killed = clock.now_ms()
            while b_leases.held != frozenset(range(16)):
                clock.sleep(b_sweeper.sleep_time())
                b_sweeper.run_once()
            row("handover: A's shards taken this long after it stopped (ms; lease 30,000)",
                clock.now_ms() - killed, "<= 30,000")

        # exactly once and the pool, on moto servers
        n_rows = 200
        tick_event = sb.Event("tick").to_dict()

        def seed(client: Any, table: str, n: int) -> Any:
            DynamoStore.create_table(table, client=client)
            host = sb.Host([chart], store=store(client, table), clock=sb.ManualClock(t0 - 10_000))
            for i in range(n // 4):
                host.start(chart, f"c{i}", data={"delay": "1h"})
            for i in range(n // 4):
                host.store.commit(Commit(timers_put=tuple(TimerRow(f"c{i}", k, f"c{i}", t0 - k, f"t{k}", tick_event)
                                                          for k in range(10, 14))))
            return host

        import threading
        server = _MotoServer(threaded=False)
        try:
            checker = seed(server.client(), "once", n_rows)
            clock = sb.ManualClock(t0)
            nodes = [sb.Sweeper(sb.Host([chart], store=store(server.client(), "once"), clock=clock), node_id=name,
                                workers=4, batch=50) for name in ("a", "b", "c", "w")]
            wakeups = [WakeupRequest(f"c{i}", k, t0 - k) for i in range(n_rows // 4) for k in range(10, 14)]
            work = [n.run_until_idle for n in nodes[:3]]
            work.append(lambda: [nodes[3].handle_wakeups(wakeups[i:i + 10]) for i in range(0, len(wakeups), 10)])
            threads = [threading.Thread(target=w) for w in work]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for n in nodes:
                n.close()
            fired = sum(n.metrics.fired for n in nodes)
            ticks = sum(checker.get(f"c{i}").datamodel["n"] for i in range(n_rows // 4))
            row(f"exactly once: {n_rows} rows, 3 pooled sweepers + wake-ups (serialised moto server)",
                f"{fired} fired, {ticks} applied", f"{n_rows} and {n_rows}")
        finally:
            server.close()

        server = _MotoServer(threaded=True)
        try:
            n_fire = 120 if ctx.quick else 400
            rates = {}
            # one at a time: no pool, no group commit; the pool: 8 fires in flight; group
            # commit (the default sweeper): one worker, a sweep's commits sent 8 at a time
            setups = {"one at a time": (1, 1, 1, 0), "pool of 8": (8, 1, 1, 0), "group commit": (1, 100, 8, 0),
                      "one at a time, 5 ms round trip": (1, 1, 1, 5), "pool of 8, 5 ms round trip": (8, 1, 1, 5)}
            for name, (workers, max_batch, batch_workers, rtt_ms) in setups.items():
                client = server.client() if not rtt_ms else _Latency(server.client(), rtt_ms / 1000)
                table = "fires-" + name.replace(" ", "-")
                seed(client, table, n_fire)
                st = store(client, table)
                st.batch_workers = batch_workers
                sweeper = sb.Sweeper(sb.Host([chart], store=st, clock=sb.ManualClock(t0), max_batch=max_batch),
                                     workers=workers, batch=n_fire)
                started = time.perf_counter()
                fired = sweeper.run_until_idle().fired
                rates[name] = fired / (time.perf_counter() - started)
                sweeper.close()
            for name, rate in rates.items():
                row(f"fires/s, {name} (threaded moto server, {n_fire} rows): moto's speed", f"{rate:,.0f}", "")
            row("pool of 8 / one at a time (same run, moto's speed)",
                f"{rates['pool of 8'] / rates['one at a time']:.2f}x", "> 1")
            row("pool of 8 / one at a time, with a 5 ms round trip per request (DynamoDB's order)",
                f"{rates['pool of 8, 5 ms round trip'] / rates['one at a time, 5 ms round trip']:.2f}x", "> 1")
        finally:
            server.close()
        ctx.note("counts and lags are exact (botocore hooks, manual clock); fires/s measure moto, not DynamoDB")
        return rows
