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
DESCRIPTION = ("Fails when a snapshot of {table} failed to apply, or has waited more than {limit} to be applied "
               "({intervals} polling intervals of {interval}). Judged as the line stands after the batch that runs it.")


def description(table: TableConfig) -> str:
    limit = STUCK_AFTER_INTERVALS * table.polling_interval_s
    return DESCRIPTION.format(table=table.table_name, limit=_duration(limit), intervals=STUCK_AFTER_INTERVALS,
                              interval=_duration(table.polling_interval_s))


def _duration(seconds: float) -> str:
    """50 seconds, 5 minutes, 2 hours: what a person reads, not an ISO 8601 duration."""
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}" + ("s" if n != 1 else "")
    return f"{seconds:g} second" + ("s" if seconds != 1 else "")


def after_batch(waiting: list[str], batch: "tuple[str | None, str | None]") -> list[str]:
    """The keys still waiting once the run's own batch (its first .. last key) is applied: the check runs
    inside that batch, whose keys are pending until its run ends, and judges the line as the batch leaves it."""
    first, last = batch
    if first is None or first not in waiting:
        return waiting
    end = waiting.index(last) if last in waiting else waiting.index(first)
    return waiting[:waiting.index(first)] + waiting[end + 1:]


def no_stuck_snapshots(instance: "DagsterInstance", table: TableConfig, source: "Table | None",
                       retrying: str | None = None, through: str | None = None) -> AssetCheckResult:
    """``no_stuck_snapshots`` of ``table``. ``retrying``..``through``: the first and last snapshot of the
    run executing the check (its failures are being retried, its snapshots applied by this very run). The
    line is judged as that batch leaves it: its snapshots are neither pending nor stuck (else a sync catching
    up after a pause would report as stuck the snapshots it is applying, and every batch would count itself
    as pending). ``source`` None: the table does not exist (WARN: nothing can be pending on it)."""
    if source is None:
        return AssetCheckResult(asset_key=naming.changelog_key(table), check_name=naming.STUCK_CHECK,
                                passed=False, severity=AssetCheckSeverity.WARN,
                                metadata={"problem": f"table {table.table_name} does not exist"})
    # Only what is still pending is read (the line's frontier), never the whole history; superseded
    # partitions (before the latest resync) never run again: only the active line counts.
    line = naming.table_line(table)
    before = lifecycle.active_keys(lines.pending_keys(instance, line))
    waiting = after_batch(before, (retrying, through or retrying))
    limit_s = STUCK_AFTER_INTERVALS * table.polling_interval_s
    now_ms = time.time() * 1000
    failed = [k for k in before[:1] if k != retrying and lines.failures_of(instance, line, k)]

    def committed_ms(key: str) -> float:  # an expired snapshot: stuck (line_follows_table says why)
        snapshot = source.metadata.snapshot_by_id(lifecycle.snapshot_id_of(key))
        return snapshot.timestamp_ms if snapshot is not None else 0

    stuck = [k for k in waiting if (now_ms - committed_ms(k)) / 1000 > limit_s]
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
