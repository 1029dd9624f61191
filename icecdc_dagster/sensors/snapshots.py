"""The per-table sensor: new snapshots become partitions, and runs are requested in order.

Each tick: (1) walk the table's current ancestry after the newest known
partition and add the new snapshot ids as partitions, in commit order; (2) ask
``plan_next_run`` for the first batch that is not done. Only one run per
table is ever in flight, a failed batch is retried up to ``max_retries`` and
then blocks the line until it is re-executed; other tables keep flowing.
The partitions themselves are the cursor, so a daemon restart loses nothing.
"""

from dagster import (
    AssetKey, AssetObservation, DagsterRunStatus, DefaultSensorStatus, RunRequest, RunsFilter, SensorEvaluationContext,
    SensorResult, SkipReason, sensor)
from dagster._core.definitions.data_version import DATA_VERSION_TAG
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from icecdc_dagster import changelog
from icecdc_dagster.assets import naming
from icecdc_dagster.config import TableConfig
from icecdc_dagster.pipeline.ordering import Blocked, KeyStatus, NextRun, combine_status, plan_next_run

_STATUS = {"MATERIALIZED": KeyStatus.DONE, "FAILED": KeyStatus.FAILED, "IN_PROGRESS": KeyStatus.IN_PROGRESS}
_ACTIVE_RUN_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                        DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def discover_new_keys(table, known_keys: list[str]) -> list[str]:  # noqa: ANN001 - pyiceberg Table
    """Snapshot ids after the newest known key along the current ancestry (the bootstrap if none)."""
    current = table.current_snapshot()
    if current is None:
        return []
    if not known_keys:
        return [str(current.snapshot_id)]
    plans = changelog.snapshots_after(table, int(known_keys[-1]))
    return [str(plan.snapshot_id) for plan in plans]


def key_statuses(instance, table: TableConfig, keys: list[str]) -> dict[str, KeyStatus]:  # noqa: ANN001
    """Per key, the combined status over the changelog asset and every sink asset."""
    if not keys:
        return {}
    partitions = naming.partitions_def(table)
    per_asset = []
    for asset_key in asset_keys(table):
        statuses = instance.get_status_by_partition(asset_key, keys, partitions) or {}
        per_asset.append({k: _STATUS.get(getattr(v, "name", ""), None) for k, v in statuses.items()})
    return {key: combine_status([statuses.get(key) for statuses in per_asset]) for key in keys}


def failure_counts(instance, table: TableConfig) -> dict[str, int]:  # noqa: ANN001
    """Failed runs per first snapshot key of this table's line."""
    records = instance.get_run_records(
        RunsFilter(tags={naming.TABLE_TAG: table.table_name}, statuses=[DagsterRunStatus.FAILURE]), limit=500)
    counts: dict[str, int] = {}
    for record in records:
        key = record.dagster_run.tags.get(naming.FIRST_SNAPSHOT_TAG)
        if key:
            counts[key] = counts.get(key, 0) + 1
    return counts


def has_active_run(instance, table: TableConfig) -> bool:  # noqa: ANN001
    return bool(instance.get_run_records(
        RunsFilter(tags={naming.TABLE_TAG: table.table_name}, statuses=_ACTIVE_RUN_STATUSES), limit=1))


def asset_keys(table: TableConfig) -> list[AssetKey]:
    return [naming.changelog_key(table), *(naming.sink_key(s) for s in table.sinks)]


def run_request(table: TableConfig, planned: NextRun) -> RunRequest:
    tags = {naming.TABLE_TAG: table.table_name, naming.FIRST_SNAPSHOT_TAG: planned.first_key,
            naming.LAST_SNAPSHOT_TAG: planned.last_key}
    if planned.first_key == planned.last_key:
        return RunRequest(run_key=planned.run_key, partition_key=planned.first_key,
                          asset_selection=asset_keys(table), tags=tags)
    tags |= {ASSET_PARTITION_RANGE_START_TAG: planned.first_key, ASSET_PARTITION_RANGE_END_TAG: planned.last_key}
    return RunRequest(run_key=planned.run_key, asset_selection=asset_keys(table), tags=tags)


def evaluate(instance, table: TableConfig, source_table) -> tuple[list[str], NextRun | Blocked | None]:  # noqa: ANN001
    """New keys to add and the next run to request, for this tick (shared by the CLI's sync)."""
    known = list(instance.get_dynamic_partitions(naming.partitions_name(table)))
    new_keys = discover_new_keys(source_table, known)
    keys = known + new_keys
    if has_active_run(instance, table):
        return new_keys, Blocked(keys[0] if keys else "", "a run of this table is in progress")
    statuses = key_statuses(instance, table, known)
    planned = plan_next_run(keys, statuses, failure_counts(instance, table),
                            max_keys_per_run=table.max_snapshots_per_run, max_retries=table.max_retries)
    return new_keys, planned


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
        source = context.resources.catalog.load_table(table.table_name)
        new_keys, planned = evaluate(context.instance, table, source)
        partitions = naming.partitions_def(table)
        add = [partitions.build_add_request(new_keys)] if new_keys else []
        # Record the source's new state on its observable asset (data version = snapshot id).
        events = [AssetObservation(asset_key=naming.source_key(table),
                                   tags={DATA_VERSION_TAG: new_keys[-1]},
                                   metadata={"current_snapshot_id": new_keys[-1], "new_snapshots": len(new_keys)})
                  ] if new_keys else []
        if isinstance(planned, NextRun):
            return SensorResult(run_requests=[run_request(table, planned)], dynamic_partitions_requests=add,
                                asset_events=events)
        reason = planned.reason if isinstance(planned, Blocked) else "all snapshots are applied"
        return SensorResult(skip_reason=SkipReason(reason), dynamic_partitions_requests=add, asset_events=events)

    return _sensor
