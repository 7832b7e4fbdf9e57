"""Chart snippets shared by the hostile-chart tests."""

from __future__ import annotations

SECRET = "TOPSECRET-4f1c2a"
NS = 'xmlns="http://www.w3.org/2005/07/scxml" version="1.0"'


def scxml(body: str, datamodel: str | None = "ecmascript", attrs: str = "") -> str:
    """A chart document; ``datamodel=None`` leaves the attribute out (python by default)."""
    dm = f' datamodel="{datamodel}"' if datamodel else ""
    return f"<scxml {NS}{dm} {attrs}>{body}</scxml>"


#: A state that logs every error event with label ``error`` (what Outcome.messages reads).
CATCH = '<transition event="error.*"><log label="error" expr="_event.data.message"/></transition>'
CATCH_PY = "<transition event=\"error.*\"><log label=\"error\" expr=\"_event.data['message']\"/></transition>"
