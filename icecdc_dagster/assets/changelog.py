"""``changelog/<ns>/<table>``: the change rows of each snapshot, persisted for every sink and analyst.

Partition key = snapshot id. A run may cover a range of consecutive keys
(catch-up): then the batch holds the net changes of the range.
"""

import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetRecordsFilter,
    AssetsDefinition,
    AssetSpec,
    BackfillPolicy,
    DataVersion,
    MaterializeResult,
    multi_asset,
)
from pyiceberg.exceptions import NoSuchTableError

from icecdc_dagster import changelog
from icecdc_dagster.assets import line_record, naming
from icecdc_dagster.assets.lineage import lineage_run
from icecdc_dagster.assets.metadata_cache import described_table
from icecdc_dagster.assets.table_metadata import (
    CHANGELOG_DOCS,
    PARTITION_ROW_COUNT,
    changelog_fallback,
    lineage_metadata,
)
from icecdc_dagster.changelog.ordinals import OrdinalAnchor, uses_ordinals
from icecdc_dagster.checks.line_checks import line_check_specs, line_checks
from icecdc_dagster.config import TableConfig
from icecdc_dagster.lease import retry
from icecdc_dagster.lineage import LineageDataset, LineageEmitter, iceberg_dataset
from icecdc_dagster.lines.batch_metadata import ANCESTRY, BatchMetadata, ChangelogMetadata
from icecdc_dagster.lines.line import TAIL_PAGE
from icecdc_dagster.resources import IcebergCatalogResource, SparkResource
from icecdc_dagster.steps import lifecycle
from icecdc_dagster.steps.batches import BatchRequest, compute_batch, identifier_columns_of, keys_to_request, row_stats
from icecdc_dagster.steps.changelog_store import ChangelogStore

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from pyiceberg.table import Table


def batch_request(context: AssetExecutionContext, table: TableConfig, source: "Table") -> BatchRequest:
    key_range = context.partition_key_range
    known = line_keys(context.instance, table, key_range.start)
    if known is None:  # no batch yet, or keys not found: every key of the table, once
        known = list(context.instance.get_dynamic_partitions(naming.partitions_name(table)))
    keys = known[known.index(key_range.start):known.index(key_range.end) + 1] \
        if key_range.start in known and key_range.end in known else list(context.partition_keys)
    request = keys_to_request(table.table_name, keys, known, table.disable_export,
                              identifier_columns_of(table.identifier_columns, source))
    return replace(request, anchor=ordinal_anchor(context.instance, table, request.line))


def ordinal_anchor(instance: "DagsterInstance", table: TableConfig, line: str | None) -> OrdinalAnchor | None:
    """Where a line that counts ordinals (format v1, ``changelog.ordinals``) counts from: the last snapshot
    and sequence number its latest changelog batch recorded. The instance keeps it with the line's
    partitions, and it moves with every batch, so expiring older snapshots never changes a number.

    None: a v2+ line (real sequence numbers), or no batch of this line yet (its snapshots' depth).
    """
    recorded = BatchMetadata.latest(instance, naming.changelog_key(table))
    position = recorded.ordinal_position
    if position is None or recorded.line != line:
        return None
    return OrdinalAnchor(*position)


def line_keys(instance: "DagsterInstance", table: TableConfig, first_key: str) -> list[str] | None:
    """The table's keys that decide a run starting at ``first_key``, in order, without reading the
    history: the active line's first key, then every key from the older of ``first_key`` and the
    latest changelog batch on (the backlog). None when there is no batch yet or the keys are not found.

    Resync keys are always added as the newest key, so the latest resync is either among the keys
    read (newest first, down to those two) or the line the latest changelog batch recorded; the
    original line starts at the first key. The run's keys are refused as superseded exactly as
    when every key is read (``keys_to_request``).
    """
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=naming.changelog_key(table)),
                                              limit=1).records
    if not records or records[0].partition_key is None:
        return None
    line = BatchMetadata.read(records[0].asset_materialization).line
    name = naming.partitions_name(table)
    wanted = {first_key, records[0].partition_key}
    tail: list[str] = []
    cursor: str | None = None
    while wanted:
        page = instance.get_paginated_dynamic_partitions(name, limit=TAIL_PAGE, ascending=False, cursor=cursor)
        for key in page.results:
            tail.append(key)
            wanted.discard(key)
        if wanted and (not page.has_more or not page.results):
            return None
        cursor = page.cursor
    tail.reverse()
    if any(lifecycle.is_resync_key(key) for key in tail):
        return tail
    if line is not None:
        start = line if instance.get_existing_dynamic_partitions(name, [line]) else None
    else:
        first = instance.get_paginated_dynamic_partitions(name, limit=1, ascending=True).results
        start = first[0] if first else None
    if start is None:
        return None
    return tail if tail[0] == start else [start, *tail]


def build_changelog_asset(table: TableConfig, lineage: LineageEmitter | None = None,
                          described: Mapping[str, Any] | None = None,
                          config_path: str | None = None) -> AssetsDefinition:
    """``described``: the store table's metadata known at load (from the last batch that wrote it);
    ``config_path``: the pipeline file, named in the line checks' recovery commands. The step also evaluates
    the line checks (:mod:`checks.line_checks`: why there)."""
    key = naming.changelog_key(table)
    spec = AssetSpec(
        key,
        deps=[naming.source_key(table)],
        group_name=naming.group_name(table),
        kinds={"iceberg", "spark"},
        description=(f"Row-level changes of {table.table_name}, one partition per snapshot, stored in "
                     f"{table.table_name}__changelog (export of the bootstrap snapshot first)."),
        metadata={"source_table": table.table_name,
                  "identifier_columns": ", ".join(table.identifier_columns) or "(the table's identifier fields)",
                  **(described or {})},
    )

    @multi_asset(specs=[spec], name=key.to_python_identifier(), partitions_def=naming.partitions_def(table),
                 backfill_policy=BackfillPolicy.single_run(), check_specs=line_check_specs(table), can_subset=True)
    def _changelog(context: AssetExecutionContext, icecdc_spark: SparkResource,
                   icecdc_catalog: IcebergCatalogResource) -> Iterator[MaterializeResult[Any] | AssetCheckResult]:
        if key in context.selected_asset_keys:  # parameter = resource key
            with retry.classified(context.instance, context.run_id):
                result = _store_batch(context, table, lineage, icecdc_spark, icecdc_catalog)
            yield result  # stored before the checks below run: they judge the line as this batch leaves it
        yield from line_checks(context, table, icecdc_catalog, config_path)

    return _changelog


def _store_batch(context: AssetExecutionContext, table: TableConfig, lineage: LineageEmitter | None,
                 spark: SparkResource, catalog: IcebergCatalogResource) -> MaterializeResult[Any]:
    """Compute the run's batch and store its change rows; the line records the keys it is built on."""
    started = time.monotonic()
    session = spark.session(catalog)
    source = catalog.source_table(context.run_id, table.table_name)
    request = batch_request(context, table, source)
    line_record.remember_identifier_columns(f"{catalog.name}.{table.table_name}", request.identifier_columns)
    store = ChangelogStore(session, catalog.name, table.table_name)
    with lineage_run(lineage, context, naming.changelog_key(table), table.table_name,
                     inputs=lambda: [iceberg_dataset(catalog.name, source)],
                     outputs=lambda: _existing(catalog, store.table_name)) as outcome:
        with changelog.staged_scans(session), changelog.deferred_key_checks():  # checked by the store's write
            computed = compute_batch(session, catalog.name, source, request)
            stored = store.write(computed.info, computed.rows, source.schema())
            stats = row_stats(computed, stored.counts)  # may read the changed files: inside the block
        if lineage is not None:
            written = iceberg_dataset(catalog.name, catalog.load_table(stored.table_name))
            outcome.outputs = [written]
            outcome.rows[written.name] = stored.rows
            outcome.column_lineage[written.name] = {c: [c] for c in changelog.data_columns(source)}
    parent = changelog.parent_of(source, computed.info.first_snapshot_id)
    context.log.info(f"{table.table_name}: stored {stored.rows} change rows of snapshots "
                     f"{computed.info.first_snapshot_id}..{computed.info.snapshot_id} ({computed.kind})")
    columns = changelog.data_columns(source)
    described = {**described_table(catalog.name, catalog.load_table(stored.table_name), docs=CHANGELOG_DOCS,
                                  fallback=changelog_fallback(table.table_name)),
                 **lineage_metadata(naming.source_key(table), {c: [c] for c in columns}),
                 PARTITION_ROW_COUNT: stored.rows}
    recorded = ChangelogMetadata.of_batch(
        computed.info, parent, started, stored.counts, batch_kind=computed.kind, changelog_table=stored.table_name,
        changelog_snapshot_id=str(stored.snapshot_id), line=request.line,
        source_table_uuid=lifecycle.table_uuid(source),
        ordered_by=ANCESTRY if uses_ordinals(source, request.anchor) else None)
    return MaterializeResult(asset_key=naming.changelog_key(table),
                             metadata={**recorded.with_figures(stats), **described},
                             data_version=DataVersion(str(computed.info.snapshot_id)))


def _existing(catalog: IcebergCatalogResource, table_name: str) -> list[LineageDataset]:
    """The dataset of a table the step writes, when it exists already (the first batch creates it)."""
    try:
        return [iceberg_dataset(catalog.name, catalog.load_table(table_name))]
    except NoSuchTableError:
        return []
