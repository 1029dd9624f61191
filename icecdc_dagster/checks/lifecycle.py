"""The line can continue from the table: no rollback, no expired snapshot it needs, same table.

Fails (ERROR) with the diagnosis of ``pipeline.lifecycle`` (what happened + the ``icecdc resync``
command that recovers) instead of letting the sensor, status and runs raise on every tick.
"""

from typing import Any

from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetChecksDefinition, AssetCheckSeverity, asset_check

from icecdc_dagster.assets import naming
from icecdc_dagster.checks.run import run_id_of
from icecdc_dagster.config import TableConfig
from icecdc_dagster.pipeline import lifecycle
from icecdc_dagster.sensors.snapshots import ancestry_window, diagnose, table_line


def build_lifecycle_check(table: TableConfig, config_path: str | None) -> AssetChecksDefinition:
    @asset_check(
        asset=naming.changelog_key(table),
        name=naming.LINE_CHECK,
        description=(f"Fails when {table.table_name} was rolled back, a snapshot the line needs was expired, or the "
                     f"table was recreated; the result names the icecdc resync command that recovers."),
        required_resource_keys={"catalog"},
        blocking=False,
    )
    def _check(context: AssetCheckExecutionContext) -> AssetCheckResult:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            source = context.resources.catalog.source_table(run_id_of(context), table.table_name)
        except NoSuchTableError:
            return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN,
                                    metadata={"problem": f"table {table.table_name} does not exist (dropped, or "
                                                         f"not created yet)"})
        uuid = lifecycle.table_uuid(source)
        metadata: dict[str, Any] = {"table_uuid": uuid}
        window = ancestry_window(context.instance, table_line(table), source)
        if window is not None:
            # The line follows the table (what the sensor checks at every tick): its latest batches are
            # in the table's ancestry, no resync is pending. Metadata and indexed queries only, whatever
            # the history; the whole line is read and diagnosed only when this cannot tell. The next
            # batch (the window's first snapshot) may still need an expired parent.
            problem = (lifecycle.pending_problem(source, table.table_name, window[0], config_path)
                       if window else None)
        else:
            known = list(context.instance.get_dynamic_partitions(naming.partitions_name(table)))
            problem = diagnose(context.instance, table, source, known, config_path)
            metadata |= {"line": lifecycle.line_token(known) or "original",
                         "superseded_partitions": len(known) - len(lifecycle.active_keys(known))}
        if problem is None:
            return AssetCheckResult(passed=True, metadata={**metadata, "problem": "none"})
        return AssetCheckResult(passed=False, severity=AssetCheckSeverity.ERROR,
                                metadata={**metadata, "problem": problem.kind.value, "message": problem.message,
                                          "recover": lifecycle.recovery_command(config_path, table.table_name)})

    return _check
