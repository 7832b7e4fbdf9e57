"""Bench section ``dynamodb``: requests per operation and fires/s, on **moto** (not AWS).

The request counts are exact (botocore's ``before-call`` hook sees every request). The
rates only say how fast statebound drives moto's in-process emulation, which deep-copies
items on every transaction; they are no estimate of DynamoDB's throughput.
"""

from __future__ import annotations

import os
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


def register(section: Any) -> None:
    """Register the section with bench/run.py's decorator."""

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
        for k, v in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                     "AWS_DEFAULT_REGION": "eu-west-1"}.items():
            os.environ.setdefault(k, v)
        n_fire = 200 if ctx.repeats <= 2 else 500
        rows = []
        with mock_aws():
            client = boto3.client("dynamodb", region_name="eu-west-1")
            DynamoStore.create_table("bench", client=client)
            clock = sb.ManualClock(now_ms=1_700_000_000_000)
            chart = sb.Chart.from_scxml(ORDER)
            host = sb.Host([chart], store=DynamoStore("bench", client=client), clock=clock)
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
            rows.append({"operation": "first sweep of a new table, one due row (cursor bootstrap)",
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
