"""The OpenSearch sink: one Iceberg table's CDC batches -> one index, idempotently.

Why it is safe to rerun anything: every action carries the source commit's
sequence number as an external version, so the index only ever moves forward
per document (a replayed or stale batch answers 409, counted as already
applied); and the checkpoint in the live index version's ``_meta`` advances only
after every action of the batch succeeded and the index was refreshed.

Documents hold the source table's columns only: change columns, event
columns and v3 lineage columns are dropped (``include_iceberg_metadata``
keeps iceberg_operation (the row's change) / iceberg_snapshot_operation /
iceberg_table_name / iceberg_snapshot_id).

Users query ``settings.index``, an alias over versioned indexes (:mod:`.versions`): a change the
documents cannot take in place (:mod:`.evolution`), a resync, or the migration of a plain index is
built into a new version from an export of the source, then the alias moves atomically.

Caveat: OpenSearch keeps delete tombstones (which refuse older versions) for
``index.gc_deletes`` (60 s by default); past that only the checkpoint guard
stops a stale batch from re-creating a deleted document. Raise it through
``index_settings`` if batches may be replayed by hand around the guard.
"""

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from typing import Any

from pyiceberg.schema import Schema
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from icecdc_dagster import batch as b
from icecdc_dagster.batch import BatchInfo, Checkpoint, Decision, decide
from icecdc_dagster.errors import CheckpointError, ConfigError, ReindexError, SinkUnavailableError, SinkWriteError
from icecdc_dagster.sinks.base import ApplyResult, ColumnRanges, Disagreement
from icecdc_dagster.sinks.opensearch import checkpoint as cp
from icecdc_dagster.sinks.opensearch import versions as vs
from icecdc_dagster.sinks.opensearch.actions import FAILED, WriteSummary
from icecdc_dagster.sinks.opensearch.agreement import index_disagreements
from icecdc_dagster.sinks.opensearch.bulk import write_bulk_rows
from icecdc_dagster.sinks.opensearch.documents import (
    ICEBERG_METADATA_COLUMNS,
    RESERVED_COLUMNS,
    bulk_rows,
    document_columns,
    with_generated_ids,
)
from icecdc_dagster.sinks.opensearch.evolution import FieldMap, compare, field_map
from icecdc_dagster.sinks.opensearch.mapping import iceberg_schema_to_mapping, missing_properties
from icecdc_dagster.sinks.opensearch.settings import OpenSearchSinkSettings

# (snapshot id, identifier columns) -> a block yielding the CDC events of every row of the source at
# that snapshot (the export path); what a new index version is filled from.
SourceExport = Callable[[int, tuple[str, ...]], AbstractContextManager[DataFrame]]


# OpenSearch external versions of line n are n * 2**40 + the source sequence number, so the export
# of a new line outranks every document the old line wrote (a recreated table restarts at 1).
VERSION_EPOCH_SHIFT = 40


def version_offset(token: str | None) -> int:
    return b.line_epoch(token) << VERSION_EPOCH_SHIFT


class DeleteWithoutDocumentIdError(SinkWriteError):
    """An append-only table without key or row lineage produced a DELETE: there is no document to name."""


def prepare_events(events: DataFrame, identifier_columns: tuple[str, ...], include_iceberg_metadata: bool,
                   table_name: str, snapshot_id: int, sink_name: str) -> DataFrame:
    """Refuse keyless deletes; give keyless inserts stable generated ids (see ``with_generated_ids``)."""
    if identifier_columns:
        return events  # the changelog engine refuses null keys, so every event has a document_id
    keyless = events.filter(F.col(b.DOCUMENT_ID).isNull())
    deletes = keyless.filter(F.col(b.BULK_ACTION) == F.lit(b.DELETE_ACTION)).limit(1).count()
    if deletes:
        raise DeleteWithoutDocumentIdError(
            f"{sink_name}: snapshot {snapshot_id} of {table_name} deletes rows, but the table has neither "
            f"identifier columns nor row lineage (_row_id), so the documents to delete cannot be named; "
            f"declare identifier_columns for {table_name} (or upgrade it to format v3) and re-export")
    columns = document_columns(events, include_iceberg_metadata)
    return events.filter(F.col(b.DOCUMENT_ID).isNotNull()).unionByName(with_generated_ids(keyless, columns))


def write_events(settings: OpenSearchSinkSettings, events: DataFrame) -> WriteSummary:
    """Bulk-write CDC events as they are (no checkpoint check, no checkpoint write)."""
    return write_bulk_rows(settings, bulk_rows(events, settings.include_iceberg_metadata))




def schema_columns(events: DataFrame, schema: Schema) -> DataFrame:
    """Only the source columns of ``schema`` (plus change and event columns): a column the changelog
    store still holds under an old name (renamed or dropped since) is not a field of the documents."""
    names = {f.name for f in schema.fields}
    extra = [c for c in events.columns
             if c not in names and c not in RESERVED_COLUMNS and c not in ICEBERG_METADATA_COLUMNS]
    return events.drop(*extra) if extra else events


class OpenSearchSink:
    """Implements :class:`icecdc_dagster.sinks.base.Sink` for one alias over versioned indexes.

    ``source_schema``: the schema the batches are read with (the table's at the run); ``export``:
    how to read every row of the source at a snapshot (None: this sink cannot build a new version,
    and a change that needs one fails with :class:`ReindexError`)."""

    def __init__(self, settings: OpenSearchSinkSettings, source_schema: Schema, name: str | None = None,
                 export: SourceExport | None = None) -> None:
        self.settings = settings
        self.source_schema = source_schema
        self.name = name or f"opensearch/{settings.index}"
        self.export = export
        self._client: Any = None

    def __repr__(self) -> str:
        return f"OpenSearchSink(name={self.name!r}, settings={self.settings!r})"

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self.settings.client()
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def alias(self) -> str:
        return self.settings.index

    def layout(self) -> vs.Layout:
        return vs.read_layout(self.client, self.alias)

    def _checkpoint(self, version: vs.Version | None) -> Checkpoint | None:
        return None if version is None else cp.checkpoint_in(version.mappings, version.name, self.name)

    def read_checkpoint(self) -> Checkpoint | None:
        """The checkpoint of the version the alias names (of the plain index before its migration).

        Raises:
            CheckpointError: the alias names several indexes, or the version's checkpoint is unreadable.
            AccessRefusedError: the cluster refused the configured password (401/403; terminal).
            opensearchpy.exceptions.TransportError: the cluster answered the read with an error
                (``ConnectionError``, a subclass: it did not answer).
        """
        return self._checkpoint(self.layout().live)

    def target_state(self) -> str:
        """The index version users query and any reindex in progress (``icecdc status``)."""
        layout = self.layout()
        return vs.describe(layout, self._checkpoint(layout.building))

    def desired_mapping(self, schema: Schema) -> dict[str, Any]:
        return iceberg_schema_to_mapping(schema, self.settings.include_iceberg_metadata)

    def ensure_index(self, schema: Schema | None = None) -> str:
        """The live version (created as ``<index>_v1`` under the alias if there is none), with
        mappings for columns it does not know yet; returns its name."""
        schema = schema or self.source_schema
        live = self.layout().live
        name = live.name if live is not None else self._create_first(schema, None)
        self._evolve_mapping(name, schema)
        return name

    def _create_first(self, schema: Schema, batch: BatchInfo | None) -> str:
        from opensearchpy.exceptions import RequestError  # opensearch-py: ~1.2 s, its sink only

        for leftover in self.layout().others:  # unreachable without the alias: nothing reads them
            vs.drop(self.client, leftover.name)
        meta = vs.build_meta(1, field_map(schema), batch.snapshot_id if batch else None,
                             batch.line if batch else None, "first version")
        try:
            return vs.create_version(self.client, self.alias, 1, self._new_mappings(schema),
                                     self.settings.index_settings, meta, with_alias=True)
        except RequestError as exc:
            if exc.error != "resource_already_exists_exception":
                raise
            return vs.version_name(self.alias, 1)

    def _new_mappings(self, schema: Schema, carried: dict[str, Any] | None = None) -> dict[str, Any]:
        """A new version's mappings: the template's, or ``mapping``, or derived from ``schema``.
        ``carried``: the mappings of a plain index being migrated: what it maps for a current column
        (made by hand, or by an older ``mapping``) is what its documents were indexed with, so it wins."""
        if self.settings.template_name:
            self._check_template()
            return {}
        mappings = self.settings.mapping or self.desired_mapping(schema)
        if carried:
            names = {f.name for f in schema.fields}
            kept = {k: v for k, v in (carried.get("properties") or {}).items() if k in names}
            mappings = {**mappings, "properties": {**(mappings.get("properties") or {}), **kept}}
        return mappings

    def _evolve_mapping(self, index: str, schema: Schema) -> None:
        """Map columns the version does not know yet (an addition is an in-place change)."""
        if not self.settings.evolve_mapping:
            return
        current = cp.index_mappings(self.client, index) or {}
        additions = missing_properties(self.desired_mapping(schema), current)
        if additions:
            self.client.indices.put_mapping(index=index, body={"properties": additions})

    def _check_template(self) -> None:
        name, indices = self.settings.template_name, self.client.indices
        if not (indices.exists_index_template(name=name) or indices.exists_template(name=name)):
            raise ConfigError(f"{self.name}: index template {name!r} for index {self.settings.index} does not exist")

    def reindex_reason(self, layout: vs.Layout, batch: BatchInfo, wanted: FieldMap) -> str | None:
        """Why ``batch`` is applied by building a new version, or None (in place on the live one)."""
        live = layout.live
        if live is None:
            return None
        if layout.plain:
            return f"migration of the plain index {live.name} to an alias over versioned indexes"
        if batch.resyncs_target:
            return f"resync (line {batch.line})"
        recorded = live.meta.get("schema")
        if recorded is None:
            return f"index {live.name} records no source schema"
        change = compare(recorded, wanted)
        return change.describe() if change.needs_reindex else None

    def apply(self, batch: BatchInfo, events: DataFrame, ranges: ColumnRanges | None = None) -> ApplyResult:
        """Bulk-write the batch into the live version (or build a new version and move the alias to it),
        then record the checkpoint in the version's ``_meta``. ``ranges``: not used (documents are written by id).

        Raises:
            CheckpointError: the batch does not follow the checkpoint (:func:`batch.decide`), or the
                checkpoint or the alias moved while the batch was written (a concurrent writer).
            ConfigError: ``template_name`` names no index template (found when a version is created).
            DeleteWithoutDocumentIdError: a keyless table without row lineage deleted rows.
            ReindexError: the change needs a new version but the sink has no export to fill it from.
            SinkUnavailableError: a bulk partition stopped because the cluster did not answer (transient).
            SinkWriteError: the cluster rejected some actions (terminal: the same batch is rejected again).
            AccessRefusedError: the cluster refused the configured password on any request (401/403; terminal).
            opensearchpy.exceptions.TransportError: the cluster refused or did not answer one of the
                driver's own requests (layout, mapping, index creation, checkpoint write).
        """
        started = time.monotonic()
        layout = self.layout()
        before = self._checkpoint(layout.live)
        if decide(self.name, before, batch) is Decision.ALREADY_APPLIED:
            return ApplyResult(self.name, skipped=True, checkpoint=before, details=self._details(layout.live))
        wanted = field_map(self.source_schema)
        reason = self.reindex_reason(layout, batch, wanted)
        if reason is not None:
            return self._rebuild(layout, batch, events, wanted, reason, started)
        return self._apply_in_place(layout, batch, events, wanted, started)

    def _apply_in_place(self, layout: vs.Layout, batch: BatchInfo, events: DataFrame, wanted: FieldMap,
                        started: float) -> ApplyResult:
        before = self._checkpoint(layout.live)
        index = layout.live.name if layout.live is not None else self._create_first(self.source_schema, batch)
        self._evolve_mapping(index, self.source_schema)
        summary = self._write(index, batch, events)
        if not summary.ok:
            raise self._failure(batch, before, summary, index)
        if self.settings.refresh is True:
            self.client.indices.refresh(index=index)
        # The guard ran before the writes; a concurrent run may have moved the checkpoint since.
        now = cp.read_checkpoint(self.client, index, self.name)
        if now != before:
            raise CheckpointError(
                f"{self.name}: checkpoint of index {index} moved from {before} to {now} while "
                f"snapshot {batch.snapshot_id} of {batch.table_name} was applied; not overwriting it")
        checkpoint = cp.write_checkpoint(self.client, index, self.name, batch, wanted)
        for leftover in layout.others:  # a build this change no longer needs, or a dropped version's remains
            vs.drop(self.client, leftover.name)
        return self._result(batch, checkpoint, summary, index, started)

    def _rebuild(self, layout: vs.Layout, batch: BatchInfo, events: DataFrame, wanted: FieldMap, reason: str,
                 started: float) -> ApplyResult:
        """Fill a new version from the source at the batch's snapshot, checkpoint it, move the alias.

        Until the alias moves, readers query the live version, complete at the previous checkpoint,
        and the sink's checkpoint stays the live version's. A build of this very batch left by a
        crash is continued (the writes are idempotent), and one already checkpointed is only swapped."""
        before = self._checkpoint(layout.live)
        target = self._prepare_build(layout, batch, wanted, reason)
        summary = WriteSummary()
        if self._checkpoint(target) != batch.checkpoint:
            with self._rebuild_rows(batch, events) as rows:
                summary = self._write(target.name, batch, rows)
            if not summary.ok:
                raise self._failure(batch, before, summary, target.name)
            self.client.indices.refresh(index=target.name)
            cp.write_checkpoint(self.client, target.name, self.name, batch, wanted)
        try:
            vs.swap(self.client, layout, target.name)
        except CheckpointError as exc:
            raise CheckpointError(f"{self.name}: {exc}; snapshot {batch.snapshot_id} of {batch.table_name} is "
                                  f"built in {target.name}, the sink stays at {before}") from None
        result = self._result(batch, batch.checkpoint, summary, target.name, started)
        result.details["reindexed"] = reason
        return result

    def _prepare_build(self, layout: vs.Layout, batch: BatchInfo, wanted: FieldMap, reason: str) -> vs.Version:
        """The version to build: one this batch already started (same snapshot, line and schema) is
        kept; every other version but the live one is dropped (stale builds, leftovers)."""
        number = layout.next_number
        keep = None
        for version in layout.others:
            meta = version.meta
            if (version.number == number and meta.get("snapshot_id") == str(batch.snapshot_id)
                    and meta.get("line") == batch.line and meta.get("schema") == wanted):
                keep = version
            else:
                vs.drop(self.client, version.name)
        if keep is not None:
            return keep
        meta = vs.build_meta(number, wanted, batch.snapshot_id, batch.line, reason)
        carried = layout.live.mappings if layout.plain and layout.live is not None else None
        name = vs.create_version(self.client, self.alias, number, self._new_mappings(self.source_schema, carried),
                                 self.settings.index_settings, meta, with_alias=False)
        self._evolve_mapping(name, self.source_schema)
        return vs.Version(name, number, cp.index_mappings(self.client, name) or {})

    @contextmanager
    def _rebuild_rows(self, batch: BatchInfo, events: DataFrame) -> Iterator[DataFrame]:
        """Every row of the source at the batch's snapshot: a resync batch is that export already;
        otherwise the export path reads it (the batch's own changes are part of it)."""
        if batch.resyncs_target:
            yield events
            return
        if self.export is None:
            raise ReindexError(f"{self.name}: snapshot {batch.snapshot_id} of {batch.table_name} needs a new "
                               f"version of index {self.alias}, but this sink was opened without access to the "
                               f"source's export")
        with self.export(batch.snapshot_id, batch.identifier_columns) as rows:
            # Every row of the export is at the batch's snapshot: its version is the batch's sequence number
            # (the same on v2+; on a format v1 line the export alone cannot know the line's ordinal).
            yield rows.withColumn(b.COMMIT_SEQUENCE_NUMBER, F.lit(batch.sequence_number).cast("long"))

    def _write(self, index: str, batch: BatchInfo, events: DataFrame) -> WriteSummary:
        """Bulk-write the batch's events into one concrete index (never through the alias)."""
        offset = version_offset(batch.line)
        if offset:  # a resync line outranks every version the old line wrote (see lifecycle)
            events = events.withColumn(b.COMMIT_SEQUENCE_NUMBER, F.col(b.COMMIT_SEQUENCE_NUMBER) + F.lit(offset))
        events = schema_columns(events, self.source_schema)
        prepared = prepare_events(events, batch.identifier_columns, self.settings.include_iceberg_metadata,
                                  batch.table_name, batch.snapshot_id, self.name)
        return write_events(replace(self.settings, index=index), prepared)

    def disagreements(self, batch: BatchInfo, event_counts: Mapping[str, int],
                      result: ApplyResult) -> list[Disagreement]:
        """The bulk's ``created`` / ``updated`` / ``deleted`` answers against the batch's INSERT /
        UPDATE_AFTER / DELETE events, for a single-snapshot batch that is not a redo (see
        ``opensearch.agreement``). An action the index rejects already fails the batch (:meth:`_failure`)."""
        return index_disagreements(batch, event_counts, result)

    def _details(self, live: vs.Version | None) -> dict[str, Any]:
        return {"index": self.alias, "index_version": live.name if live is not None else "none"}

    def _result(self, batch: BatchInfo, checkpoint: Checkpoint, summary: WriteSummary, index: str,
                started: float) -> ApplyResult:
        return ApplyResult(
            self.name, skipped=False, checkpoint=checkpoint, counts={**summary.counts, "actions": summary.actions},
            details={"index": self.alias, "index_version": index, "partitions": summary.partitions,
                     "seconds": round(time.monotonic() - started, 3)})

    def _failure(self, batch: BatchInfo, before: Checkpoint | None, summary: WriteSummary,
                 index: str) -> SinkWriteError:
        """Every action answered and some were rejected: the same batch is rejected again (terminal).
        A partition stopped because the cluster did not answer: it may later (transient)."""
        unavailable = summary.fatal and not summary.counts[FAILED]
        error = SinkUnavailableError if unavailable else SinkWriteError
        return error(self._failure_message(batch, before, summary, index))

    def _failure_message(self, batch: BatchInfo, before: Checkpoint | None, summary: WriteSummary,
                         index: str) -> str:
        where = (f"{self.name}: snapshot {batch.snapshot_id} of {batch.table_name} was not fully applied to "
                 f"index {self.alias} (version {index})")
        parts = [where, f"{summary.counts[FAILED]} of {summary.actions} actions failed"]
        if summary.fatal:
            parts.append(f"{len(summary.fatal)} partition(s) stopped: {summary.fatal[0]}")
        if summary.reasons:
            parts.append("first reasons: " + "; ".join(summary.reasons))
        parts.append(f"checkpoint left at {before.snapshot_id if before else 'none'}; rerun the batch once fixed")
        return " | ".join(parts)
