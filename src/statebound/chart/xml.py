"""Safe XML reading for SCXML: a tiny element tree built on expat, with locations.

Why not ``xml.etree`` directly: we need the line and column of every element for
validation messages, and we must refuse DTDs and entity declarations outright (XML bombs,
external entities) instead of trusting the parser's defaults. Nothing here ever touches
the network or the filesystem.
"""

from __future__ import annotations

import xml.parsers.expat
from dataclasses import dataclass, field

from ..exceptions import ChartSyntaxError

__all__ = ["El", "parse_xml", "serialize", "SCXML_NS", "SB_NS", "MAX_DOCUMENT_BYTES", "MAX_ELEMENTS"]

#: The SCXML namespace, and statebound's own for its extensions (``<sb:timeout>``).
SCXML_NS = "http://www.w3.org/2005/07/scxml"
SB_NS = "urn:statebound"
#: Documents above this size are refused before parsing (a chart is not a data set).
MAX_DOCUMENT_BYTES = 8 * 1024 * 1024
#: Elements one document may hold. Bytes alone do not bound a load: 8 MiB of ``<s/>`` is two
#: million elements, gigabytes once compiled. Real charts have thousands at most.
MAX_ELEMENTS = 100_000
_MAX_DEPTH = 200


@dataclass(eq=False)
class El:
    """A parsed element. ``ns`` is the namespace URI, ``tag`` the local name."""

    ns: str
    tag: str
    attrib: dict[str, str]
    line: int
    column: int
    children: list[El] = field(default_factory=list)
    text: str = ""          # text before the first child
    tails: list[str] = field(default_factory=list)  # text after each child
    nsmap: dict[str, str] = field(default_factory=dict)  # prefixes declared on this element

    @property
    def is_scxml(self) -> bool:
        """True for elements in the SCXML namespace."""
        return self.ns == SCXML_NS

    def all_text(self) -> str:
        """Text content, children's markup excluded."""
        return self.text + "".join(self.tails)

    def scxml_children(self, *tags: str) -> list[El]:
        """Children in the SCXML namespace, optionally restricted to ``tags``."""
        return [c for c in self.children if c.ns == SCXML_NS and (not tags or c.tag in tags)]


def _split(name: str) -> tuple[str, str]:
    if " " in name:
        ns, local = name.split(" ", 1)
        return ns, local
    return "", name


def parse_xml(text: str | bytes, source: str | None = None, max_elements: int = MAX_ELEMENTS) -> El:
    """Parse ``text`` into an :class:`El` tree, refusing DTDs, entities and oversized input.

    :param max_elements: refuse the document past this many elements.
    :raises ChartSyntaxError: with line and column for any XML error.
    """
    if isinstance(text, str):
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: no XML document can contain it
            line = text.count("\n", 0, exc.start) + 1
            column = exc.start - (text.rfind("\n", 0, exc.start) + 1) + 1
            raise ChartSyntaxError(f"malformed XML: character {text[exc.start]!r} cannot be encoded",
                                   line, column, source) from None
    else:
        data = bytes(text)
    if len(data) > MAX_DOCUMENT_BYTES:
        raise ChartSyntaxError(f"document is {len(data)} bytes, over the {MAX_DOCUMENT_BYTES} byte limit",
                               source=source)
    # A str was encoded as UTF-8 just above: that overrides any encoding= it declares.
    p = xml.parsers.expat.ParserCreate("utf-8" if isinstance(text, str) else None, namespace_separator=" ")
    # Refusing at the declaration means no entity is ever defined, so none can expand.
    def refuse_doctype(*_a: object) -> None:
        raise ChartSyntaxError("DTDs are not allowed in SCXML charts", p.CurrentLineNumber,
                               p.CurrentColumnNumber + 1, source)

    def refuse_entity(*_a: object) -> None:
        raise ChartSyntaxError("entity declarations are not allowed", p.CurrentLineNumber,
                               p.CurrentColumnNumber + 1, source)

    p.StartDoctypeDeclHandler = refuse_doctype
    p.EntityDeclHandler = refuse_entity
    p.UnparsedEntityDeclHandler = refuse_entity
    p.ExternalEntityRefHandler = lambda *a: 0  # never fetch anything
    try:
        p.SetParamEntityParsing(xml.parsers.expat.XML_PARAM_ENTITY_PARSING_NEVER)
    except AttributeError:  # pragma: no cover - very old expat
        pass

    root: list[El] = []
    stack: list[El] = []
    pending_ns: dict[str, str] = {}
    count = [0]
    # Character data comes in one call per line or entity: appended to the element one
    # piece at a time (``el.text += data``), each append copied all the text before it, so
    # 1.5 MB of newlines took about a minute, event data that looks like XML included. The
    # pieces of the current run of text are kept here and joined once.
    pieces: list[str] = []
    into: list[El | None] = [None]   # the element whose text (or last tail) the run belongs to

    def flush() -> None:
        el = into[0]
        if el is not None and pieces:
            if el.children:
                el.tails[-1] += "".join(pieces)
            else:
                el.text += "".join(pieces)
        pieces.clear()
        into[0] = None

    def start_ns(prefix: str | None, uri: str) -> None:
        pending_ns[prefix or ""] = uri

    def start(name: str, attrs: dict[str, str]) -> None:
        flush()
        if len(stack) >= _MAX_DEPTH:
            raise ChartSyntaxError(f"elements nested deeper than {_MAX_DEPTH}", p.CurrentLineNumber,
                                   p.CurrentColumnNumber + 1, source)
        count[0] += 1
        if count[0] > max_elements:
            raise ChartSyntaxError(f"more than {max_elements} elements", p.CurrentLineNumber,
                                   p.CurrentColumnNumber + 1, source)
        ns, tag = _split(name)
        attrib = {}
        for k, v in attrs.items():
            ans, local = _split(k)
            attrib[f"{{{ans}}}{local}" if ans else local] = v
        el = El(ns, tag, attrib, p.CurrentLineNumber, p.CurrentColumnNumber + 1, nsmap=dict(pending_ns))
        pending_ns.clear()
        if stack:
            parent = stack[-1]
            parent.children.append(el)
            parent.tails.append("")
        elif root:
            raise ChartSyntaxError("more than one root element", el.line, el.column, source)
        else:
            root.append(el)
        stack.append(el)

    def end(_name: str) -> None:
        flush()
        stack.pop()

    def chars(data: str) -> None:
        if not stack:
            return
        into[0] = stack[-1]   # (an element's start or end flushes first: one run, one place)
        pieces.append(data)

    p.StartNamespaceDeclHandler = start_ns
    p.StartElementHandler = start
    p.EndElementHandler = end
    p.CharacterDataHandler = chars
    p.buffer_text = True
    try:
        p.Parse(data, True)
        flush()
    except xml.parsers.expat.ExpatError as exc:
        raise ChartSyntaxError(f"malformed XML: {xml.parsers.expat.ErrorString(exc.code)}",
                               exc.lineno, exc.offset + 1, source) from None
    except (LookupError, ValueError, UnicodeError) as exc:  # encoding= names no usable text codec
        raise ChartSyntaxError(f"malformed XML: unsupported document encoding ({exc})", p.CurrentLineNumber,
                               p.CurrentColumnNumber + 1, source) from None
    except RecursionError:  # pragma: no cover - guarded by _MAX_DEPTH
        raise ChartSyntaxError("document nested too deeply", source=source) from None
    if not root:
        raise ChartSyntaxError("empty document", source=source)
    return root[0]


def _esc(s: str, attr: bool = False) -> str:
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.replace('"', "&quot;") if attr else s


def serialize(el: El, _inherited: dict[str, str] | None = None) -> str:
    """Serialize an element back to XML text (used for ``<content>`` markup and sub-charts)."""
    inherited = dict(_inherited or {})
    decls: dict[str, str] = {}
    # Make the fragment self-contained: declare every namespace it uses.
    if el.ns and inherited.get("") != el.ns:
        decls[""] = el.ns
    for prefix, uri in el.nsmap.items():
        if prefix and inherited.get(prefix) != uri:
            decls[prefix] = uri
    scope = {**inherited, **decls}
    prefixes = {uri: pfx for pfx, uri in scope.items() if pfx}
    parts = [f"<{el.tag}"]
    for pfx, uri in decls.items():
        parts.append(f' xmlns="{_esc(uri, True)}"' if not pfx else f' xmlns:{pfx}="{_esc(uri, True)}"')
    for k, v in el.attrib.items():
        if k.startswith("{"):
            uri, local = k[1:].split("}", 1)
            apfx = prefixes.get(uri)
            if apfx is None:
                apfx = f"ns{len(prefixes)}"
                prefixes[uri] = apfx
                parts.append(f' xmlns:{apfx}="{_esc(uri, True)}"')
            k = f"{apfx}:{local}"
        parts.append(f' {k}="{_esc(v, True)}"')
    if not el.children and not el.text:
        return "".join(parts) + "/>"
    parts.append(">")
    parts.append(_esc(el.text))
    for child, tail in zip(el.children, el.tails, strict=True):
        parts.append(serialize(child, scope))
        parts.append(_esc(tail))
    parts.append(f"</{el.tag}>")
    return "".join(parts)
