"""The per-table sensor: new snapshots become partitions, and runs are requested in order.

Each tick: (1) walk the table's current ancestry after the newest known
partition and add the new snapshot ids as partitions, in commit order; (2) ask
``plan_next_run`` for the first batch that is not done. Only one run per
table is ever in flight, a failed batch is retried up to ``max_retries`` and
then blocks the line until it is re-executed; other tables keep flowing. A run whose worker
died is failed over on the next tick (and retried); while an ``icecdc sync`` holds the table's
line lock the sensor requests nothing.
The partitions themselves are the cursor, so a daemon restart loses nothing.
"""

from dagster import (
    AssetKey, AssetObservation, DefaultSensorStatus, RunRequest, SensorEvaluationContext, SensorResult, SkipReason,
    sensor)
from dagster._core.definitions.data_version import DATA_VERSION_TAG

from icecdc_dagster import changelog
from icecdc_dagster.assets import naming
from icecdc_dagster.config import TableConfig
from icecdc_dagster.errors import SnapshotNotFoundError
from icecdc_dagster.pipeline.ordering import Blocked, KeyStatus, NextRun
from icecdc_dagster.sensors import line


def discover_new_keys(table, newest_known: str | None) -> list[str]:  # noqa: ANN001 - pyiceberg Table
    """Snapshot ids after the newest known key along the current ancestry (the bootstrap if none)."""
    current = table.current_snapshot()
    if current is None:
        return []
    if newest_known is None:
        return [str(current.snapshot_id)]
    return [str(sid) for sid in changelog.ancestry_ids(table, int(newest_known))]


def asset_keys(table: TableConfig) -> list[AssetKey]:
    return [naming.changelog_key(table), *(naming.sink_key(s) for s in table.sinks)]


def table_line(table: TableConfig) -> line.Line:
    return line.Line(line_id=table.table_name, partitions_def=naming.partitions_def(table),
                     asset_keys=tuple(asset_keys(table)), max_keys_per_run=table.max_snapshots_per_run,
                     max_retries=table.max_retries)


def key_statuses(instance, table: TableConfig, keys: list[str]) -> dict[str, KeyStatus]:  # noqa: ANN001
    """Per key, the combined status over the changelog asset and every sink asset."""
    return line.key_statuses(instance, table_line(table), keys)


def run_request(table: TableConfig, planned: NextRun) -> RunRequest:
    return line.run_request(table_line(table), planned)


def ancestry_window(instance, table_line_: line.Line, source_table) -> list[str] | None:  # noqa: ANN001
    """The snapshots that can still be pending, in commit order: the table's ancestry after the oldest
    of the line's assets' latest materialisations (metadata and indexed queries only, whatever the
    history). None when an asset has never been materialised or its latest key left the ancestry
    (rollback, expiry): the caller then walks the known partitions instead."""
    anchors = set()
    for asset_key in table_line_.asset_keys:
        records = instance.fetch_materializations(asset_key, limit=1).records
        if not records or records[0].partition_key is None:
            return None
        anchors.add(records[0].partition_key)
    windows = []
    for anchor in anchors:
        try:
            windows.append([str(sid) for sid in changelog.ancestry_ids(source_table, int(anchor))])
        except (SnapshotNotFoundError, ValueError):
            return None
    return max(windows, key=len)


def evaluate(instance, table: TableConfig, source_table) -> tuple[list[str], NextRun | Blocked | None]:  # noqa: ANN001
    """New keys to add and the next run to request, for this tick (shared by the CLI's sync)."""
    return evaluate_line(instance, table_line(table), source_table)


def evaluate_line(instance, table_line_: line.Line,  # noqa: ANN001 - DagsterInstance
                  source_table) -> tuple[list[str], NextRun | Blocked | None]:  # noqa: ANN001 - pyiceberg Table
    """:func:`evaluate` for a table's line: its cost follows the backlog, not the history."""
    window = ancestry_window(instance, table_line_, source_table)
    if window is None:
        new_keys = discover_new_keys(source_table, line.newest_key(instance, table_line_))
        return new_keys, line.plan(instance, table_line_, new_keys)
    known = instance.get_existing_dynamic_partitions(table_line_.partitions_def.name, window) if window else set()
    new_keys = [key for key in window if key not in known]
    return new_keys, line.plan(instance, table_line_, window=window)


def build_snapshot_sensor(table: TableConfig):  # noqa: ANN201 - SensorDefinition
    @sensor(
        name=naming.sensor_name(table),
        minimum_interval_seconds=max(1, int(table.polling_interval_s)),
        asset_selection=asset_keys(table),
        default_status=DefaultSensorStatus.RUNNING,
        required_resource_keys={"catalog"},
        description=f"Adds each new snapshot of {table.table_name} as a partition and syncs them in order.",
    )
    def _sensor(context: SensorEvaluationContext):  # noqa: ANN202
        from pyiceberg.exceptions import NoSuchTableError

        try:
            source = context.resources.catalog.load_table(table.table_name)
        except NoSuchTableError:  # an ingest entry with auto_create has not created it yet
            return SkipReason(f"table {table.table_name} does not exist yet")
        new_keys, planned = evaluate(context.instance, table, source)
        partitions = naming.partitions_def(table)
        add = [partitions.build_add_request(new_keys)] if new_keys else []
        # Record the source's new state on its observable asset (data version = snapshot id).
        events = [AssetObservation(asset_key=naming.source_key(table),
                                   tags={DATA_VERSION_TAG: new_keys[-1]},
                                   metadata={"current_snapshot_id": new_keys[-1], "new_snapshots": len(new_keys)})
                  ] if new_keys else []
        busy = line.held_elsewhere(context.instance, table_line(table)) if isinstance(planned, NextRun) else None
        if isinstance(planned, NextRun) and busy is None:
            return SensorResult(run_requests=[run_request(table, planned)], dynamic_partitions_requests=add,
                                asset_events=events)
        reason = busy or (planned.reason if isinstance(planned, Blocked) else "all snapshots are applied")
        return SensorResult(skip_reason=SkipReason(reason), dynamic_partitions_requests=add, asset_events=events)

    return _sensor
