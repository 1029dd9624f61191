"""``opensearch/<index>`` and ``replica/<ns>/<table>``: apply each changelog batch to a target.

The sink, not Dagster, decides whether a batch may be applied (its own
checkpoint): an out-of-order batch is refused, an applied one is a no-op.

The sink also says whether what it counted contradicts the batch's events (``Sink.disagreements``).
Such a batch still succeeds: the target published it and its checkpoint in one step, so a failed run's
retry would find it applied and skip it, with nothing left to count, and no retry can undo it. It is
reported instead, and stays reported: a warning in the run log, ``sink_disagreements`` in its
materialisation, and the check ``sink_counts_agree`` failing from that batch on, on every later batch of
the line (``diverged_at_snapshot_id``), until a resync starts a new line.
"""

import time
from collections import Counter
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    BackfillPolicy,
    DagsterRunStatus,
    DataVersion,
    MaterializeResult,
    RunsFilter,
    asset,
)
from pyiceberg.exceptions import NoSuchTableError

from icecdc_dagster import changelog, run_tags
from icecdc_dagster.assets import line_record, naming
from icecdc_dagster.assets.changelog import batch_request
from icecdc_dagster.assets.lineage import lineage_run
from icecdc_dagster.assets.metadata_cache import described_table
from icecdc_dagster.assets.table_metadata import PARTITION_ROW_COUNT, lineage_metadata, replica_fallback
from icecdc_dagster.batch import CHANGE_TYPE, BatchInfo, Decision, decide, resumes_inside
from icecdc_dagster.config import SinkConfig, TableConfig
from icecdc_dagster.errors import CheckpointError, resync_command
from icecdc_dagster.lease import retry
from icecdc_dagster.lineage import LineageDataset, LineageEmitter, iceberg_dataset
from icecdc_dagster.lines.batch_metadata import (
    DISAGREEMENTS,
    NONE,
    BatchMetadata,
    SinkMetadata,
    disagreement_figure,
    disagreement_figures,
    latest_materialization,
    sink_set,
)
from icecdc_dagster.resources import IcebergCatalogResource, SparkResource, catalog_resource_keys, run_catalog
from icecdc_dagster.resources.keys import SPARK_KEY
from icecdc_dagster.sinks.base import ApplyResult, Disagreement, Sink
from icecdc_dagster.steps import lifecycle
from icecdc_dagster.steps.batches import BatchRequest, batch_info, join_export, segments, source_batch, uses_row_id
from icecdc_dagster.steps.changelog_store import ChangelogStore
from icecdc_dagster.steps.open_sink import open_configured_sink

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from pyspark.sql import DataFrame


def build_sink_asset(table: TableConfig, sink: SinkConfig, lineage: LineageEmitter | None = None,
                     described: Mapping[str, Any] | None = None, config_path: str | None = None) -> AssetsDefinition:
    """``described``: the target table's metadata known at load (derived from the source schema);
    ``config_path``: the pipeline file, named in the recovery command of a disagreeing batch."""
    resource_key = sink.resource_key()

    @asset(
        key=naming.sink_key(sink),
        deps=[naming.changelog_key(table)],
        partitions_def=naming.partitions_def(table),
        backfill_policy=BackfillPolicy.single_run(),
        group_name=naming.group_name(table),
        kinds=set(sink.tags),
        required_resource_keys={SPARK_KEY, *catalog_resource_keys(sink.target_catalog),
                                *([resource_key] if resource_key else [])},
        description=sink.describe(table.table_name),
        metadata={"source_table": table.table_name, "target": sink.asset_name, **(described or {})},
        check_specs=[AssetCheckSpec(naming.COUNTS_CHECK, asset=naming.sink_key(sink), blocking=False,
                                    description=COUNTS_CHECK_DESCRIPTION.format(target=sink.asset_name))],
    )
    # The result also reports the counts check: Dagster knows such a result by the bare class as the return
    # annotation (a subscripted one reads as the annotation of a single output, and the asset has two).
    def _sink(context: AssetExecutionContext) -> MaterializeResult:  # type: ignore[type-arg]
        with retry.classified(context.instance, context.run_id):
            result = _apply(context, table, sink, lineage, config_path)
        catalog_name = run_catalog(context.resources, None).name
        line_record.remember_sink(f"{catalog_name}.{table.table_name}", sink.name, sink.kind, sink.target,
                                  naming.sink_key(sink).to_user_string())
        return result

    return _sink


def _apply(context: AssetExecutionContext, table: TableConfig, sink: SinkConfig,
           lineage: LineageEmitter | None, config_path: str | None) -> MaterializeResult[Any]:
    """Apply the run's batch to the sink (a sink joining the running line: its own export)."""
    started = time.monotonic()
    spark: SparkResource = getattr(context.resources, SPARK_KEY)
    catalog: IcebergCatalogResource = run_catalog(context.resources, None)
    target_catalog = run_catalog(context.resources, sink.target_catalog)  # where the sink's table lives
    session = spark.session(catalog, *([target_catalog] if sink.target_catalog else []))
    source = catalog.source_table(context.run_id, table.table_name)
    request = batch_request(context, table, source)
    resource_key = sink.resource_key()
    connection = getattr(context.resources, resource_key) if resource_key else None
    target = open_configured_sink(sink, table, spark=session, catalog=catalog, source_table=source,
                                  connection=connection, target_catalog=target_catalog)
    by_row_id = uses_row_id(source, request.identifier_columns)
    store = ChangelogStore(session, catalog.name, table.table_name)
    previous = latest_materialization(context.instance, naming.sink_key(sink))  # the sink's last batch, if any
    joining = not request.includes_bootstrap and joins_line(previous is not None, target)
    if joining:  # added to the running line: the table at the batch's last snapshot, then the line's batches
        info, joined_events = join_export(session, catalog.name, source, request, by_row_id)
        context.log.info(f"{target.name}: joins the running line of {table.table_name} with its own export "
                         f"at snapshot {info.snapshot_id}; the other sinks go on from their checkpoints")
    else:
        info = batch_info(source, request)
    parts = None if joining else segmented(context.instance, table, target, request, info)
    if parts is not None:
        context.log.info(f"{target.name}: applies snapshots {parts[0].snapshot_ids[0]}..{info.snapshot_id} of "
                         f"{table.table_name} as {describe_segments(parts)}, each from the source (its checkpoint "
                         f"lies inside the range, or an earlier attempt ended inside it)")
    lineage_columns = sink.derived_columns(changelog.data_columns(source), info.identifier_columns, by_row_id)
    with lineage_run(lineage, context, naming.sink_key(sink), table.table_name,
                     inputs=lambda: [iceberg_dataset(catalog.name, catalog.load_table(store.table_name))],
                     outputs=lambda: _target_dataset(sink, target_catalog)) as outcome, \
            (changelog.staged_scans(session) if parts is not None else nullcontext()):
        if parts is not None:
            info, result, applied, found = apply_segments(session, catalog.name, source, request, parts, target,
                                                          by_row_id)
        else:
            events, ranges = (joined_events, None) if joining else store.events_and_ranges(info, by_row_id)
            result = target.apply(info, events, ranges)
            applied = {} if result.skipped else (result.event_counts if result.event_counts is not None
                                                  else event_counts(events))
            found = [] if result.skipped else target.disagreements(info, applied, result)
        if lineage is not None:
            outcome.outputs = _target_dataset(sink, target_catalog)
            for dataset in outcome.outputs:
                outcome.rows[dataset.name] = sum(applied.values())
                outcome.column_lineage[dataset.name] = lineage_columns
    parent = changelog.parent_of(source, info.first_snapshot_id)
    context.log.info(f"{target.name}: {'skipped (already applied)' if result.skipped else 'applied'} "
                     f"snapshots {info.first_snapshot_id}..{info.snapshot_id}: {result.counts}")
    if found:
        context.log.warning(disagreement_warning(target.name, info, found, config_path))
    checkpoint = result.checkpoint
    described: dict[str, Any] = {**lineage_metadata(naming.source_key(table), lineage_columns),
                                 PARTITION_ROW_COUNT: sum(applied.values())}
    written = sink.maintained_table()
    if written is not None:
        described |= described_table(target_catalog.name, target_catalog.load_table(written), info.identifier_columns,
                                     fallback=replica_fallback(table.table_name))
    recorded = sink_set(sink.kind).of_batch(
        info, parent, started, applied, skipped_already_applied=result.skipped,
        checkpoint_snapshot_id=str(checkpoint.snapshot_id) if checkpoint else NONE, line=request.line,
        joined_line_export=True if joining else None,
        diverged_at_snapshot_id=diverged_at(BatchMetadata.read(previous), request.line, info, found))
    metadata = recorded.with_figures({**recorded.sink_counts(result.counts), **disagreement_figures(found),
                                      **result.details})
    # The data version is the source snapshot the sink now holds, as the source observation records it.
    return MaterializeResult(metadata={**metadata, **described}, data_version=DataVersion(str(info.snapshot_id)),
                             check_results=counts_check(context, table, sink, recorded, found, config_path))


COUNTS_CHECK_DESCRIPTION = (
    "Each batch {target} applied did what its change events say: as many rows inserted, updated and deleted "
    "as the batch has inserts, updates and deletes, and no delete of a row the target lacks (an OpenSearch "
    "index: as many documents created as inserts, on single-snapshot batches that are not a redo). Evaluated by "
    "the batch's own step; fails from the first batch that disagrees (a key the source holds twice, or another "
    "writer of the target) until a resync.")


def disagreement_warning(sink_name: str, info: BatchInfo, found: list[Disagreement], config_path: str | None) -> str:
    """The run log's warning: which counts differed, by how much, why they can, and what recovers."""
    figures = [disagreement_figure(d) for d in found]
    differed = "; ".join(f"{f['count']} {f['found']} but {f['events']} {f['expected']} ({f['difference']:+d}): "
                         f"{f['cause']}" for f in figures)
    return (f"{DISAGREEMENTS}: {sink_name} applied snapshots {info.first_snapshot_id}..{info.snapshot_id} of "
            f"{info.table_name} (batch and checkpoint committed), but its counts contradict the batch's events: "
            f"{differed}. The target no longer equals the source: find the cause (deduplicate the source's "
            f"keys), then {resync_command(info.table_name, config_path)}")


def diverged_at(previous: BatchMetadata, line: str | None, info: BatchInfo, found: list[Disagreement]) -> str | None:
    """The first snapshot of the line whose batch the sink's counts contradicted: carried from the sink's
    ``previous`` batch on the same line (the target has not equalled the source since), else this batch's
    when it disagrees. A resync's new line starts clean: its export replaces the target."""
    carried = previous.diverged_at_snapshot_id if previous.line == line else None
    return carried or (str(info.snapshot_id) if found else None)


def counts_check(context: AssetExecutionContext, table: TableConfig, sink: SinkConfig, recorded: SinkMetadata,
                 found: list[Disagreement], config_path: str | None) -> list[AssetCheckResult]:
    """``sink_counts_agree`` of the batch, when the run selected it. ERROR: a disagreement means the target
    lost or overwrote rows the source has (what ``matches_source_at_checkpoint`` fails on, found here at
    no cost, with the batch that did it)."""
    key = naming.counts_check_key(sink)
    if key not in context.selected_asset_check_keys:
        return []
    since = recorded.diverged_at_snapshot_id
    where = SinkMetadata(snapshot_id=recorded.snapshot_id, line=recorded.line, diverged_at_snapshot_id=since)
    figures: dict[str, Any] = disagreement_figures(found)
    if since is not None:
        figures["recover"] = resync_command(table.table_name, config_path)
    return [AssetCheckResult(asset_key=key.asset_key, check_name=key.name, passed=since is None,
                             severity=AssetCheckSeverity.ERROR, metadata=where.with_figures(figures))]


ATTEMPTS_READ = 50   # the line's newest failed runs read for where their batches ended (segments)


def segmented(instance: "DagsterInstance", table: TableConfig, target: Sink, request: BatchRequest,
              info: BatchInfo) -> list[BatchRequest] | None:
    """The segments this sink applies the run's range in (``steps.batches.segments``), or None: the stored
    batch as it is. Only a range has segments; one the sink refuses or has goes to ``apply`` unchanged."""
    if len(info.snapshot_ids) < 2:
        return None
    checkpoint = target.read_checkpoint()
    if not resumes_inside(checkpoint, info):
        try:
            if decide(target.name, checkpoint, info) is not Decision.APPLY:
                return None
        except CheckpointError:
            return None   # apply() refuses it, in the same words
    return segments(request, info, checkpoint, attempted_ends(instance, table))


def attempted_ends(instance: "DagsterInstance", table: TableConfig) -> set[int]:
    """The last snapshots of the line's newest failed (or canceled) runs: where a batch may have stopped
    half-written in a target that does not publish atomically."""
    runs = instance.get_runs(RunsFilter(tags={run_tags.TABLE_TAG: naming.table_line(table).line_id},
                                        statuses=[DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]),
                             limit=ATTEMPTS_READ)
    return {lifecycle.snapshot_id_of(r.tags[run_tags.LAST_SNAPSHOT_TAG]) for r in runs
            if run_tags.LAST_SNAPSHOT_TAG in r.tags}


def describe_segments(parts: list[BatchRequest]) -> str:
    return ", ".join(f"{p.snapshot_ids[0]}..{p.snapshot_ids[-1]}" for p in parts)


def apply_segments(session: Any, catalog_name: str, source: Any, request: BatchRequest, parts: list[BatchRequest],
                   target: Sink, by_row_id: bool) -> tuple[BatchInfo, ApplyResult, dict[str, int], list[Disagreement]]:
    """Apply each segment in order, each batch computed from the source (``steps.batches.source_batch``).
    One result: the batch from the first segment's first snapshot to the range's last, the last segment's
    checkpoint, every segment's counts and events, and where the sink resumed when it was inside the range."""
    infos, results, applied, counts = [], [], Counter[str](), Counter[str]()
    found: list[Disagreement] = []
    for part in parts:
        info, events = source_batch(session, catalog_name, source, part, by_row_id)
        result = target.apply(info, events)
        if not result.skipped:
            part_counts = result.event_counts if result.event_counts is not None else event_counts(events)
            applied.update(part_counts)
            found += target.disagreements(info, part_counts, result)
            counts.update(result.counts)
        infos.append(info)
        results.append(result)
    whole = replace(infos[-1], first_snapshot_id=infos[0].first_snapshot_id,
                    snapshot_ids=tuple(i for info in infos for i in info.snapshot_ids),
                    accepted_predecessors=infos[0].accepted_predecessors, is_export=infos[0].is_export)
    details = {**results[-1].details, "applied_in_batches": describe_segments(parts)}
    ids = request.snapshot_ids
    if parts[0].snapshot_ids[0] != ids[0]:
        details["resumed_after_snapshot_id"] = str(ids[ids.index(parts[0].snapshot_ids[0]) - 1])
    result = ApplyResult(target.name, all(r.skipped for r in results), results[-1].checkpoint, dict(counts), details)
    return whole, result, dict(applied), found


def joins_line(has_batches: bool, target: Sink) -> bool:
    """The sink was added to a running line: Dagster has no batch of it (``has_batches`` False) and its
    target no checkpoint. (A target with a checkpoint goes by it: a join export that committed before its
    run was recorded is then already applied, and the next batch follows it.)"""
    return not has_batches and target.read_checkpoint() is None


def event_counts(events: "DataFrame") -> dict[str, int]:
    """The events a sink applied, per change type: one aggregation over the batch (four rows to the
    driver). Not the sink's own outcome counts (inserted/updated/indexed...): those say what the
    target did with them and are shown beside, as ``sink_*``."""
    grouped = events.groupBy(CHANGE_TYPE).count().collect()
    return {str(row[CHANGE_TYPE]): int(row["count"]) for row in grouped}


def _target_dataset(sink: SinkConfig, catalog: IcebergCatalogResource) -> list[LineageDataset]:
    try:
        dataset = sink.lineage_dataset(catalog.name, catalog.load_table)
    except NoSuchTableError:  # a replica the first batch creates
        return []
    return [dataset] if dataset is not None else []
