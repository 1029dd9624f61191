"""The pipeline's definitions in a layout the product does not ship, for ``bench/freshness.py`` to measure
against the shipped one in the same run (``dagster dev -f bench/variant_defs.py``).

``ICECDC_BENCH_SENSORS=one``: one sensor evaluates every table's snapshot sensor in turn (one tick, one
cursor per table inside a JSON map), instead of one sensor per table.
``ICECDC_BENCH_LINE_CHECKS=two``: ``line_follows_table`` and ``no_stuck_snapshots`` as two steps (the layout
before they became one), instead of one.
"""

import json
import os

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    DefaultSensorStatus,
    Definitions,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset_check,
    build_sensor_context,
    definitions,
    sensor,
)

from icecdc_dagster import run_tags
from icecdc_dagster.assets import naming
from icecdc_dagster.checks import line_continues, stuck
from icecdc_dagster.checks.check_run import run_id_of
from icecdc_dagster.config import TableConfig, load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.lines import line

SENSORS_ENV, LINE_CHECKS_ENV = "ICECDC_BENCH_SENSORS", "ICECDC_BENCH_LINE_CHECKS"


def two_line_checks(table: TableConfig, config_path: str | None) -> list[AssetChecksDefinition]:
    def load(context: AssetCheckExecutionContext):  # noqa: ANN202 - a pyiceberg Table or None
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return context.resources.catalog.source_table(run_id_of(context), table.table_name)
        except NoSuchTableError:
            return None

    @asset_check(asset=naming.changelog_key(table), name=naming.LINE_CHECK, required_resource_keys={"catalog"},
                 blocking=False)
    def _line(context: AssetCheckExecutionContext) -> AssetCheckResult:
        return line_continues.line_continues(context.instance, table, load(context), config_path)

    @asset_check(asset=naming.changelog_key(table), name=naming.STUCK_CHECK, required_resource_keys={"catalog"},
                 blocking=False)
    def _stuck(context: AssetCheckExecutionContext) -> AssetCheckResult:
        return stuck.no_stuck_snapshots(context.instance, table, load(context),
                                        context.run.tags.get(run_tags.FIRST_SNAPSHOT_TAG))

    return [_line, _stuck]


def one_sensor(sensors: list[SensorDefinition], interval_s: float) -> SensorDefinition:
    """Every table's sensor evaluated in one tick; each keeps its own cursor (a JSON map by sensor name)."""
    selection = None
    for each in sensors:
        selection = each.asset_selection if selection is None else selection | each.asset_selection

    @sensor(name="snapshots__all_tables", minimum_interval_seconds=line.minimum_interval(interval_s),
            asset_selection=selection, default_status=DefaultSensorStatus.RUNNING)
    def _all(context: SensorEvaluationContext) -> SensorResult:
        line.share_instance(context)
        cursors = json.loads(context.cursor) if context.cursor else {}
        requests, partitions, events, skipped = [], [], [], []
        for each in sensors:
            result = each(build_sensor_context(instance=context.instance, cursor=cursors.get(each.name),
                                               sensor_name=each.name))
            if isinstance(result, SkipReason):
                skipped.append(f"{each.name}: {result.skip_message}")
                continue
            requests += result.run_requests or []
            partitions += result.dynamic_partitions_requests or []
            events += result.asset_events or []
            if result.cursor is not None:
                cursors[each.name] = result.cursor
            if result.skip_reason is not None:
                skipped.append(f"{each.name}: {result.skip_reason.skip_message}")
        skip = None if requests else SkipReason("; ".join(skipped)[:1000] or "nothing to do")
        return SensorResult(run_requests=requests, dynamic_partitions_requests=partitions, asset_events=events,
                            cursor=json.dumps(cursors), skip_reason=skip)

    return _all


@definitions
def defs() -> Definitions:
    config = load_config()
    shipped = build_definitions(config)
    checks = list(shipped.asset_checks or [])
    if os.environ.get(LINE_CHECKS_ENV) == "two":
        names = {naming.line_checks_name(table) for table in config.tables}
        checks = [c for c in checks if c.node_def.name not in names]
        for table in config.tables:
            checks += two_line_checks(table, config.source)
    sensors = list(shipped.sensors or [])
    if os.environ.get(SENSORS_ENV) == "one" and config.tables:
        names = {naming.sensor_name(table) for table in config.tables}
        tables = [s for s in sensors if s.name in names]
        sensors = [s for s in sensors if s.name not in names]
        sensors.append(one_sensor(tables, min(t.polling_interval_s for t in config.tables)))
    return Definitions(assets=shipped.assets, asset_checks=checks, sensors=sensors, schedules=shipped.schedules,
                       resources=shipped.resources, executor=shipped.executor)
