"""The two checks every batch run executes, in the changelog's own step: ``line_follows_table`` and
``no_stuck_snapshots``.

Why in the changelog's step: a step of their own was Dagster's per-step machinery again (its events and
instance writes) on every batch: bench/batch_profile.py's no-op run of our graph, 3 steps 0.34 CPU-s against 2
steps 0.29. They are evaluated after the batch's materialisation is stored, so they judge the line as the
batch leaves it (as their own step did, after the changelog's). Each check can still be executed alone
(the step is subsettable): then nothing is materialised.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING

from dagster import AssetCheckResult, AssetCheckSpec, AssetExecutionContext
from pyiceberg.exceptions import NoSuchTableError

from icecdc_dagster import run_tags
from icecdc_dagster.assets import naming
from icecdc_dagster.checks import line_continues, stuck
from icecdc_dagster.checks.check_run import run_id_of
from icecdc_dagster.config import TableConfig

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icecdc_dagster.resources import IcebergCatalogResource


def line_check_specs(table: TableConfig) -> list[AssetCheckSpec]:
    changelog = naming.changelog_key(table)
    return [AssetCheckSpec(naming.LINE_CHECK, asset=changelog, blocking=False,
                           description=line_continues.DESCRIPTION.format(table=table.table_name)),
            AssetCheckSpec(naming.STUCK_CHECK, asset=changelog, blocking=False, description=stuck.description(table))]


def source_or_none(context: AssetExecutionContext, table: TableConfig,
                   catalog: "IcebergCatalogResource") -> "Table | None":
    """The run's source table (None: it does not exist; both checks then WARN instead of failing the step)."""
    try:
        return catalog.source_table(run_id_of(context), table.table_name)
    except NoSuchTableError:
        return None


def line_checks(context: AssetExecutionContext, table: TableConfig, catalog: "IcebergCatalogResource",
                config_path: str | None) -> Iterator[AssetCheckResult]:
    """The results of the line checks the run selected (none selected: nothing is read)."""
    changelog = naming.changelog_key(table)
    selected = {key.name for key in context.selected_asset_check_keys if key.asset_key == changelog}
    if not selected & {naming.LINE_CHECK, naming.STUCK_CHECK}:
        return
    source = source_or_none(context, table, catalog)
    if naming.LINE_CHECK in selected:
        yield line_continues.line_continues(context.instance, table, source, config_path)
    if naming.STUCK_CHECK in selected:
        tags = context.run.tags if run_id_of(context) else {}
        yield stuck.no_stuck_snapshots(context.instance, table, source, tags.get(run_tags.FIRST_SNAPSHOT_TAG),
                                       tags.get(run_tags.LAST_SNAPSHOT_TAG))
