"""``changelog/<ns>/<table>``: the change rows of each snapshot, persisted for every sink and analyst.

Partition key = snapshot id. A run may cover a range of consecutive keys
(catch-up): then the batch holds the net changes of the range.
"""

from typing import TYPE_CHECKING
import time

from dagster import AssetExecutionContext, AssetsDefinition, DataVersion, BackfillPolicy, MaterializeResult, asset

from icecdc_dagster import changelog
from icecdc_dagster.assets import naming
from icecdc_dagster.assets.lineage import lineage_run
from icecdc_dagster.assets.metadata import batch_metadata
from icecdc_dagster.assets.table_metadata import COLUMN_LINEAGE, PARTITION_ROW_COUNT, column_lineage, table_metadata
from icecdc_dagster.config import TableConfig
from icecdc_dagster.lineage import LineageDataset, LineageEmitter, iceberg_dataset
from icecdc_dagster.pipeline.batches import (BatchRequest, compute_batch, identifier_columns_of, keys_to_request,
                                             row_stats)
from icecdc_dagster.pipeline import lifecycle
from icecdc_dagster.pipeline.changelog_store import ChangelogStore
from icecdc_dagster.resources import IcebergCatalogResource, SparkResource

if TYPE_CHECKING:
    from pyiceberg.table import Table


def batch_request(context: AssetExecutionContext, table: TableConfig, source: "Table") -> BatchRequest:
    # Every key of the table (the active line starts at the latest resync bootstrap): one query per run.
    all_keys = context.instance.get_dynamic_partitions(naming.partitions_name(table))
    return keys_to_request(table.table_name, context.partition_keys, all_keys, table.disable_export,
                           identifier_columns_of(table.identifier_columns, source))


def build_changelog_asset(table: TableConfig, lineage: LineageEmitter | None = None) -> AssetsDefinition:
    @asset(
        key=naming.changelog_key(table),
        deps=[naming.source_key(table)],
        partitions_def=naming.partitions_def(table),
        backfill_policy=BackfillPolicy.single_run(),
        group_name=naming.group_name(table),
        kinds={"iceberg", "spark"},
        description=(f"Row-level changes of {table.table_name}, one partition per snapshot, stored in "
                     f"{table.table_name}__changelog (export of the bootstrap snapshot first)."),
        metadata={"source_table": table.table_name,
                  "identifier_columns": ", ".join(table.identifier_columns) or "(the table's identifier fields)"},
    )
    def _changelog(context: AssetExecutionContext, spark: SparkResource,
                   catalog: IcebergCatalogResource) -> MaterializeResult:
        started = time.monotonic()
        session = spark.session(catalog)
        source = catalog.load_table(table.table_name)
        request = batch_request(context, table, source)
        store = ChangelogStore(session, catalog.name, table.table_name)
        with lineage_run(lineage, context, naming.changelog_key(table), table.table_name,
                         inputs=lambda: [iceberg_dataset(catalog.name, source)],
                         outputs=lambda: _existing(catalog, store.table_name)) as outcome:
            with changelog.staged_scans(session):
                computed = compute_batch(session, catalog.name, source, request)
                stored = store.write(computed.info, computed.rows)
                stats = row_stats(computed, stored.counts)  # may read the changed files: inside the block
            if lineage is not None:
                written = iceberg_dataset(catalog.name, catalog.load_table(stored.table_name))
                outcome.outputs = [written]
                outcome.rows[written.name] = stored.rows
                outcome.column_lineage[written.name] = {c: [c] for c in changelog.data_columns(source)}
        parent = changelog.plan_snapshot(source, computed.info.first_snapshot_id).parent_id
        line_meta = {naming.SOURCE_UUID_METADATA: lifecycle.table_uuid(source)}
        if request.line is not None:
            line_meta["line"] = request.line
        context.log.info(f"{table.table_name}: stored {stored.rows} change rows of snapshots "
                         f"{computed.info.first_snapshot_id}..{computed.info.snapshot_id} ({computed.kind})")
        columns = changelog.data_columns(source)
        described = {**table_metadata(catalog.name, catalog.load_table(stored.table_name)),
                     COLUMN_LINEAGE: column_lineage(naming.source_key(table), {c: [c] for c in columns}),
                     PARTITION_ROW_COUNT: stored.rows}
        metadata = batch_metadata(
            computed.info, parent, started, stored.counts,
            {"batch_kind": computed.kind, "changelog_table": stored.table_name,
             "changelog_snapshot_id": str(stored.snapshot_id), **line_meta, **stats})
        return MaterializeResult(metadata={**metadata, **described},
                                 data_version=DataVersion(str(computed.info.snapshot_id)))

    return _changelog


def _existing(catalog: IcebergCatalogResource, table_name: str) -> list[LineageDataset]:
    """The dataset of a table the step writes, when it exists already (the first batch creates it)."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return [iceberg_dataset(catalog.name, catalog.load_table(table_name))]
    except NoSuchTableError:
        return []
