"""Bench section ``blob``: the position blob on every workload chart.

For each chart: the blob size, ``to_bytes`` and ``from_bytes`` in microseconds per blob
(msgpack and cbor), and the events/s of a *durable-shaped* loop -- decode, drive, encode
on every event, what a process-less host does -- against python-statemachine's
*in-memory* rate on the same SCXML (it keeps its state in the object and persists
nothing). Printed only, never asserted.
"""

from __future__ import annotations

from typing import Any

import adapters
import statebound as sb


def _blob_runner(workload: str, codec: str) -> tuple[Any, Any, Any]:
    chart = sb.Chart.from_scxml(adapters.scxml_text(workload), name=workload)
    interp = sb.Interpreter(chart)
    pos, _ = interp.start(session_id=f"bench-{workload}")
    for _ in range(4):  # a few events in: counters and datamodel are not at their defaults
        pos, _ = interp.drive(pos, "next")
    blob = pos.to_bytes(codec)
    box = [blob]

    def encode(n: int) -> None:
        for _ in range(n):
            pos.to_bytes(codec)

    def decode(n: int) -> None:
        for _ in range(n):
            sb.Position.from_bytes(blob, chart)

    def durable(n: int) -> None:
        b = box[0]
        for _ in range(n):
            p = sb.Position.from_bytes(b, chart)
            p, _ = interp.drive(p, "next")
            b = p.to_bytes(codec)
        box[0] = b
    return (blob, (encode, decode), durable)


def register(section: Any) -> None:
    """Register the section with bench/run.py's decorator."""

    @section("blob", "position blob: size, µs per encode/decode, and drive + blob round trip "
                     "(events/s) against the best peer's in-memory rate",
             formats={"encode µs": "{:.1f}", "decode µs": "{:.1f}", "vs peer": "{:.2f}x"})
    def blob(ctx: Any) -> list[dict]:
        rows = []
        import contextlib
        for w in adapters.WORKLOADS:
            # the same peers as the interpreter section's ratio: all three on flat, else psm
            peer_names = adapters.PEERS if w == "flat" else ("python-statemachine",)
            peers: dict[str, Any] = {}
            for name in peer_names:
                try:
                    if w in adapters.ENGINES[name][2]:
                        peers[name] = adapters.ENGINES[name][1](w)
                except Exception as e:  # pragma: no cover - peer missing
                    ctx.note(f"{name} on {w}: {type(e).__name__}: {e}")
            for codec in ("msgpack", "cbor"):
                blob_bytes, (enc, dec), durable = _blob_runner(w, codec)
                e = ctx.measure(enc, key=f"blob/{w}/{codec}/encode")
                d = ctx.measure(dec, key=f"blob/{w}/{codec}/decode")
                runs: dict[str, Any] = {"durable": (durable, contextlib.nullcontext)}
                if codec == "msgpack":
                    runs.update({n: (r.run, r.quiet) for n, r in peers.items()})
                group = ctx.measure_group(runs, key_prefix=f"blob/{w}/{codec}/")
                dur = getattr(group.get("durable"), "median", None)
                rates = {n: m.median for n, m in group.items() if n != "durable" and hasattr(m, "median")}
                best = max(rates, key=rates.get) if rates else None
                rows.append({
                    "workload": w, "codec": codec, "bytes": len(blob_bytes),
                    "encode µs": 1e6 / e.median, "decode µs": 1e6 / d.median,
                    "drive+blob ev/s": dur,
                    "best peer in memory": best or "-",
                    "peer ev/s": rates.get(best) if best else None,
                    "vs peer": dur / rates[best] if dur and best else None,
                })
        ctx.note("drive+blob = from_bytes, drive, to_bytes on every event (a process-less host's "
                 "work minus the store)")
        return rows
