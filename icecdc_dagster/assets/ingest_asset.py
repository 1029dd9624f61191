"""``ingest/<name>``: Debezium landing files written into Iceberg, one partition per landing file; or one
bounded batch of a stream input per run (partition: the first waiting position; the batch's range, its
messages, re-deliveries skipped and the consumer lag are in the run's metadata).

A run covers consecutive files (at most ``files_per_batch``) as one batch; the engine records the
batch id in the targets' snapshot summaries and skips a batch already committed. A file already
recorded as part of a batch is re-run as exactly that batch (``steps.ingest_entry.batches_for``), so
retries and re-executions of any partition, alone or in a range, never write a file twice.

Metadata per run: files, batch id(s), whether everything was already committed, events read,
tombstones, expired files (past the ledger's horizon, never ingested: set aside, named in ``expired``),
dead-lettered events, declared-rule counts (ignored_fields, stringified, nanos_truncated),
inserted / updated / deleted / delete_missing (or appended; write_mode equality_deletes: upserted /
delete_keys) rows, per target table its snapshot id, counts, added and widened columns, and the duration.
"""

import time
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetObservation,
    AssetsDefinition,
    AssetSpec,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    asset,
)
from pyiceberg.exceptions import NoSuchTableError

from icecdc_dagster.assets import naming
from icecdc_dagster.assets.lineage import ingest_lineage_run
from icecdc_dagster.assets.metadata_cache import described_table
from icecdc_dagster.assets.table_metadata import (
    COLUMN_LINEAGE_TABLE,
    COLUMN_SCHEMA,
    DEAD_LETTER_DOCS,
    PARTITION_ROW_COUNT,
    ROW_COUNT,
    TABLE_NAME,
    column_schema,
    lineage_table,
    source_fallback,
)
from icecdc_dagster.config import IngestConfig
from icecdc_dagster.ingest import IngestResult, dead_letters, ingest_files, recorded_batches, routing
from icecdc_dagster.inputs.registry import open_input
from icecdc_dagster.lineage import BatchFacet, LineageDataset, LineageEmitter, iceberg_dataset, location_dataset
from icecdc_dagster.lineage.openlineage import RunOutcome
from icecdc_dagster.lines.batch_metadata import IngestMetadata, seconds_since
from icecdc_dagster.resources import IcebergCatalogResource, SparkResource, catalog_resource_keys, run_catalog
from icecdc_dagster.resources.keys import SPARK_KEY
from icecdc_dagster.steps.ingest_entry import batches_for, fixed_target, ingest_settings, ingest_stream_batch


def build_ingest_asset(entry: IngestConfig, described: Mapping[str, Any] | None = None,
                       lineage: LineageEmitter | None = None) -> AssetsDefinition:
    """``described``: the fixed target's table metadata known at load (from the last batch), when this
    asset stands for the target; None when the target is a configured table with an asset of its own,
    whose line records the snapshots as its partitions (materialised when the line adds them: never a
    snapshot outside the line's partition set)."""
    target = fixed_target(entry)

    @asset(
        key=naming.ingest_key(entry),
        partitions_def=naming.ingest_partitions_def(entry),
        backfill_policy=BackfillPolicy.single_run(),
        group_name=naming.ingest_group_name(entry),
        kinds={"iceberg", "spark"},
        required_resource_keys={SPARK_KEY, *catalog_resource_keys(entry.catalog)},
        description=(f"Debezium events from {entry.any_input.describe()} upserted into "
                     f"{target or 'the tables named by ' + entry.target}; bad events go to dead-letter tables."),
        metadata={"landing" if entry.input is None else "input": entry.source, "target": entry.target,
                  "identifier_columns": ", ".join(entry.identifier_columns) or "(table's own or none)",
                  **{k: v for k, v in (described or {}).items() if k != ROW_COUNT}},
    )
    def _ingest(context: AssetExecutionContext) -> MaterializeResult[Any]:
        started = time.monotonic()
        spark: SparkResource = getattr(context.resources, SPARK_KEY)
        catalog = run_catalog(context.resources, entry.catalog)  # where the entry's targets live
        session = spark.session(catalog)
        stream = IngestMetadata()
        with ingest_lineage_run(lineage, context, naming.ingest_key(entry), entry.source,
                                inputs=lambda: [landing_dataset(entry.source, _existing(catalog, target))],
                                outputs=lambda: _existing(catalog, target)) as (outcome, facet):
            if entry.input is None:
                results = _landing_batches(context, session, catalog, entry)
            else:
                results, stream = _stream_batch(context, session, catalog, entry)
            if lineage is not None:
                ingest_outcome(outcome, facet, catalog, entry.source, results)
        files = [f for r in results for f in r.files]
        expired = [f.rsplit("/", 1)[-1] for r in results for f in r.expired]
        if expired:
            context.log.warning(f"ingest {entry.name}: {len(expired)} landing file(s) older than max_file_age "
                                f"({(entry.landing_input or entry).max_file_age}) were never ingested and are set "
                                f"aside: {expired} "
                                "(take_expired_files: true ingests them)")
        totals: dict[str, int] = {}
        targets: dict[str, dict[str, Any]] = {}
        for r in results:
            for key, value in r.totals().items():
                totals[key] = totals.get(key, 0) + int(value)
            for name, t in r.targets.items():  # in batch order: the last snapshot of each table wins
                prior = targets.get(name, {})
                counts = {k: prior.get(k, 0) + v for k, v in t.counts.items()}
                snapshot = str(t.snapshot_id) if t.snapshot_id is not None else prior.get("snapshot_id")
                targets[name] = {**prior, **counts, "snapshot_id": snapshot,
                                 "skipped": prior.get("skipped", True) and t.skipped,
                                 "added_columns": [*prior.get("added_columns", []), *t.added_columns],
                                 "widened_columns": [*prior.get("widened_columns", []), *t.widened_columns]}
        skipped = all(r.skipped for r in results)
        written = target_lineage(entry, _target_metadata(catalog, target)) if target else {}
        # The dead-letter table, when there is one: its metadata and this run's rows, observed. Not a
        # materialisation: the asset is not one Dagster materialises (an AssetSpec), and the UI's node shows
        # such an asset's observations as its latest event ("Materialized" beside an empty latest event).
        if target:
            dead = _target_metadata(catalog, routing.dead_letter_table(target), dead=True)
            if dead:
                context.log_event(AssetObservation(
                    asset_key=naming.dead_letter_key(entry, target),
                    metadata={**dead, PARTITION_ROW_COUNT: totals.get("dead_lettered", 0),
                              **IngestMetadata(batch_id=" | ".join(r.batch_id for r in results))}))
        context.log.info(f"ingest {entry.name}: {'skipped (already committed)' if skipped else 'committed'} "
                         f"{len(files)} file(s) in {len(results)} batch(es): {totals}")
        recorded = stream.model_copy(update={
            "files": MetadataValue.json([f.rsplit("/", 1)[-1] for f in files]) if entry.input is None else None,
            "batch_id": " | ".join(r.batch_id for r in results), "skipped_already_committed": skipped,
            "expired": MetadataValue.json(expired) if expired else None,
            "targets": targets_table(targets), "duration_s": seconds_since(started)})
        # The landing -> table edge: the target's columns from the landing fields (the whole table metadata
        # when this asset stands for the target; a configured table's own asset records its partitions).
        edge = written if described is not None else {k: v for k, v in written.items() if k == COLUMN_LINEAGE_TABLE}
        counts = {**dict.fromkeys(IngestMetadata.ALWAYS, 0), **totals}  # 0 included: the Plots tab has no gaps
        return MaterializeResult(metadata={**recorded.with_figures(dict(sorted(counts.items()))), **edge})

    return _ingest


def _landing_batches(context: AssetExecutionContext, session: Any, catalog: IcebergCatalogResource,
                     entry: IngestConfig) -> list[IngestResult]:
    """The run's landing files as engine batches (a recorded batch re-run as itself), each ingested once."""
    settings = ingest_settings(entry)
    recorded = recorded_batches(session, catalog.name, settings)
    results = []
    for batch in batches_for(entry, context.partition_keys, recorded):
        if batch.committed:  # already in every table it writes: a re-execution changes nothing
            results.append(IngestResult(batch.batch_id or "", batch.files, True))
        else:
            results.append(ingest_files(session, catalog.name, catalog.load(), settings, list(batch.files)))
    return results


def _stream_batch(context: AssetExecutionContext, session: Any, catalog: IcebergCatalogResource,
                  entry: IngestConfig) -> tuple[list[IngestResult], IngestMetadata]:
    """One bounded batch of the stream input: read, commit, acknowledge. Metadata: the batch's position range,
    messages, re-deliveries the ledger skipped, and the consumer lag after the acknowledgement."""
    assert entry.input is not None
    with open_input(entry.input) as reader:
        run = ingest_stream_batch(session, catalog.name, entry, reader)
    batch = run.batch
    result = run.result or IngestResult(batch.batch_id or "", (entry.source,), True)
    context.log.info(f"ingest {entry.name}: batch {batch.first}..{batch.last} ({len(batch.messages)} messages), "
                     f"{run.redelivered_skipped} re-deliveries already committed, lag {run.lag_after.waiting}")
    return [result], IngestMetadata(
        input=entry.input.describe(), first_position=batch.first or "", last_position=batch.last or "",
        messages=len(batch.messages), redelivered_skipped=run.redelivered_skipped,
        consumer_lag=run.lag_after.waiting, lag_pending=run.lag_after.pending,
        lag_unacknowledged=run.lag_after.unacknowledged)


def targets_table(targets: Mapping[str, Mapping[str, Any]]) -> MetadataValue:
    """``targets`` as the asset page renders it: a markdown table, a row per table written (its snapshot,
    whether the batch was there already, its counts, columns added or widened)."""
    counts = sorted({k for t in targets.values() for k, v in t.items()
                     if isinstance(v, int) and not isinstance(v, bool)})
    header = ["table", "snapshot", "already committed", *counts, "columns added", "columns widened"]
    rows = [[f"`{name}`", str(t.get("snapshot_id") or "none"), "yes" if t.get("skipped") else "no",
             *(f"{int(t.get(k, 0)):,}" for k in counts), ", ".join(t.get("added_columns", [])) or "-",
             ", ".join(t.get("widened_columns", [])) or "-"] for name, t in sorted(targets.items())]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]
    return MetadataValue.md("\n".join(lines) if rows else "no table written")


WRITTEN = ("inserted", "updated", "deleted", "appended", "upserted", "delete_keys")  # counts of rows written


def landing_dataset(landing: str, targets: Sequence[LineageDataset]) -> LineageDataset:
    """The landing location as OpenLineage sees it: its fields are the Debezium images' fields, named
    like the target columns they become (the union over the targets)."""
    fields = {name: (name, kind, "field of the Debezium before/after image") for t in targets
              for name, kind, _ in t.fields}
    return location_dataset(landing, tuple(fields.values()))


def ingest_outcome(outcome: RunOutcome, facet: BatchFacet, catalog: IcebergCatalogResource, landing: str,
                   results: Sequence[IngestResult]) -> None:
    """What COMPLETE reports: every table the run wrote (after routing) with its rows and column
    lineage from the landing fields, each dead-letter table with the events it took (``raw`` <- every
    landing field), and the snapshots committed."""
    names = sorted({name for r in results for name in r.targets})
    targets = [d for name in names for d in _existing(catalog, name)]
    source = landing_dataset(landing, targets)
    landing_fields = [name for name, _, _ in source.fields]
    outcome.inputs, outcome.outputs = [source], []
    for name in names:
        written = [r.targets[name] for r in results if name in r.targets]
        for dataset in _existing(catalog, name):
            outcome.outputs.append(dataset)
            outcome.rows[dataset.name] = sum(t.counts.get(k, 0) for t in written for k in WRITTEN)
            outcome.column_lineage[dataset.name] = {f: [f] for f, _, _ in dataset.fields}
        for dataset in _existing(catalog, routing.dead_letter_table(name)):
            outcome.outputs.append(dataset)
            outcome.rows[dataset.name] = sum(t.counts.get("dead_lettered", 0) for t in written)
            outcome.column_lineage[dataset.name] = {"raw": landing_fields}
    snapshots = [str(t.snapshot_id) for r in results for t in r.targets.values() if t.snapshot_id is not None]
    facet.firstSnapshotId, facet.snapshotId = (snapshots[0], snapshots[-1]) if snapshots else ("", "")


def _existing(catalog: IcebergCatalogResource, table_name: str | None) -> list[LineageDataset]:
    if table_name is None:
        return []
    try:
        return [iceberg_dataset(catalog.name, catalog.load_table(table_name))]
    except NoSuchTableError:
        return []


def build_dead_letter_asset(entries: Sequence[IngestConfig], catalog_name: str,
                            remembered: Mapping[str, Mapping[str, Any]]) -> AssetSpec:
    """``dead_letters/<ns>/<table>``: where the events that cannot be written to the fixed target of
    ``entries`` land, downstream of their ingest assets. Its schema is known at load (the engine
    creates the table), its location once a batch has written it; each run that finds it reports its
    metadata and the run's rows."""
    target = fixed_target(entries[0])
    assert target is not None
    table = routing.dead_letter_table(target)
    return AssetSpec(
        key=naming.dead_letter_key(entries[0], target), deps=[naming.ingest_key(e) for e in entries],
        group_name=naming.ingest_group_name(entries[0]), kinds={"iceberg"},
        description=f"Events that could not be written to {target}, with the reason (Iceberg table {table}).",
        metadata={**remembered.get(f"{catalog_name}.{table}", {}), TABLE_NAME: f"{catalog_name}.{table}",
                  COLUMN_SCHEMA: column_schema(dead_letters.schema(), docs=DEAD_LETTER_DOCS)})


def target_lineage(entry: IngestConfig, written: dict[str, Any]) -> dict[str, Any]:
    """The target's metadata with its column lineage as the markdown table the asset page renders:
    each column from the Debezium image field of the same name in the entry's landing location or
    stream (no asset, so no structured ``dagster/column_lineage``: it names asset keys)."""
    schema = written.get(COLUMN_SCHEMA)
    if schema is None:
        return written
    return {**written, COLUMN_LINEAGE_TABLE: lineage_table(entry.source, {c.name: [c.name] for c in schema.columns})}


def _target_metadata(catalog: IcebergCatalogResource, target: str, dead: bool = False) -> dict[str, Any]:
    try:
        return described_table(catalog.name, catalog.load_table(target), docs=DEAD_LETTER_DOCS if dead else None,
                               fallback=None if dead else source_fallback(target))
    except NoSuchTableError:  # every event dead-lettered before an auto-created target existed
        return {}
