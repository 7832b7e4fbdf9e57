"""Fuzzing ``Position.from_bytes``: whatever the bytes, a Position or a PositionError.

The quick variant (~3,000 inputs) runs in ``make test``; the slow one (100,000) in
``make soak`` (``pytest -m slow``). Both are deterministic (seeded), so a failure
reproduces exactly.
"""

from __future__ import annotations

import random
import tracemalloc

import pytest

import statebound as sb
from statebound import position as P

from test_position import CODECS, EVENTS, SOURCES, walk


def _seeds() -> list[tuple[bytes, sb.Chart]]:
    """Valid blobs of varied shapes: every chart, a few positions each, both codecs."""
    out = []
    for name in sorted(SOURCES):
        positions = walk(name, EVENTS[name] * 2)
        for pos in positions[:: max(1, len(positions) // 4)]:
            for codec in CODECS:
                out.append((pos.to_bytes(codec), pos.chart))
    return out


def _mutants(rng: random.Random, seeds: list[tuple[bytes, sb.Chart]], n: int):
    """``n`` (blob, chart) pairs: truncations at every length first, then random mutations."""
    count = 0
    for blob, c in seeds[:4]:
        for k in range(len(blob) + 1):
            yield blob[:k], c
            count += 1
    while count < n:
        blob, c = rng.choice(seeds)
        b = bytearray(blob)
        op = rng.randrange(8)
        if op == 0:  # bit flips
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(b))
                b[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # flips confined to the payload, where the validator has to work
            off = P.read_header(blob).payload_offset
            for _ in range(rng.randint(1, 3)):
                i = rng.randrange(off, len(b))
                b[i] ^= 1 << rng.randrange(8)
        elif op == 2:  # random bytes overwritten
            i = rng.randrange(len(b))
            b[i:i + rng.randint(1, 8)] = rng.randbytes(rng.randint(1, 8))
        elif op == 3:  # byte insertions
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.randbytes(rng.randint(1, 6))
        elif op == 4:  # deletions
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 6)]
        elif op == 5:  # swapped headers: one blob's header on another's payload
            other, _ = rng.choice(seeds)
            ho = P.read_header(other).payload_offset
            hb = P.read_header(blob).payload_offset
            b = bytearray(other[:ho] + blob[hb:]) if rng.random() < 0.5 else bytearray(blob[:hb] + other[ho:])
        elif op == 6:  # pure noise, sometimes behind a valid header
            noise = rng.randbytes(rng.randint(0, 120))
            b = bytearray(blob[:P.read_header(blob).payload_offset] + noise if rng.random() < 0.7 else noise)
        else:  # truncation at a random length, plus maybe garbage
            b = b[:rng.randrange(len(b))] + (rng.randbytes(rng.randint(0, 3)) if rng.random() < 0.3 else b"")
        yield bytes(b), c
        count += 1


def _probe(blob: bytes, c: sb.Chart, it: dict[str, sb.Interpreter], tally: dict[str, int]) -> None:
    try:
        pos = sb.Position.from_bytes(blob, c)
    except sb.PositionError as exc:
        tally[type(exc).__name__] = tally.get(type(exc).__name__, 0) + 1
        return
    tally["valid"] = tally.get("valid", 0) + 1
    # A position that decodes must be fully usable: no latent failure left for later.
    dict(pos.datamodel)
    assert sb.Position.from_bytes(pos.to_bytes(), c) == pos
    if pos.running:
        interp = it.setdefault(c.name, sb.Interpreter(c))
        for ev in EVENTS[c.name][:2]:
            pos, _ = interp.drive(pos, ev)
            if not pos.running:
                break


def _run(n: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    seeds = _seeds()
    tally: dict[str, int] = {}
    interps: dict[str, sb.Interpreter] = {}
    # A mutated length prefix must not make a decode allocate without bound. Memory is
    # measured, not time: a wall-clock bound fails on a loaded machine for no reason.
    tracemalloc.start()
    try:
        for blob, c in _mutants(rng, seeds, n):
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            _probe(blob, c, interps, tally)
            peak = tracemalloc.get_traced_memory()[1] - base
            assert peak < 16 * 2**20, f"one decode allocated {peak} bytes"
    finally:
        tracemalloc.stop()
    assert sum(tally.values()) >= n
    return tally


def test_fuzz_quick():
    tally = _run(3_000, seed=1)
    assert tally.get("CorruptPosition", 0) > 1000  # the mutations really reach the payload checks


@pytest.mark.slow
def test_fuzz_100k():
    tally = _run(100_000, seed=20240601)
    assert tally.get("CorruptPosition", 0) > 30_000
