"""When the table changes under a line: rollback, expired snapshots, a recreated table, and resync.

A table's *line* is its partition keys in commit order. Normally a key is a snapshot id and the
first key is the bootstrap (export). ``icecdc resync`` starts a new line: it adds a key
``<snapshot id>@resync<n>`` (a new bootstrap at the current snapshot) and everything before it is
*superseded*: kept for lineage, never planned or applied again. The key itself carries the mark,
so the partitions alone (which survive daemon restarts) say which line is active, and the line
token (the resync key) lets each sink tell an export of a new line from a replay of the old one.

:func:`diagnose` looks at table metadata only and says, in one message naming the snapshot and
the recovery command, why a line cannot continue. Sensors, ``icecdc status``, ``icecdc sync`` and
an asset check use it instead of raising on every tick. No Dagster imports here.
"""

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from icecdc_dagster import changelog
from icecdc_dagster.batch import RESYNC_KEY
from icecdc_dagster.errors import (
    LineDivergedError,
    SnapshotExpiredError,
    TableRecreatedError,
    TableRolledBackError,
    resync_command,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table

RESYNC_MARK = "@resync"


def snapshot_id_of(key: str) -> int:
    """The snapshot id of a partition key (``123`` or ``123@resync2``)."""
    match = RESYNC_KEY.match(key)
    return int(match.group(1)) if match else int(key)


def is_resync_key(key: str) -> bool:
    return RESYNC_KEY.match(key) is not None


def resync_key(snapshot_id: int, keys: Sequence[str]) -> str:
    """The key of the next resync bootstrap: a counter over the resyncs the line already had."""
    count = sum(1 for k in keys if is_resync_key(k))
    return f"{snapshot_id}{RESYNC_MARK}{count + 1}"


def _last_resync_index(keys: Sequence[str]) -> int:
    for index in range(len(keys) - 1, -1, -1):
        if is_resync_key(keys[index]):
            return index
    return 0


def active_keys(keys: Sequence[str]) -> list[str]:
    """The keys of the current line: from the last resync bootstrap on (all keys without one)."""
    return list(keys[_last_resync_index(keys):])


def superseded_keys(keys: Sequence[str]) -> list[str]:
    return list(keys[:_last_resync_index(keys)])


def line_token(keys: Sequence[str]) -> str | None:
    """The resync key of the active line, None for the original line."""
    first = active_keys(keys)[:1]
    return first[0] if first and is_resync_key(first[0]) else None


class Problem(enum.Enum):
    ROLLED_BACK = "rolled back"
    EXPIRED = "snapshot expired"
    RECREATED = "table recreated"


_ERRORS = {Problem.ROLLED_BACK: TableRolledBackError, Problem.EXPIRED: SnapshotExpiredError,
           Problem.RECREATED: TableRecreatedError}


@dataclass(frozen=True)
class LineProblem:
    kind: Problem
    table_name: str
    snapshot_id: int | None  # the line's snapshot that the table no longer continues from
    message: str             # what happened + the command that recovers

    def error(self) -> LineDivergedError:
        return _ERRORS[self.kind](self.message)


def _ancestry(source: "Table") -> tuple[list[int], int | None]:
    """Current ancestry ids (oldest first) and the parent id of the oldest one that survived expiry."""
    metadata = source.metadata
    chain, snapshot, cut_parent = [], metadata.current_snapshot(), None
    while snapshot is not None:
        chain.append(snapshot.snapshot_id)
        parent = snapshot.parent_snapshot_id
        snapshot = metadata.snapshot_by_id(parent) if parent is not None else None
        if snapshot is None and parent is not None:
            cut_parent = parent
    return chain[::-1], cut_parent


def table_uuid(source: "Table") -> str:
    return str(source.metadata.table_uuid)


def checkpoint_problem(source: "Table", table_name: str, snapshot_id: int, config_path: str | None,
                       what: str = "the line") -> LineProblem | None:
    """Why the table cannot continue from ``snapshot_id`` (a key or a sink's checkpoint), or None.

    A snapshot that was expired after the line moved past it is fine when the oldest surviving
    ancestor's parent is that snapshot: the chain after it is intact.
    """
    ancestry, cut_parent = _ancestry(source)
    if snapshot_id in ancestry or snapshot_id == cut_parent:
        return None
    cmd = resync_command(table_name, config_path)
    current = ancestry[-1] if ancestry else None
    if source.metadata.snapshot_by_id(snapshot_id) is not None:
        return LineProblem(Problem.ROLLED_BACK, table_name, snapshot_id, (
            f"{table_name} was rolled back: snapshot {snapshot_id} ({what}) is not an ancestor of the current "
            f"snapshot {current}, so changes already synced are no longer in the table and the next batches "
            f"cannot follow them. Recover: {cmd}"))
    return LineProblem(Problem.EXPIRED, table_name, snapshot_id, (
        f"{table_name}: snapshot {snapshot_id} ({what}) was expired from the table's history (or removed by a "
        f"rollback), so the changes from it to the current snapshot {current} cannot be computed. "
        f"Recover: {cmd}"))


def diagnose(source: "Table", table_name: str, keys: Sequence[str], done: Collection[str],
             recorded_uuid: str | None, config_path: str | None) -> LineProblem | None:
    """Why the line over ``keys`` (all partition keys, commit order) cannot continue, or None.

    ``done``: keys every asset of the line has applied; ``recorded_uuid``: the table uuid the active
    line's latest batch was computed from (None when unknown).
    """
    active = active_keys(keys)
    if not active:
        return None
    cmd = resync_command(table_name, config_path)
    uuid = table_uuid(source)
    if recorded_uuid and recorded_uuid != uuid:
        return LineProblem(Problem.RECREATED, table_name, snapshot_id_of(active[-1]), (
            f"{table_name} was dropped and recreated: its table uuid is now {uuid}, but the line was built on "
            f"table uuid {recorded_uuid} (snapshots {active[0]}..{active[-1]}); the sinks hold rows of the old "
            f"table. Recover: {cmd}"))
    if source.metadata.current_snapshot() is None:
        return None  # nothing to follow yet
    newest = active[-1]
    problem = checkpoint_problem(source, table_name, snapshot_id_of(newest), config_path,
                                 f"partition {newest}, {'applied' if newest in done else 'not yet applied'}")
    if problem is not None:
        return problem
    pending = next((k for k in active if k not in done), None)
    if pending is None or pending == active[0]:
        return None  # all applied, or the bootstrap (an export reads only its own snapshot)
    return pending_problem(source, table_name, pending, config_path)


def pending_problem(source: "Table", table_name: str, key: str, config_path: str | None) -> LineProblem | None:
    """Why the next batch, starting at ``key`` (not a bootstrap), cannot run: it needs its snapshot,
    and (merge-on-read diff) its parent's data."""
    cmd = resync_command(table_name, config_path)
    snapshot_id = snapshot_id_of(key)
    snapshot = source.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        return LineProblem(Problem.EXPIRED, table_name, snapshot_id, (
            f"{table_name}: snapshot {snapshot_id} (partition {key}, not yet applied) was expired from the table's "
            f"history before the sinks applied it; its changes are lost to CDC. Recover: {cmd}"))
    parent_id = snapshot.parent_snapshot_id
    if parent_id is None or source.metadata.snapshot_by_id(parent_id) is not None:
        return None  # metadata only: the usual tick never decodes a manifest here
    if changelog.plan_snapshot(source, snapshot_id).needs_diff:
        return LineProblem(Problem.EXPIRED, table_name, parent_id, (
            f"{table_name}: snapshot {parent_id}, the parent of the next batch {snapshot_id} (partition {key}), "
            f"was expired; the batch has delete files and needs the parent's rows to compute its changes. "
            f"Recover: {cmd}"))
    return None
