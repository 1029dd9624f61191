"""Commit order of snapshots: the sequence number on format v2+, an *ordinal* on format v1.

Sequence numbers decide three things: which batches a sink already applied (``batch.decide``), the
external version of an OpenSearch document (a re-applied or older write loses), and which image is the
latest in net changes over a range. A format v1 table has none (every snapshot reads 0), so a v1 line
numbers its snapshots itself, along their parent ids:

    ordinal(S) = ordinal(A) + (steps from anchor A down the parent chain to S)

The anchor A is the last snapshot the line's changelog stored a batch for, with the ordinal that batch
recorded (the Dagster layer reads it from that materialisation: the line's own record, in the instance,
next to the partition keys). Without an anchor (a line's first batch) the ordinal is the snapshot's
depth in the current ancestry (the root is 1), which is what a v2 table's sequence numbers would have
been had it never expired a snapshot.

Why not the depth alone: expiring old snapshots shortens the ancestry, so depths shrink and a sink would
take every later batch for one it already applied. Counted from the anchor, the numbers never change:
only the anchor's own expiry (with its descendants up to the batch) breaks the count, and then the line
cannot continue anyway (``steps.lifecycle``: the recovery is ``icecdc resync``, whose new line starts
over from its bootstrap's depth; OpenSearch versions of a new line are shifted above the old line's).

v1 tables hold no delete files (the spec has none), so every v1 snapshot is copy-on-write; a v1 table set
to merge-on-read is refused (:func:`check_copy_on_write`). On v2+ nothing here changes any number.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from icecdc_dagster.changelog.plan import SnapshotPlan, snapshot_or_raise, table_name
from icecdc_dagster.errors import SnapshotOrderLostError, UnsupportedFormatVersionError

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

ROW_LEVEL_MODES = ("write.delete.mode", "write.update.mode", "write.merge.mode")
MERGE_ON_READ = "merge-on-read"


@dataclass(frozen=True)
class OrdinalAnchor:
    """A snapshot of a v1 line and the ordinal the line gave it (the last batch the line stored)."""

    snapshot_id: int
    ordinal: int


def has_sequence_numbers(table: "Table") -> bool:
    return int(table.metadata.format_version) >= 2


def check_copy_on_write(table: "Table") -> None:
    """A v1 table cannot hold delete files: a merge-on-read mode on it is a setting no writer can honour
    (Spark fails its row-level commands), and the line refuses it with the two ways out."""
    if has_sequence_numbers(table):
        return
    set_to = {k: v for k in ROW_LEVEL_MODES if (v := table.properties.get(k, "").lower()) == MERGE_ON_READ}
    if set_to:
        name = table_name(table)
        modes = ", ".join(f"{k}={v}" for k, v in set_to.items())
        raise UnsupportedFormatVersionError(
            f"table {name} is Iceberg format v1 with {modes}: a v1 table cannot hold delete files, so its "
            f"row-level changes must be copy-on-write; set the mode(s) to copy-on-write (ALTER TABLE {name} SET "
            f"TBLPROPERTIES ('{next(iter(set_to))}'='copy-on-write')) or upgrade the table to format v2")


def steps_down(table: "Table", descendant: int, ancestor: int) -> int | None:
    """Parent links from ``descendant`` up to ``ancestor`` (None: not an ancestor, or the chain between
    them was expired). ``ancestor`` itself may be expired: its child still names it as parent."""
    steps = 0
    current: int | None = descendant
    while current is not None:
        if current == ancestor:
            return steps
        snapshot = table.metadata.snapshot_by_id(current)
        if snapshot is None:
            return None
        current, steps = snapshot.parent_snapshot_id, steps + 1
    return None


def ancestry_depth(table: "Table", snapshot_id: int) -> int:
    """1 for the oldest surviving ancestor, +1 per commit after it."""
    depth = 0
    current: Snapshot | None = snapshot_or_raise(table, snapshot_id)
    while current is not None:
        depth += 1
        parent = current.parent_snapshot_id
        current = table.metadata.snapshot_by_id(parent) if parent is not None else None
    return depth


def ordinal(table: "Table", snapshot_id: int, anchor: OrdinalAnchor | None) -> int:
    """The v1 ordinal of a snapshot, counted from ``anchor`` (either direction) or, without one, its depth."""
    sid = int(snapshot_id)
    if anchor is None:
        return ancestry_depth(table, sid)
    after = steps_down(table, sid, anchor.snapshot_id)
    if after is not None:
        return anchor.ordinal + after
    before = steps_down(table, anchor.snapshot_id, sid)
    if before is not None:
        return anchor.ordinal - before
    raise SnapshotOrderLostError(
        f"table {table_name(table)} is Iceberg format v1: its snapshots are numbered along their parent ids from "
        f"snapshot {anchor.snapshot_id} (ordinal {anchor.ordinal}, the line's last stored batch), but snapshot "
        f"{sid} is no longer linked to it (rolled back, or the snapshots between them were expired), so its "
        f"place in the line cannot be counted")


def uses_ordinals(table: "Table", anchor: OrdinalAnchor | None) -> bool:
    """A v1 table, or a line that counted ordinals and still does: a v1 table upgraded to v2 under a
    running line numbers its new snapshots from 1 again, below what the sinks hold, so the line goes on
    counting (the caller passes the line's anchor) until its next resync."""
    return anchor is not None or not has_sequence_numbers(table)


def sequence_number(table: "Table", snapshot_id: int, anchor: OrdinalAnchor | None = None) -> int:
    """The number that orders ``snapshot_id`` in its line: its sequence number (v2+) or its ordinal (v1)."""
    if not uses_ordinals(table, anchor):
        return int(snapshot_or_raise(table, snapshot_id).sequence_number or 0)
    return ordinal(table, snapshot_id, anchor)


def ordered_plans(table: "Table", plans: Sequence[SnapshotPlan], anchor: OrdinalAnchor | None) -> list[SnapshotPlan]:
    """``plans`` with their v1 ordinals as sequence numbers (unchanged on v2+)."""
    if not uses_ordinals(table, anchor) or not plans:
        return list(plans)
    first = ordinal(table, plans[0].snapshot_id, anchor)
    return [replace(plan, sequence_number=first + position) for position, plan in enumerate(plans)]
