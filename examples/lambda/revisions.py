"""List instances per chart revision: which revisions still have instances to drain.

    python revisions.py --table TABLE [--charts charts/] [--ids] [--json]

For each chart and revision it counts the instances by status (running, done,
cancelled), reading the revision from each position's blob header (what the host itself
uses to pick the revision, so the count cannot disagree with what will run). With
``--charts``, revisions that are not in that directory are flagged: a running instance
on one of them cannot be driven until the revision is shipped again. A revision whose
``running`` count is 0 may be removed from ``charts/`` at the next deployment.

Cost: one paginated ``Scan`` of the table, which reads every item (positions and timer
rows) once: about one read unit per 4 KB per item, a few dollars per million items at
on-demand prices. It is an operator's tool for upgrades, not something to run per request.
Credentials and region come from the usual AWS settings (``AWS_PROFILE``, ...).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import statebound as sb
from statebound import jsonio
from statebound.position import read_header

#: The sort key of a position item (``docs/dynamodb.md``, "Item layout"); timer rows and
#: internal items have other sort keys.
POSITION_SK = "P"
STATUSES = ("running", "done", "cancelled")


@dataclass
class RevisionCount:
    """The instances of one chart revision."""

    chart: str
    revision: str | None
    identity: str
    by_status: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    ids: list[str] = field(default_factory=list)
    deployed: bool | None = None

    @property
    def running(self) -> int:
        """Instances that still need this revision."""
        return self.by_status.get("running", 0)


def _positions(client: Any, table: str) -> Iterator[dict[str, Any]]:
    kwargs: dict[str, Any] = {
        # a deleted instance's tombstone (statebound's ADR 0028) is no instance
        "TableName": table, "FilterExpression": "#sk = :p AND #status <> :deleted",
        "ProjectionExpression": "#pk, #chart, #status, #blob",
        "ExpressionAttributeNames": {"#pk": "pk", "#sk": "sk", "#chart": "chart", "#status": "status", "#blob": "blob"},
        "ExpressionAttributeValues": {":p": {"S": POSITION_SK}, ":deleted": {"S": "deleted"}},
    }
    while True:
        page = client.scan(**kwargs)
        yield from page.get("Items", [])
        if not page.get("LastEvaluatedKey"):
            return
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def count_by_revision(client: Any, table: str, *, deployed: Sequence[sb.Chart] | None = None,
                      with_ids: bool = False) -> list[RevisionCount]:
    """Count the table's instances per chart revision (see the module doc)."""
    counts: dict[tuple[str, str], RevisionCount] = {}
    for item in _positions(client, table):
        try:
            header = read_header(bytes(item["blob"]["B"]))
        except (sb.PositionError, KeyError):
            header = None
        chart = item.get("chart", {}).get("S", "?")
        key = (chart, header.identity if header else "unreadable")
        entry = counts.get(key)
        if entry is None:
            entry = counts[key] = RevisionCount(chart, header.chart_version if header else None, key[1])
        status = item.get("status", {}).get("S", "?")
        entry.by_status[status] = entry.by_status.get(status, 0) + 1
        if with_ids:
            entry.ids.append(item["pk"]["S"])
    if deployed is not None:
        shipped = {(c.name, c.identity) for c in deployed}
        for entry in counts.values():
            entry.deployed = (entry.chart, entry.identity) in shipped
    return sorted(counts.values(), key=lambda e: (e.chart, e.revision or "", e.identity))


def _table(rows: list[RevisionCount]) -> str:
    lines = [f"{'chart':<20} {'revision':<10} {'running':>8} {'done':>8} {'cancelled':>9}  note"]
    for r in rows:
        note = "NOT DEPLOYED" if r.deployed is False and r.running else ""
        if r.deployed is False and not r.running:
            note = "not deployed (nothing to drain)"
        lines.append(f"{r.chart:<20} {r.revision or '-':<10} {r.running:>8} {r.by_status.get('done', 0):>8} "
                     f"{r.by_status.get('cancelled', 0):>9}  {note}".rstrip())
        if r.ids:
            lines.append("    " + " ".join(r.ids))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, *, client: Any = None) -> int:
    """The command line (``client`` lets tests pass a moto client)."""
    p = argparse.ArgumentParser(prog="revisions.py", description=__doc__.splitlines()[0])
    p.add_argument("--table", required=True, help="the statebound table (the stack's TableName output)")
    p.add_argument("--charts", help="a charts/ directory: flag revisions it does not ship")
    p.add_argument("--ids", action="store_true", help="list the instance ids too")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--region", help="AWS region (default: your AWS configuration's)")
    p.add_argument("--endpoint-url", help="a DynamoDB endpoint other than AWS's (e.g. a local one)")
    args = p.parse_args(argv)
    if client is None:
        import boto3
        client = boto3.client("dynamodb", region_name=args.region, endpoint_url=args.endpoint_url)
    deployed = None
    if args.charts:
        from chart_revisions import load_charts
        deployed = load_charts(args.charts)
    rows = count_by_revision(client, args.table, deployed=deployed, with_ids=args.ids)
    if args.json:
        print(jsonio.dumps([{"chart": r.chart, "revision": r.revision, "identity": r.identity,
                                "by_status": r.by_status, "deployed": r.deployed, "ids": r.ids or None}
                               for r in rows], indent=2))
    else:
        print(_table(rows))
    return 1 if any(r.deployed is False and r.running for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
