"""Fuzzing the chart compiler with mutated SCXML.

What this module proves: whatever bytes arrive, ``Chart.from_scxml`` either returns a
``Chart`` or raises a ``StateboundError`` subclass (in practice the ``ChartError`` family),
never another exception, and never hangs: every case is timed and must finish in under
2 seconds.

The corpus is eleven valid charts covering every element the compiler knows (states,
parallel, history, final/donedata, every kind of executable content, invoke with an inline
child chart, ``sb:timeout``...). Each case applies 1-4 random mutations from a seeded
generator: byte and character flips, insertions and deletions, truncation, swapping tag
names, deleting attributes, duplicating elements or attributes, splicing markup from another
chart, and inserting hostile constructs (DTDs, entity references, deep nesting).

The normal run does 2,200 cases (seeded, so failures reproduce); the ``slow`` variant runs
50,000 (``pytest -m slow tests/test_chart_fuzz.py``).
"""

from __future__ import annotations

import random
import re
import time

import pytest

import statebound as sb

NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'
SBNS = 'xmlns:sb="urn:statebound"'

CORPUS = [
    f"""<scxml {NS} name="flat" initial="a"><state id="a"><transition event="go" target="b"/></state>
<state id="b"><transition event="back" target="a"/></state></scxml>""",

    f"""<scxml {NS} datamodel="python"><datamodel><data id="n" expr="0"/><data id="xs" expr="[1, 2, 3]"/>
<data id="j">{{"k": [1, 2]}}</data></datamodel>
<state id="s"><onentry><assign location="n" expr="n + 1"/><log label="n" expr="n"/>
<if cond="n &gt; 1"><raise event="big"/><elseif cond="n == 1"/><raise event="one"/><else/><raise event="zero"/></if>
<foreach array="xs" item="x" index="i"><assign location="n" expr="n + x"/></foreach>
<script>n = n * 2</script></onentry>
<transition event="one" target="f"/></state><final id="f"><donedata><param name="n" expr="n"/></donedata></final></scxml>""",

    f"""<scxml {NS}><parallel id="p"><state id="r1" initial="a1"><state id="a1"><transition event="e" target="b1"/>
</state><final id="b1"/></state><state id="r2"><state id="a2"><transition event="e" target="b2"/></state>
<final id="b2"/></state><transition event="done.state.p" target="out"/></parallel><final id="out"/></scxml>""",

    f"""<scxml {NS}><state id="w" initial="x"><history id="h" type="deep"><transition target="y"/></history>
<history id="hs"><transition target="x"/></history>
<state id="x"><state id="x1"/><state id="x2"/></state><state id="y"/>
<transition event="out" target="o"/></state><state id="o"><transition event="in" target="h"/></state></scxml>""",

    f"""<scxml {NS}><state id="a"><onentry><send id="t1" event="tick" delay="5s"/><send event="now"
target="#_internal"><param name="p" expr="1"/></send><send eventexpr="'x'" delayexpr="'1s'"
namelist="_sessionid"/></onentry><onexit><cancel sendid="t1"/><cancel sendidexpr="'t2'"/></onexit>
<transition event="tick" target="b"/></state><state id="b"/></scxml>""",

    f"""<scxml {NS} {SBNS}><state id="Live"><sb:timeout event="idle" after="5s"/>
<sb:timeout name="hard" event="stop" at="2026-01-01T00:00:00Z"/><sb:timeout name="soft" event="soft" afterexpr="'1m'"/>
<transition event="idle"/><transition event="stop" target="Dead"/></state><final id="Dead"/></scxml>""",

    f"""<scxml {NS}><state id="parent"><invoke id="kid" autoforward="true"><param name="x" expr="1"/><content>
<scxml {NS}><state id="c"><transition event="q" target="cf"/></state><final id="cf"/></scxml></content>
<finalize><log expr="_event.name"/></finalize></invoke><transition event="done.invoke.kid" target="end"/>
</state><final id="end"/></scxml>""",

    f"""<scxml {NS} binding="late"><state id="a"><datamodel><data id="late" expr="42"/></datamodel>
<initial><transition target="a2"><log expr="'init'"/></transition></initial><state id="a2"/>
<transition type="internal" event="e" target="a2"/><transition event="f.*" cond="late == 42" target="z"/></state>
<state id="z"/></scxml>""",

    f"""<scxml {NS} datamodel="null"><parallel id="p"><state id="r1"><state id="x">
<transition event="flip" target="y"/></state><state id="y"/></state><state id="r2"><state id="i">
<transition event="chk" cond="In('y')" target="ok"/></state><state id="ok"/></state></parallel></scxml>""",

    """<?xml version="1.0" encoding="UTF-8"?>
<!-- a comment -->
<scxml xmlns="http://www.w3.org/2005/07/scxml" xmlns:sb="urn:statebound"
       version="1.0" datamodel="python" name="order" initial="Pending">
  <datamodel>
    <data id="amount" expr="0"/>
    <data id="card" expr="None"/>
    <data id="payment_timeout" expr="'1h'"/>
  </datamodel>
  <state id="Pending">
    <transition event="StartPayment" target="Started">
      <assign location="card" expr="_event.data.get('card') if _event.data else None"/>
    </transition>
    <transition event="Cancel" target="Cancelled"/>
  </state>
  <state id="Started">
    <sb:timeout event="PaymentTimeout" afterexpr="payment_timeout"/>
    <transition event="Complete" target="Done"/>
    <transition event="PaymentTimeout" target="Cancelled">
      <log label="order" expr="'payment timed out'"/>
    </transition>
  </state>
  <final id="Done"><donedata><param name="amount" expr="amount"/></donedata></final>
  <final id="Cancelled"/>
</scxml>""",

    f"""<scxml {NS}><script>counter = 0</script><state id="s"><onentry><assign location="counter">
<payload x="1"/></assign><send event="e"><content expr="counter"/></send></onentry>
<transition event="*" target="s"/></state></scxml>""",
]

TAGS = ["scxml", "state", "parallel", "final", "history", "transition", "initial", "onentry", "onexit",
        "datamodel", "data", "raise", "send", "cancel", "assign", "log", "if", "elseif", "else", "foreach",
        "script", "invoke", "content", "param", "finalize", "donedata", "sb:timeout", "bogus"]

HOSTILE = [
    '<!DOCTYPE x [<!ENTITY a "aaaa">]>', "&a;", "&amp;", "&#0;", "&#x110000;", "<![CDATA[ x ]]>",
    "<?pi data?>", "<!-- c -->", "\x00", "\ufffe", "]]>", '<sb:timeout event="t" after="1s"/>',
    '<history id="h"/>', '<transition target="nowhere"/>', '<state id="s"/>', '<final id="f"/>',
    '<state id="n1"><state id="n2"><state id="n3"></state></state></state>',
    '<invoke><content><scxml xmlns="http://www.w3.org/2005/07/scxml"/></content></invoke>',
    "<state>" * 300, 'xmlns:q="urn:q"', 'initial="s"', 'type="deep"', 'datamodel="ecmascript"',
    'delay="-5s"', 'after="1e999s"', 'at="9999999-01-01T00:00:00Z"', 'event="a..b"',
    'binding="late"', 'version="2.0"', 'src="http://198.51.100.1/x.scxml"', 'src="/etc/passwd"',
    'src="../../../../etc/hostname"',
]

_ATTR = re.compile(r'\s[\w:]+="[^"]*"')
_TAGNAME = re.compile(r"(?<=<)/?([\w:]+)")
_ELEMENT = re.compile(r"<([\w:]+)[^<>]*/>|<([\w:]+)[^<>]*>[^<]*</\2>")


def _byte_flip(rng: random.Random, s: str) -> str:
    b = bytearray(s.encode("utf-8", errors="surrogateescape"))
    for _ in range(rng.randint(1, 5)):
        if b:
            b[rng.randrange(len(b))] = rng.randrange(256)
    return b.decode("utf-8", errors="surrogateescape")


def _char_edit(rng: random.Random, s: str) -> str:
    if not s:
        return rng.choice("<>&\"'=/ ")
    i = rng.randrange(len(s))
    op = rng.randrange(3)
    ch = rng.choice(['<', '>', '&', '"', "'", '=', '/', ' ', '\n', 'x', '#', '*', '.', '{', '}', ';',
                     '\x00', '\u00e9', '\U0001f600'])
    if op == 0:
        return s[:i] + ch + s[i + 1:]
    if op == 1:
        return s[:i] + ch + s[i:]
    return s[:i] + s[i + rng.randint(1, 8):]


def _truncate(rng: random.Random, s: str) -> str:
    return s[:rng.randrange(len(s) + 1)] if s else s


def _tag_swap(rng: random.Random, s: str) -> str:
    ms = list(_TAGNAME.finditer(s))
    if not ms:
        return s
    m = rng.choice(ms)
    new = rng.choice(TAGS)
    if rng.random() < 0.5:  # swap consistently (open and close), so it stays well-formed more often
        return re.sub(rf"(?<=<)(/?){re.escape(m.group(1))}\b", rf"\g<1>{new}", s)
    return s[:m.start(1)] + new + s[m.end(1):]


def _attr_delete(rng: random.Random, s: str) -> str:
    ms = list(_ATTR.finditer(s))
    if not ms:
        return s
    m = rng.choice(ms)
    return s[:m.start()] + s[m.end():]


def _attr_duplicate(rng: random.Random, s: str) -> str:
    ms = list(_ATTR.finditer(s))
    if not ms:
        return s
    m = rng.choice(ms)
    if rng.random() < 0.5:  # the same attribute twice (a syntax error)
        return s[:m.end()] + m.group() + s[m.end():]
    # the attribute copied onto another element
    targets = [t.end() for t in re.finditer(r"<[\w:]+", s)]
    at = rng.choice(targets) if targets else m.end()
    return s[:at] + m.group() + s[at:]


def _element_duplicate(rng: random.Random, s: str) -> str:
    ms = list(_ELEMENT.finditer(s))
    if not ms:
        return s
    m = rng.choice(ms)
    at = rng.choice([m.end(), rng.randrange(len(s) + 1)])
    return s[:at] + m.group() + s[at:]


def _element_delete(rng: random.Random, s: str) -> str:
    ms = list(_ELEMENT.finditer(s))
    if not ms:
        return s
    m = rng.choice(ms)
    return s[:m.start()] + s[m.end():]


def _splice(rng: random.Random, s: str) -> str:
    other = rng.choice(CORPUS)
    i, j = sorted(rng.randrange(len(other) + 1) for _ in range(2))
    at = rng.randrange(len(s) + 1)
    return s[:at] + other[i:j] + s[at:]


def _hostile(rng: random.Random, s: str) -> str:
    gaps = [m.end() for m in re.finditer(r">|\s", s)] or [0]
    at = rng.choice(gaps)
    return s[:at] + rng.choice(HOSTILE) + s[at:]


def _id_shuffle(rng: random.Random, s: str) -> str:
    ids = re.findall(r'(?:id|target|initial)="([^"]+)"', s)
    if len(ids) < 2:
        return s
    a, b = rng.sample(ids, 2)
    return s.replace(f'"{a}"', f'"{b}"', 1)


MUTATIONS = [_byte_flip, _char_edit, _truncate, _tag_swap, _attr_delete, _attr_duplicate,
             _element_duplicate, _element_delete, _splice, _hostile, _id_shuffle]


def mutate(rng: random.Random, text: str) -> str | bytes:
    s = text
    for _ in range(rng.randint(1, 4)):
        s = rng.choice(MUTATIONS)(rng, s)
    r = rng.random()
    if r < 0.15:  # raw bytes, possibly not valid UTF-8
        return s.encode("utf-8", errors="surrogateescape")
    if r < 0.25:  # a str as mutated: may hold lone surrogates, which no XML document can
        return s
    return s.encode("utf-8", errors="replace").decode("utf-8")


def check_case(text: str | bytes) -> str:
    """Compile one input; return "ok" or the error class name. Fails on anything untyped or slow."""
    t0 = time.perf_counter()
    try:
        c = sb.Chart.from_scxml(text)
        outcome = "ok"
        assert isinstance(c, sb.Chart)
        assert c.identity.startswith("sha256:")
        for sid in c.state_ids:
            assert c.state(sid).kind in ("atomic", "compound", "parallel", "final", "history")
    except sb.StateboundError as exc:
        outcome = type(exc).__name__
        str(exc)  # the message must be renderable
        if isinstance(exc, sb.ChartValidationError):
            assert exc.problems, "a validation error lists at least one problem"
    except BaseException as exc:
        pytest.fail(f"untyped {type(exc).__name__}: {exc!r} for input:\n{text!r}")
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, f"took {elapsed:.2f}s for input:\n{text!r}"
    return outcome


def run_fuzz(n: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    outcomes: dict[str, int] = {}
    for k in range(n):
        base = CORPUS[k % len(CORPUS)]
        out = check_case(mutate(rng, base))
        outcomes[out] = outcomes.get(out, 0) + 1
    return outcomes


def test_corpus_is_valid():
    for text in CORPUS:
        assert check_case(text) == "ok", text


@pytest.mark.parametrize("seed", range(4))
def test_mutated_scxml_raises_only_typed_errors(seed):
    outcomes = run_fuzz(550, seed)
    # the mutations must exercise both the syntax and the validation paths, not just one
    assert outcomes.get("ChartSyntaxError", 0) > 20, outcomes
    assert outcomes.get("ChartValidationError", 0) > 20, outcomes
    assert set(outcomes) <= {"ok", "ChartSyntaxError", "ChartValidationError", "ChartError"}, outcomes


def test_each_mutation_alone_raises_only_typed_errors():
    rng = random.Random(12345)
    for mutation in MUTATIONS:
        for base in CORPUS:
            for _ in range(4):
                check_case(mutation(rng, base))


@pytest.mark.slow
def test_mutated_scxml_slow_50k():
    outcomes = run_fuzz(50_000, seed=20240501)
    assert sum(outcomes.values()) == 50_000
