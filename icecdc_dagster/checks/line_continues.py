"""The line can continue from the table: no rollback, no expired snapshot it needs, same table.

Fails (ERROR) with the diagnosis of ``steps.lifecycle`` (what happened + the ``icecdc resync``
command that recovers) instead of letting the sensor, status and runs raise on every tick.
"""

from typing import Any

from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetChecksDefinition, AssetCheckSeverity, asset_check

from icecdc_dagster.assets import naming
from icecdc_dagster.checks.check_run import run_id_of
from icecdc_dagster.config import TableConfig
from icecdc_dagster.lines.window import TableWindow, diagnose, line_view
from icecdc_dagster.steps import lifecycle


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
        table_line = naming.table_line(table)
        view = line_view(context.instance, table_line, source)
        if isinstance(view, TableWindow):
            # The line follows the table (what the sensor checks at every tick): its latest batches are
            # in the table's ancestry, no resync is pending. The next batch (the window's first snapshot)
            # may still need an expired parent.
            problem = (lifecycle.pending_problem(source, table.table_name, view.keys[0], config_path)
                       if view.keys else None)
        else:
            problem = diagnose(context.instance, table_line, source, view.known, config_path)
            metadata |= {"line": view.token or "original", "superseded_partitions": view.superseded}
        if problem is None:
            return AssetCheckResult(passed=True, metadata={**metadata, "problem": "none"})
        return AssetCheckResult(passed=False, severity=AssetCheckSeverity.ERROR,
                                metadata={**metadata, "problem": problem.kind.value, "message": problem.message,
                                          "recover": lifecycle.recovery_command(config_path, table.table_name)})

    return _check
