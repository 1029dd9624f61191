"""The OpenSearch sink: one Iceberg table's CDC batches -> one index, idempotently.

Why it is safe to rerun anything: every action carries the source commit's
sequence number as an external version, so the index only ever moves forward
per document (a replayed or stale batch answers 409, counted as already
applied); and the checkpoint in the index ``_meta`` advances only after every
action of the batch succeeded and the index was refreshed.

Documents hold the source table's columns only: change columns, event
columns and v3 lineage columns are dropped (``include_iceberg_metadata``
keeps iceberg_operation (the row's change) / iceberg_snapshot_operation /
iceberg_table_name / iceberg_snapshot_id).
Caveat: OpenSearch keeps delete tombstones (which refuse older versions) for
``index.gc_deletes`` (60 s by default); past that only the checkpoint guard
stops a stale batch from re-creating a deleted document. Raise it through
``index_settings`` if batches may be replayed by hand around the guard.
"""

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pyiceberg.schema import Schema
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from icecdc_dagster import batch as b
from icecdc_dagster.batch import BatchInfo, Checkpoint, Decision, decide
from icecdc_dagster.errors import CheckpointError, ConfigError, SinkUnavailableError, SinkWriteError
from icecdc_dagster.sinks.base import ApplyResult
from icecdc_dagster.sinks.opensearch import checkpoint as cp
from icecdc_dagster.pipeline.lifecycle import version_offset
from icecdc_dagster.sinks.opensearch.actions import DELETED, FAILED, WriteSummary
from icecdc_dagster.sinks.opensearch.documents import (ACTION, ID, SOURCE, VERSION, bulk_rows, document_columns,
                                                       with_generated_ids)
from icecdc_dagster.sinks.opensearch.mapping import iceberg_schema_to_mapping, missing_properties
from icecdc_dagster.sinks.opensearch.settings import OpenSearchSinkSettings
from icecdc_dagster.sinks.opensearch.writer import write_bulk_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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


def index_ids(settings: OpenSearchSinkSettings, spark: "SparkSession", slices: int) -> DataFrame:
    """Every document id of the index, read by Spark tasks (one sliced scroll each), never by the driver."""
    from pyspark.sql import types as T

    def scroll(slice_ids: Iterable[int]) -> Iterator[tuple[str]]:
        client = settings.client()
        try:
            for slice_id in slice_ids:
                body = {"_source": False, "size": 1000, "query": {"match_all": {}}}
                if slices > 1:
                    body["slice"] = {"id": slice_id, "max": slices}
                page = client.search(index=settings.index, body=body, scroll="5m",
                                     request_timeout=settings.request_timeout_s)
                while page["hits"]["hits"]:
                    for hit in page["hits"]["hits"]:
                        yield (hit["_id"],)
                    page = client.scroll(scroll_id=page["_scroll_id"], scroll="5m",
                                         request_timeout=settings.request_timeout_s)
                try:
                    client.clear_scroll(scroll_id=page["_scroll_id"])
                except Exception:  # noqa: BLE001 - the scroll expires on its own
                    pass
        finally:
            client.close()

    schema = T.StructType([T.StructField(ID, T.StringType(), False)])
    rdd = spark.sparkContext.parallelize(range(slices), slices).mapPartitions(scroll)
    return spark.createDataFrame(rdd, schema)


def delete_missing(settings: OpenSearchSinkSettings, exported: DataFrame, version: int) -> WriteSummary:
    """Delete every document of the index that ``exported`` (a resync export) did not write.

    ``version`` (the export's) outranks the old line's versions, so the deletes apply and their
    tombstones refuse a late write of the old line."""
    spark = exported.sparkSession
    client = settings.client()
    try:
        client.indices.refresh(index=settings.index)
    finally:
        client.close()
    slices = max(1, min(8, spark.sparkContext.defaultParallelism))
    present = index_ids(settings, spark, slices)
    written = exported.select(F.col(b.DOCUMENT_ID).cast("string").alias(ID))
    stale = present.join(written, ID, "left_anti").select(
        ID, F.lit(b.DELETE_ACTION).alias(ACTION), F.lit(version).cast("long").alias(VERSION),
        F.lit(None).cast("string").alias(SOURCE))
    return write_bulk_rows(settings, stale)


class OpenSearchSink:
    """Implements :class:`icecdc_dagster.sinks.base.Sink` for one index."""

    def __init__(self, settings: OpenSearchSinkSettings, source_schema: Schema, name: str | None = None) -> None:
        self.settings = settings
        self.source_schema = source_schema
        self.name = name or f"opensearch/{settings.index}"
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

    def read_checkpoint(self) -> Checkpoint | None:
        return cp.read_checkpoint(self.client, self.settings.index, self.name)

    def desired_mapping(self, schema: Schema) -> dict[str, Any]:
        return iceberg_schema_to_mapping(schema, self.settings.include_iceberg_metadata)

    def ensure_index(self, schema: Schema | None = None) -> None:
        """Create the index if missing; map columns it does not know yet (schema evolution)."""
        from opensearchpy.exceptions import RequestError

        schema = schema or self.source_schema
        index, client = self.settings.index, self.client
        derived = self.desired_mapping(schema)
        if not client.indices.exists(index=index):
            body: dict[str, Any] = {}
            if self.settings.template_name:
                self._check_template()
            else:
                body["mappings"] = self.settings.mapping or derived
            if self.settings.index_settings:
                body["settings"] = self.settings.index_settings
            try:
                client.indices.create(index=index, body=body)
            except RequestError as exc:
                if exc.error != "resource_already_exists_exception":
                    raise
        if not self.settings.evolve_mapping:
            return
        current = cp.index_mappings(client, index) or {}
        additions = missing_properties(derived, current)
        if additions:
            client.indices.put_mapping(index=index, body={"properties": additions})

    def _check_template(self) -> None:
        name, indices = self.settings.template_name, self.client.indices
        if not (indices.exists_index_template(name=name) or indices.exists_template(name=name)):
            raise ConfigError(f"{self.name}: index template {name!r} for index {self.settings.index} does not exist")

    def apply(self, batch: BatchInfo, events: DataFrame) -> ApplyResult:
        started = time.monotonic()
        before = self.read_checkpoint()
        if decide(self.name, before, batch) is Decision.ALREADY_APPLIED:
            return ApplyResult(self.name, skipped=True, checkpoint=before,
                               details={"index": self.settings.index})
        self.ensure_index()
        offset = version_offset(batch.line)
        if offset:  # a resync line outranks every version the old line wrote (see lifecycle)
            events = events.withColumn(b.COMMIT_SEQUENCE_NUMBER, F.col(b.COMMIT_SEQUENCE_NUMBER) + F.lit(offset))
        prepared = prepare_events(events, batch.identifier_columns, self.settings.include_iceberg_metadata,
                                  batch.table_name, batch.snapshot_id, self.name)
        summary = write_events(self.settings, prepared)
        if summary.ok and batch.resyncs_target:
            # Converge: every document the export did not write belongs to rows the table no longer has.
            stale = delete_missing(self.settings, prepared, offset + batch.sequence_number)
            summary.merge(stale, self.settings.max_reported_failures)
            summary.counts["stale_deleted"] = stale.counts.get(DELETED, 0)
        if not summary.ok:
            # Every action answered and some were rejected: the same batch is rejected again (terminal).
            # A partition stopped because the cluster did not answer: it may later (transient).
            unavailable = summary.fatal and not summary.counts[FAILED]
            error = SinkUnavailableError if unavailable else SinkWriteError
            raise error(self._failure_message(batch, before, summary))
        if self.settings.refresh is True:
            self.client.indices.refresh(index=self.settings.index)
        # The guard ran before the writes; a concurrent run may have moved the checkpoint since.
        now = self.read_checkpoint()
        if now != before:
            raise CheckpointError(
                f"{self.name}: checkpoint of index {self.settings.index} moved from {before} to {now} while "
                f"snapshot {batch.snapshot_id} of {batch.table_name} was applied; not overwriting it")
        checkpoint = cp.write_checkpoint(self.client, self.settings.index, self.name, batch)
        return ApplyResult(
            self.name, skipped=False, checkpoint=checkpoint,
            counts={**summary.counts, "actions": summary.actions},
            details={"index": self.settings.index, "partitions": summary.partitions,
                     "seconds": round(time.monotonic() - started, 3)})

    def _failure_message(self, batch: BatchInfo, before: Checkpoint | None, summary: WriteSummary) -> str:
        where = (f"{self.name}: snapshot {batch.snapshot_id} of {batch.table_name} was not fully applied to "
                 f"index {self.settings.index}")
        parts = [where, f"{summary.counts[FAILED]} of {summary.actions} actions failed"]
        if summary.fatal:
            parts.append(f"{len(summary.fatal)} partition(s) stopped: {summary.fatal[0]}")
        if summary.reasons:
            parts.append("first reasons: " + "; ".join(summary.reasons))
        parts.append(f"checkpoint left at {before.snapshot_id if before else 'none'}; rerun the batch once fixed")
        return " | ".join(parts)
