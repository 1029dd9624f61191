"""No snapshot of the table waits (or failed) longer than N polling intervals."""

import time

from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetChecksDefinition, AssetCheckSeverity, asset_check

from icecdc_dagster import run_tags
from icecdc_dagster.assets import naming
from icecdc_dagster.checks.check_run import run_id_of
from icecdc_dagster.config import TableConfig
from icecdc_dagster.lines import line as lines
from icecdc_dagster.steps import lifecycle

STUCK_AFTER_INTERVALS = 10


def build_stuck_check(table: TableConfig) -> AssetChecksDefinition:
    @asset_check(
        asset=naming.changelog_key(table),
        name=naming.STUCK_CHECK,
        description=(f"Fails when a snapshot of {table.table_name} failed, or waits longer than "
                     f"{STUCK_AFTER_INTERVALS} polling intervals ({table.polling_interval})."),
        required_resource_keys={"catalog"},
        blocking=False,
    )
    def _check(context: AssetCheckExecutionContext) -> AssetCheckResult:
        source = context.resources.catalog.source_table(run_id_of(context), table.table_name)
        # Only what is still pending is read (the line's frontier), never the whole history; superseded
        # partitions (before the latest resync) never run again: only the active line counts.
        line = naming.table_line(table)
        waiting = lifecycle.active_keys(lines.pending_keys(context.instance, line))
        limit_s = STUCK_AFTER_INTERVALS * table.polling_interval_s
        now_ms = time.time() * 1000
        # The first pending key failed unless this very run is its retry.
        retrying = context.run.tags.get(run_tags.FIRST_SNAPSHOT_TAG)
        failed = [k for k in waiting[:1] if k != retrying and lines.failures_of(context.instance, line, k)]

        def committed_ms(key: str) -> float:  # an expired snapshot: stuck (line_follows_table says why)
            snapshot = source.metadata.snapshot_by_id(lifecycle.snapshot_id_of(key))
            return snapshot.timestamp_ms if snapshot is not None else 0

        stuck = [k for k in waiting if (now_ms - committed_ms(k)) / 1000 > limit_s]
        unseen = []
        current = source.current_snapshot()
        if current is not None and not context.instance.get_existing_dynamic_partitions(
                line.partitions_name, [str(current.snapshot_id)]):
            unseen = [str(current.snapshot_id)]
        passed = not failed and not stuck
        return AssetCheckResult(
            passed=passed,
            severity=AssetCheckSeverity.ERROR,
            metadata={"failed_snapshots": ", ".join(failed) or "none",
                      "stuck_snapshots": ", ".join(stuck) or "none",
                      "pending_snapshots": len(waiting),
                      "current_snapshot_not_yet_partition": ", ".join(unseen) or "none",
                      "stuck_after_s": limit_s})

    return _check
