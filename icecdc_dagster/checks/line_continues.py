"""The line can continue from the table: no rollback, no expired snapshot it needs, same table.

Fails (ERROR) with the diagnosis of ``steps.lifecycle`` (what happened + the ``icecdc resync``
command that recovers) instead of letting the sensor, status and runs raise on every tick.
"""

from typing import TYPE_CHECKING, Any

from dagster import AssetCheckResult, AssetCheckSeverity

from icecdc_dagster.assets import naming
from icecdc_dagster.config import TableConfig
from icecdc_dagster.errors import resync_command
from icecdc_dagster.lines.window import TableWindow, diagnose, line_view
from icecdc_dagster.steps import lifecycle

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from pyiceberg.table import Table

DESCRIPTION = ("Fails when {table} was rolled back, a snapshot the line needs was expired, or the table was "
               "recreated; the result names the icecdc resync command that recovers.")


def line_continues(instance: "DagsterInstance", table: TableConfig, source: "Table | None",
                   config_path: str | None) -> AssetCheckResult:
    """``line_follows_table`` of ``table``; ``source`` None: the table does not exist (WARN)."""
    key = naming.changelog_key(table)
    if source is None:
        return AssetCheckResult(asset_key=key, check_name=naming.LINE_CHECK, passed=False,
                                severity=AssetCheckSeverity.WARN,
                                metadata={"problem": f"table {table.table_name} does not exist (dropped, or "
                                                     f"not created yet)"})
    metadata: dict[str, Any] = {"table_uuid": lifecycle.table_uuid(source)}
    table_line = naming.table_line(table)
    view = line_view(instance, table_line, source)
    if isinstance(view, TableWindow):
        # The line follows the table (what the sensor checks at every tick): its latest batches are
        # in the table's ancestry, no resync is pending. The next batch (the window's first snapshot)
        # may still need an expired parent.
        problem = (lifecycle.pending_problem(source, table.table_name, view.keys[0], config_path)
                   if view.keys else None)
    else:
        problem = diagnose(instance, table_line, source, view.known, config_path)
        metadata |= {"line": view.token or "original", "superseded_partitions": view.superseded}
    if problem is None:
        return AssetCheckResult(asset_key=key, check_name=naming.LINE_CHECK, passed=True,
                                metadata={**metadata, "problem": "none"})
    return AssetCheckResult(asset_key=key, check_name=naming.LINE_CHECK, passed=False,
                            severity=AssetCheckSeverity.ERROR,
                            metadata={**metadata, "problem": problem.kind.value, "message": problem.message,
                                      "recover": resync_command(table.table_name, config_path)})
