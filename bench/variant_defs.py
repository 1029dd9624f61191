"""The pipeline's definitions in a layout the product does not ship, for ``bench/freshness.py`` to measure
against the shipped one in the same run (``dagster dev -f bench/variant_defs.py``).

``ICECDC_BENCH_LINE_CHECKS=two``: ``line_follows_table`` and ``no_stuck_snapshots`` as two steps (the layout
before they became one), instead of one.
"""

import os

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    Definitions,
    asset_check,
    definitions,
)

from icecdc_dagster import run_tags
from icecdc_dagster.assets import naming
from icecdc_dagster.checks import line_continues, stuck
from icecdc_dagster.checks.line_checks import source_or_none
from icecdc_dagster.config import TableConfig, load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.lease.executor import line_executor
from icecdc_dagster.resources.keys import CATALOG_KEY

LINE_CHECKS_ENV = "ICECDC_BENCH_LINE_CHECKS"


def two_line_checks(table: TableConfig, config_path: str | None) -> list[AssetChecksDefinition]:
    @asset_check(asset=naming.changelog_key(table), name=naming.LINE_CHECK, required_resource_keys={CATALOG_KEY},
                 blocking=False)
    def _line(context: AssetCheckExecutionContext) -> AssetCheckResult:
        return line_continues.line_continues(context.instance, table, source_or_none(context, table), config_path)

    @asset_check(asset=naming.changelog_key(table), name=naming.STUCK_CHECK, required_resource_keys={CATALOG_KEY},
                 blocking=False)
    def _stuck(context: AssetCheckExecutionContext) -> AssetCheckResult:
        return stuck.no_stuck_snapshots(context.instance, table, source_or_none(context, table),
                                        context.run.tags.get(run_tags.FIRST_SNAPSHOT_TAG),
                                        context.run.tags.get(run_tags.LAST_SNAPSHOT_TAG))

    return [_line, _stuck]


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
    return Definitions(assets=shipped.assets, asset_checks=checks, sensors=shipped.sensors, schedules=shipped.schedules,
                       resources=shipped.resources, executor=line_executor)  # as definitions.defs()
