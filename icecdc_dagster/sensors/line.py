"""A line: an ordered sequence of partition keys (snapshots of a table, files of a landing folder)
materialised strictly in order, one run at a time. The Dagster side of ``pipeline.ordering``.

Run state lives in the instance (partitions, run records, materialisations), never in a sensor
cursor, so a daemon restart or a manual re-execution is seen on the next tick.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from dagster import AssetKey, DagsterRunStatus, DynamicPartitionsDefinition, RunRequest, RunsFilter
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from icecdc_dagster.assets import naming
from icecdc_dagster.pipeline.ordering import Blocked, KeyStatus, NextRun, combine_status, plan_next_run

_STATUS = {"MATERIALIZED": KeyStatus.DONE, "FAILED": KeyStatus.FAILED, "IN_PROGRESS": KeyStatus.IN_PROGRESS}
_ACTIVE_RUN_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                        DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


@dataclass(frozen=True)
class Line:
    line_id: str                      # the value of the icecdc/table run tag
    partitions_def: DynamicPartitionsDefinition
    asset_keys: tuple[AssetKey, ...]  # every asset a run of the line materialises
    max_keys_per_run: int
    max_retries: int


def key_statuses(instance, line: Line, keys: Sequence[str]) -> dict[str, KeyStatus]:  # noqa: ANN001
    """Per key, the combined status over every asset of the line."""
    if not keys:
        return {}
    per_asset = []
    for asset_key in line.asset_keys:
        statuses = instance.get_status_by_partition(asset_key, list(keys), line.partitions_def) or {}
        per_asset.append({k: _STATUS.get(getattr(v, "name", ""), None) for k, v in statuses.items()})
    return {key: combine_status([statuses.get(key) for statuses in per_asset]) for key in keys}


def failure_counts(instance, line: Line) -> dict[str, int]:  # noqa: ANN001
    """Failed runs per first key of the line."""
    records = instance.get_run_records(
        RunsFilter(tags={naming.TABLE_TAG: line.line_id}, statuses=[DagsterRunStatus.FAILURE]), limit=500)
    counts: dict[str, int] = {}
    for record in records:
        key = record.dagster_run.tags.get(naming.FIRST_SNAPSHOT_TAG)
        if key:
            counts[key] = counts.get(key, 0) + 1
    return counts


def has_active_run(instance, line: Line) -> bool:  # noqa: ANN001
    return bool(instance.get_run_records(
        RunsFilter(tags={naming.TABLE_TAG: line.line_id}, statuses=_ACTIVE_RUN_STATUSES), limit=1))


def plan(instance, line: Line, keys: Sequence[str]) -> NextRun | Blocked | None:  # noqa: ANN001
    """The next run of the line over ``keys`` (every key, in order, including ones just discovered)."""
    if has_active_run(instance, line):
        return Blocked(keys[0] if keys else "", f"a run of {line.line_id} is in progress")
    known = list(instance.get_dynamic_partitions(line.partitions_def.name))
    return plan_next_run(list(keys), key_statuses(instance, line, known), failure_counts(instance, line),
                         max_keys_per_run=line.max_keys_per_run, max_retries=line.max_retries)


def run_request(line: Line, planned: NextRun) -> RunRequest:
    tags = {naming.TABLE_TAG: line.line_id, naming.FIRST_SNAPSHOT_TAG: planned.first_key,
            naming.LAST_SNAPSHOT_TAG: planned.last_key}
    selection = list(line.asset_keys)
    if planned.first_key == planned.last_key:
        return RunRequest(run_key=planned.run_key, partition_key=planned.first_key, asset_selection=selection,
                          tags=tags)
    tags |= {ASSET_PARTITION_RANGE_START_TAG: planned.first_key, ASSET_PARTITION_RANGE_END_TAG: planned.last_key}
    return RunRequest(run_key=planned.run_key, asset_selection=selection, tags=tags)
