"""The two checks every batch run executes, as one step: ``line_follows_table`` and ``no_stuck_snapshots``.

One step loads the table once and is one node on the run page. Measured against two steps
(``bench/freshness.py --line-checks both``): no difference the machine's noise lets us see (0.26-0.28 s
against 0.11 + 0.12 s per run). Each check can still be selected alone (``can_subset``).
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSpec,
    multi_asset_check,
)
from pyiceberg.exceptions import NoSuchTableError

from icecdc_dagster import run_tags
from icecdc_dagster.assets import naming
from icecdc_dagster.checks import line_continues, stuck
from icecdc_dagster.checks.check_run import run_id_of
from icecdc_dagster.config import TableConfig
from icecdc_dagster.resources.keys import CATALOG_KEY

if TYPE_CHECKING:
    from pyiceberg.table import Table


def source_or_none(context: AssetCheckExecutionContext, table: TableConfig) -> "Table | None":
    """The run's source table (None: it does not exist; both checks then WARN instead of failing the step)."""
    try:
        return getattr(context.resources, CATALOG_KEY).source_table(run_id_of(context), table.table_name)
    except NoSuchTableError:
        return None


def build_line_checks(table: TableConfig, config_path: str | None) -> AssetChecksDefinition:
    changelog = naming.changelog_key(table)
    specs = [AssetCheckSpec(naming.LINE_CHECK, asset=changelog, blocking=False,
                            description=line_continues.DESCRIPTION.format(table=table.table_name)),
             AssetCheckSpec(naming.STUCK_CHECK, asset=changelog, blocking=False,
                            description=stuck.description(table))]

    @multi_asset_check(name=naming.line_checks_name(table), specs=specs, can_subset=True,
                       required_resource_keys={CATALOG_KEY})
    def _checks(context: AssetCheckExecutionContext) -> Iterator[AssetCheckResult]:
        source = source_or_none(context, table)
        selected = {key.name for key in context.selected_asset_check_keys}
        if naming.LINE_CHECK in selected:
            yield line_continues.line_continues(context.instance, table, source, config_path)
        if naming.STUCK_CHECK in selected:
            tags = context.run.tags if run_id_of(context) else {}
            yield stuck.no_stuck_snapshots(context.instance, table, source, tags.get(run_tags.FIRST_SNAPSHOT_TAG),
                                           tags.get(run_tags.LAST_SNAPSHOT_TAG))

    return _checks
