"""Child process for the black-box crash test (tests/test_host_crash.py).

``python _crash_child.py DB START TARGET``: opens the SQLite store, starts the counter
instance ``c`` if it does not exist, then sends ``inc`` for k = START+1 .. TARGET and prints
``ack k`` (flushed) after each send returns. The parent SIGKILLs it at random moments.
"""

from __future__ import annotations

import sys

import statebound as sb

COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" datamodel="python"
       name="counter" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <transition event="inc"><assign location="n" expr="n + 1"/></transition>
  </state>
</scxml>"""


def chart() -> sb.Chart:
    return sb.Chart.from_scxml(COUNTER)


def main(argv: list[str]) -> int:
    db, start, target = argv[0], int(argv[1]), int(argv[2])
    store = sb.SQLiteStore(db)
    host = sb.Host([chart()], store=store)
    if not host.exists("c"):
        try:
            host.start("counter", "c")
        except sb.InstanceExists:
            pass
    for k in range(start + 1, target + 1):
        host.send("c", "inc")
        sys.stdout.write(f"ack {k}\n")
        sys.stdout.flush()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
