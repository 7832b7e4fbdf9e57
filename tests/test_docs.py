"""The docs agree with the code: README.md, docs/*.md, the ADRs and the Lambda example's README.

What a reader copies out of them must work: every Python call names parameters that exist
(and, in a code block, binds to the signature), every ``statebound`` command line parses
with the real CLI parser, every ``--flag`` is an option of the CLI, every link and every
path in backticks leads to a file, and the ADR index lists every ADR. The README's own
examples run in tests/test_readme.py.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import inspect
import io
import re
import shlex
import textwrap
from pathlib import Path
from typing import Any

import pytest

import statebound as sb
import statebound.aws
import statebound.chart.trust
import statebound.chart.xml
import statebound.dynamodb
import statebound.host
import statebound.host.host
import statebound.position
from statebound.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
ADR = ROOT / "docs" / "adr"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ADR.glob("*.md")),
        ROOT / "examples" / "lambda" / "README.md"]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _fenced(text: str) -> list[tuple[str, int, str]]:
    """``(language, first line, code)`` of each fenced block."""
    blocks, lang, start, body = [], None, 0, []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            if lang is None:
                lang, start, body = line.strip()[3:] or "text", n + 1, []
            else:
                blocks.append((lang, start, textwrap.dedent("\n".join(body))))
                lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def _spans(text: str) -> list[tuple[int, str]]:
    """``(line, code)`` of each inline code span."""
    return [(text[:m.start()].count("\n") + 1, m.group(1))
            for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", text)]


# ---------------------------------------------------------------------------- the ADR index

def test_the_adr_index_lists_every_adr_once_in_order_with_its_title():
    files = sorted(p.name for p in ADR.glob("[0-9][0-9][0-9][0-9]-*.md"))
    rows = re.findall(r"^\| \[(\d{4})\]\(([^)]+)\) \| (.+?) \| (.+?) \|$", (ADR / "README.md").read_text(), re.M)
    assert [target for _, target, _, _ in rows] == files, "docs/adr/README.md must list every ADR file, in order"
    assert [int(n) for n, _, _, _ in rows] == list(range(1, len(files) + 1)), "numbers: one each, no gaps"
    for number, target, decision, status in rows:
        heading, _, rest = (ADR / target).read_text().partition("\n")
        assert target.startswith(number) and heading == f"# {number} {decision}", target
        assert re.search(rf"^Status: {re.escape(status)}", rest, re.M), target   # amendments may follow


# ---------------------------------------------------------------------------- links and paths

def test_the_readme_links_every_doc_and_the_adr_index():
    linked = set(re.findall(r"\]\((docs/[^)#]+)\)", (ROOT / "README.md").read_text()))
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} | {"docs/adr/"} <= linked


def _headings(text: str) -> list[str]:
    """The headings of a page, outside fenced code, as written."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.append(line)
    return out


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    title = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_no_page_repeats_a_heading_and_every_anchor_lands(doc):
    text = doc.read_text()
    headings = _headings(text)
    repeated = sorted({h for h in headings if headings.count(h) > 1})
    assert not repeated, f"{_rel(doc)}: headings written twice: {repeated}"
    for target in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", text):
        page, anchor = target.split("#", 1)
        if page.startswith(("http://", "https://")):
            continue
        where = doc.parent / page if page else doc
        slugs = {_slug(h) for h in _headings(where.read_text())}
        assert anchor in slugs, f"{_rel(doc)}: link {target} names no heading of {where.name}"


def test_the_heading_check_can_fail():
    assert _slug("### `src` containment (every chart)") == "src-containment-every-chart"
    assert _headings("# A\n```\n# not a heading\n```\n## B") == ["# A", "## B"]


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_links_and_paths_lead_to_files(doc):
    text = doc.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not target.startswith(("http://", "https://", "mailto:", "#")):
            assert (doc.parent / target.split("#")[0]).exists(), f"{_rel(doc)}: broken link {target}"
    for _, span in _spans(text):
        path = span.split("::")[0]
        if re.fullmatch(r"(src|tests|examples|docs|bench)/[\w./-]+", path):
            assert (ROOT / path).exists(), f"{_rel(doc)}: {span} does not exist"


def test_every_extra_the_docs_and_errors_name_is_in_pyproject():
    """``pip install 'statebound[x]'`` works for each ``x`` the docs (and the error messages
    that give that advice) name."""
    import tomllib
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    texts = [doc.read_text() for doc in DOCS] + [p.read_text() for p in (ROOT / "src").rglob("*.py")]
    named = {extra for text in texts for extra in re.findall(r"statebound\[([a-z-]+)\]", text)}
    assert {"aws", "ecmascript", "cli"} <= named <= extras


def test_every_environment_variable_the_docs_name_is_read():
    read = {v for p in (ROOT / "src").rglob("*.py") for v in re.findall(r"\bSTATEBOUND_[A-Z_]+", p.read_text())}
    named = {v for doc in DOCS[:-1] for v in re.findall(r"\bSTATEBOUND_[A-Z_]+", doc.read_text())}
    assert {"STATEBOUND_STORE", "STATEBOUND_HISTORY"} <= named <= read


# ---------------------------------------------------------------------------- Python calls

def _namespace() -> tuple[dict[str, Any], dict[str, Any]]:
    """What a name in the docs stands for: public classes and functions, and the variables
    the docs use throughout (``host``, ``chart``, ``pos``...) as real instances."""
    names: dict[str, Any] = {n: getattr(sb, n) for n in sb.__all__}
    for module in (statebound.host, statebound.dynamodb, statebound.aws):
        names.update({n: getattr(module, n) for n in module.__all__})
    chart = sb.Chart.from_file(ROOT / "examples" / "order" / "order.scxml")
    host = sb.Host([chart], sb.MemoryStore(), sb.ManualClock())
    interp = sb.Interpreter(chart)
    pos, _ = interp.start()
    variables = {"host": host, "shop": host, "chart": chart, "interp": interp, "pos": pos, "clock": host.clock,
                 "sweeper": sb.Sweeper(host)}
    return names, variables


class _Missing(str):
    """An attribute the docs name that the code does not have."""


def _resolve(node: ast.expr, names: dict[str, Any], variables: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        return variables.get(node.id, names.get(node.id))
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "sb":
            base: Any = sb
        else:
            base = _resolve(node.value, names, variables)
            if base is None or isinstance(base, _Missing):
                return None
        if hasattr(base, node.attr) or (isinstance(base, type) and _instance_attribute(base, node.attr)):
            return getattr(base, node.attr, None)
        return _Missing(ast.unparse(node))
    return None


def _instance_attribute(cls: type, attr: str) -> bool:
    """``cls`` instances get ``attr`` in ``__init__`` (``Error.code``) or as a dataclass field."""
    return attr in getattr(cls, "__dataclass_fields__", {}) or any(
        f"self.{attr} =" in inspect.getsource(k) for k in cls.__mro__ if k.__module__.startswith("statebound"))


def _call_problems(code: str, names: dict[str, Any], variables: dict[str, Any], *, bind: bool) -> list[str]:
    """Names that do not exist, and calls whose arguments the signature refuses. ``bind``:
    check the positional arguments too (a code block); prose spans abbreviate them."""
    problems = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Attribute) and isinstance(_resolve(node, names, variables), _Missing):
            problems.append(f"no such name: {ast.unparse(node)}")
        if not isinstance(node, ast.Call):
            continue
        fn = _resolve(node.func, names, variables)
        if fn is None or isinstance(fn, _Missing) or not callable(fn):
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        try:
            signature = inspect.signature(fn)
            signature.bind(*node.args, **keywords) if bind else signature.bind_partial(**keywords)
        except TypeError as exc:
            problems.append(f"{ast.unparse(node)[:90]}: {exc}")
        except ValueError:  # a builtin without a signature
            continue
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_python_in_the_docs_calls_the_api_as_it_is(doc):
    names, variables = _namespace()
    text = doc.read_text()
    problems = []
    for lang, line, code in _fenced(text):
        if lang == "python":
            problems += [f"{_rel(doc)}:{line}: {p}" for p in _call_problems(code, names, variables, bind=True)]
    for line, span in _spans(text):
        if re.fullmatch(r"[\w./-]+\.(py|md|scxml|yaml|json|jsonl|db|bin|txt|toml)", span):
            continue   # a file name, not an attribute
        with contextlib.suppress(SyntaxError):
            problems += [f"{_rel(doc)}:{line}: {p}" for p in _call_problems(span, names, variables, bind=False)]
    assert not problems, "\n".join(problems)


def test_the_call_check_catches_a_parameter_that_does_not_exist():
    names, variables = _namespace()
    assert _call_problems('sb.Chart.from_file("x", trust="untrusted")', names, variables, bind=True) == []
    assert _call_problems('host.send("o", "E", idempotency_key="k")', names, variables, bind=True) == []
    [wrong] = _call_problems('sb.Chart.from_file("x", trusted=True)', names, variables, bind=True)
    assert "trusted" in wrong
    [extra] = _call_problems('host.get("o", "p")', names, variables, bind=True)
    assert "too many positional" in extra
    assert _call_problems("sb.NoSuchThing", names, variables, bind=False) == ["no such name: sb.NoSuchThing"]


def test_documented_values_are_the_code_s():
    text = (ROOT / "docs" / "persistence.md").read_text()
    fields = re.search(r"`Position\.PER_DRIVER_FIELDS` is `(\([^`]*\))`", text, re.S)
    assert fields and ast.literal_eval(fields.group(1)) == sb.Position.PER_DRIVER_FIELDS


def test_what_the_docs_say_an_error_is_it_is():
    """``X` (a `Y`)``, ``X` (also a `Y`)``, ``X`, a `Y``: each X is a subclass of Y."""
    import builtins
    names, _ = _namespace()
    names.update({n: getattr(statebound.position, n) for n in statebound.position.__all__})
    claims = {(doc, a, b) for doc in DOCS for a, b in re.findall(
        r"`(?:sb\.)?([A-Z]\w+)`,? \(?(?:also )?an? `(?:sb\.)?([A-Z]\w+)`", doc.read_text())}
    checked = [(a, b) for _, a, b in claims if a in names and (b in names or hasattr(builtins, b))]
    assert len(checked) >= 5
    wrong = [f"{_rel(doc)}: {a} is not a {b}" for doc, a, b in claims if a in names and isinstance(names[a], type)
             and not issubclass(names[a], names.get(b) or getattr(builtins, b, object))]
    assert not wrong, "\n".join(wrong)


def _amount(text: str) -> int:
    """``"5,000 ms"`` -> 5000, ``"64 MiB"`` -> 67108864: the first amount in a table cell."""
    m = re.search(r"(\d[\d,]*)\s*(KiB|MiB)?", text)
    assert m, text
    return int(m.group(1).replace(",", "")) * {None: 1, "KiB": 1024, "MiB": 1024 ** 2}[m.group(2)]


def _table_rows(doc: Path, header: str) -> list[list[str]]:
    table = (ROOT / "docs" / doc).read_text().split(header, 1)[1].split("\n\n", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_the_limits_tables_give_the_code_s_defaults():
    """docs/security.md's and docs/datamodels.md's tables of limits: each default is the one
    the named keyword, ``Limits`` field or constant has."""
    pytest.importorskip("quickjs")
    from statebound.datamodel.ecmascript import DEFAULT_LIMITS

    def defaults(where: str) -> list[int]:
        found = [inspect.signature(getattr(sb, cls)).parameters[kw].default
                 for cls, kw in re.findall(r"(Host|Interpreter)\((\w+)=\)", where)]
        found += [getattr(DEFAULT_LIMITS, kw) for kw in re.findall(r"Limits\((\w+)=\)", where)]
        found += [inspect.signature(sb.Interpreter).parameters[kw].default
                  for kw in re.findall(r"^`(max_rounds)=`$", where)]
        found += [getattr(module, name) for module in (statebound.chart.xml, statebound.host.host)
                  for name in re.findall(r"`(?:[\w.]+\.)?([A-Z_]+)`", where) if hasattr(module, name)]
        return found
    checked = 0
    for limit, default, where, _ in _table_rows(Path("security.md"), "| limit | default | where | what happens |"):
        if limit.startswith("`src` bytes"):
            documented = tuple(_amount(part) for part in default.split("/"))
            assert documented == (statebound.chart.trust.MAX_LOADED_BYTES, statebound.chart.trust.MAX_LOADED_CHARTS)
            checked += 1
        for value in defaults(where):
            assert value == _amount(default), (limit, where)
            checked += 1
    for name, default, _ in _table_rows(Path("datamodels.md"), "| limit | default | what it bounds |"):
        kw = name.split("`")[1]
        value = getattr(DEFAULT_LIMITS, kw) if hasattr(DEFAULT_LIMITS, kw) else inspect.signature(
            sb.Host).parameters[kw].default
        assert value == _amount(default), name
        checked += 1
    assert checked >= 14


# ---------------------------------------------------------------------------- the command line

def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    found = {o for a in parser._actions for o in a.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= _options(child)
    return found


def _parse(argv: list[str]) -> str | None:
    """The parser's complaint about ``argv``, or None when it parses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(argv)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return None


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_statebound_command_lines_parse(doc):
    """A command line in a code block parses whole; one in prose names a command that exists
    and only its options (prose may leave out the arguments)."""
    text = doc.read_text()
    commands = _subparsers(build_parser())
    problems = []
    for lang, line, code in _fenced(text):
        if lang in ("sh", "bash", "console", "text"):
            for n, command in enumerate(code.splitlines(), line):
                command = command.strip().removeprefix("$ ")
                if command.startswith("statebound "):
                    complaint = _parse(shlex.split(command, comments=True)[1:])
                    if complaint:
                        problems.append(f"{_rel(doc)}:{n}: {command}: {complaint}")
    for n, span in _spans(text):
        words = span.split()
        if words[0] != "statebound" or len(words) < 2:
            continue
        words = [w for w in words[1:] if w != "--json"]
        if words[0] not in commands:
            problems.append(f"{_rel(doc)}:{n}: no command {words[0]!r}: {span}")
            continue
        allowed = _options(commands[words[0]]) | _options(build_parser())
        problems += [f"{_rel(doc)}:{n}: {words[0]} has no {w}: {span}" for w in words[1:]
                     if w.startswith("--") and w.split("=")[0] not in allowed]
    assert not problems, "\n".join(problems)


def test_every_flag_the_docs_name_is_a_cli_option():
    """README.md and docs/ (the Lambda README also names its scripts' flags)."""
    options = _options(build_parser())
    named = {(doc, flag) for doc in DOCS[:-1] for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", doc.read_text())}
    assert len(named) > 20
    assert not {f"{_rel(doc)}: {flag}" for doc, flag in named if flag not in options}


def test_the_command_line_check_can_fail():
    assert _parse(["--store", "x.db", "timers", "--window", "2h"]) is None
    assert "unrecognized arguments: --nope" in (_parse(["timers", "--nope"]) or "")
    assert "invalid choice" in (_parse(["no-such-command"]) or "")
