"""No snapshot of the table waits (or failed) longer than N polling intervals."""

import time
from typing import TYPE_CHECKING

from dagster import AssetCheckResult, AssetCheckSeverity

from icecdc_dagster.assets import naming
from icecdc_dagster.config import TableConfig
from icecdc_dagster.lines import line as lines
from icecdc_dagster.steps import lifecycle

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from pyiceberg.table import Table

STUCK_AFTER_INTERVALS = 10
DESCRIPTION = "Fails when a snapshot of {table} failed, or waits longer than {limit} polling intervals ({interval})."


def description(table: TableConfig) -> str:
    return DESCRIPTION.format(table=table.table_name, limit=STUCK_AFTER_INTERVALS, interval=table.polling_interval)


def no_stuck_snapshots(instance: "DagsterInstance", table: TableConfig, source: "Table | None",
                       retrying: str | None, through: str | None = None) -> AssetCheckResult:
    """``no_stuck_snapshots`` of ``table``. ``retrying``..``through``: the first and last snapshot of the
    run executing the check (its failures are being retried, its snapshots applied by this very run: not
    stuck; else a sync catching up after a pause would report as stuck the snapshots it is applying).
    ``source`` None: the table does not exist (WARN: nothing can be pending on it)."""
    if source is None:
        return AssetCheckResult(asset_key=naming.changelog_key(table), check_name=naming.STUCK_CHECK,
                                passed=False, severity=AssetCheckSeverity.WARN,
                                metadata={"problem": f"table {table.table_name} does not exist"})
    # Only what is still pending is read (the line's frontier), never the whole history; superseded
    # partitions (before the latest resync) never run again: only the active line counts.
    line = naming.table_line(table)
    waiting = lifecycle.active_keys(lines.pending_keys(instance, line))
    limit_s = STUCK_AFTER_INTERVALS * table.polling_interval_s
    now_ms = time.time() * 1000
    failed = [k for k in waiting[:1] if k != retrying and lines.failures_of(instance, line, k)]
    applying = _run_keys(waiting, retrying, through or retrying)

    def committed_ms(key: str) -> float:  # an expired snapshot: stuck (line_follows_table says why)
        snapshot = source.metadata.snapshot_by_id(lifecycle.snapshot_id_of(key))
        return snapshot.timestamp_ms if snapshot is not None else 0

    stuck = [k for k in waiting if k not in applying and (now_ms - committed_ms(k)) / 1000 > limit_s]
    unseen = []
    current = source.current_snapshot()
    if current is not None and not instance.get_existing_dynamic_partitions(
            line.partitions_name, [str(current.snapshot_id)]):
        unseen = [str(current.snapshot_id)]
    return AssetCheckResult(
        asset_key=naming.changelog_key(table), check_name=naming.STUCK_CHECK,
        passed=not failed and not stuck,
        severity=AssetCheckSeverity.ERROR,
        metadata={"failed_snapshots": ", ".join(failed) or "none",
                  "stuck_snapshots": ", ".join(stuck) or "none",
                  "pending_snapshots": len(waiting),
                  "current_snapshot_not_yet_partition": ", ".join(unseen) or "none",
                  "stuck_after_s": limit_s})


def _run_keys(waiting: list[str], first: str | None, last: str | None) -> set[str]:
    """The pending keys ``first``..``last`` (a run's batch) in line order; none when the run is not on them."""
    if first not in waiting:
        return set()
    start = waiting.index(first)
    end = waiting.index(last) if last in waiting else start
    return set(waiting[start:end + 1])
