"""The persisted changelog: one Iceberg table of change rows per source table (``<table>__changelog``).

Every sink and every analyst reads the same batch from here. It holds the FULL change rows: all
four change types (both images of an update), the change columns (``_change_type``,
``_commit_snapshot_id``, ``_commit_sequence_number``, ``_change_ordinal``, ``_commit_timestamp``)
and the batch columns. Sinks get CDC events derived at read time (:meth:`ChangelogStore.read_events`:
one event per document id, UPDATE_BEFORE dropped), so what is stored never depends on a sink.

A batch is written with an atomic overwrite of its own rows (``_batch_snapshot_id``), so a retried
or repeated run replaces the batch instead of duplicating it.

v3 row lineage is stored as ``_source_row_id`` / ``_source_last_updated_sequence_number``: Iceberg
refuses to scan a table whose data columns carry its reserved metadata names (``_row_id``, ...).
Reads give the engine's names back.

The store follows the source by field id (``writer.field_ids``): a source rename renames the store's
column, a widening widens it, an addition adds it (nested too); a dropped source column is kept as
``<name>__dropped_<source field id>`` because older batches still hold its values. A batch is read back
by field id in the source schema of its snapshot (``BatchInfo.schema_id``), whatever the store's
column names are now: a sink that applies a batch stored before a rename gets the names of that time.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from icecdc_dagster.batch import CHANGE_COLUMNS, CHANGE_TYPE, LAST_UPDATED_SEQUENCE_NUMBER, ROW_ID, BatchInfo
from icecdc_dagster.changelog import to_events
from icecdc_dagster.changelog.observed import observe_change_counts
from icecdc_dagster.column_names import column
from icecdc_dagster.errors import ChangelogError, resync_command
from icecdc_dagster.writer import (
    FIELD_MAP_PROPERTY,
    SourceSchemas,
    align_by_name,
    column_ranges,
    columns_by_field_id,
    encode_mapping,
    fields_by_id,
    follow_source_schema,
    infer_mapping,
    java_table,
    load_mapping,
    schema_of,
)

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyspark.sql import DataFrame, SparkSession

BATCH_SNAPSHOT_ID = "_batch_snapshot_id"
BATCH_FIRST_SNAPSHOT_ID = "_batch_first_snapshot_id"
BATCH_COLUMNS = (BATCH_SNAPSHOT_ID, BATCH_FIRST_SNAPSHOT_ID)
SOURCE_ROW_ID = "_source_row_id"
SOURCE_LAST_UPDATED_SEQUENCE_NUMBER = "_source_last_updated_sequence_number"
STORED_LINEAGE = {ROW_ID: SOURCE_ROW_ID, LAST_UPDATED_SEQUENCE_NUMBER: SOURCE_LAST_UPDATED_SEQUENCE_NUMBER}
OWN_COLUMNS = (*CHANGE_COLUMNS, *BATCH_COLUMNS, *STORED_LINEAGE.values())  # the store's, not the source's
SOURCE_SCHEMA_SUMMARY = "icecdc.source-schema-id"
Ranges = dict[str, tuple[Any, Any]]  # column name -> (min, max)


def changelog_table_name(source_table_name: str) -> str:
    return f"{source_table_name}__changelog"


@dataclass(frozen=True)
class _BatchView:
    """What reading one stored batch needs: the store's Java table and schema, the source schema the batch is
    presented in, and store field id -> source field id."""

    jtable: Any
    stored: "Schema"
    want: "Schema"
    mapping: dict[int, int]
    keys: tuple[str, ...] = ()  # the batch's identifier columns, named as in ``want``


@dataclass(frozen=True)
class StoredBatch:
    table_name: str
    snapshot_id: int | None  # the changelog table's snapshot after the write
    counts: dict[str, int]  # stored rows per change type (UPDATE_BEFORE included)

    @property
    def rows(self) -> int:
        return sum(self.counts.values())


class ChangelogStore:
    def __init__(self, spark: "SparkSession", catalog_name: str, source_table_name: str) -> None:
        self.spark = spark
        self.catalog_name = catalog_name
        self.table_name = changelog_table_name(source_table_name)
        self.spark_name = f"{catalog_name}.{self.table_name}"
        self.source_table_name = source_table_name

    def _source(self) -> SourceSchemas:
        return SourceSchemas(self.spark, java_table(self.spark, f"{self.catalog_name}.{self.source_table_name}"))

    def _mapping(self, jtable: Any, stored: "Schema", wanted: "Schema") -> dict[int, int]:
        """Store field id -> source field id: recorded, else matched once by name (a store written by an
        earlier version; the column holding a current name wins, a stale duplicate is left unmapped)."""
        recorded = load_mapping(jtable)
        if recorded is not None:
            return recorded
        data = [f.field_id for f in stored.fields if f.name not in OWN_COLUMNS]
        nested = [tid for tid, loc in fields_by_id(stored).items() if loc.path[0] not in OWN_COLUMNS]
        return infer_mapping(stored, [wanted, *self._source().history], only=set(data) | set(nested)).mapping

    def _exists(self) -> bool:
        return self.spark.catalog.tableExists(self.spark_name)

    def write(self, batch: BatchInfo, rows: "DataFrame", schema: "Schema | None" = None) -> StoredBatch:
        """Store the batch's change rows. ``schema``: the source schema the rows were read with (the
        source's current schema when the batch was computed; None: the source's current schema now)."""
        for engine_name, stored_name in STORED_LINEAGE.items():
            if stored_name in rows.columns:
                raise ChangelogError(f"table {batch.table_name} has a column named {stored_name}, which the changelog "
                                 f"{self.table_name} uses for the source's {engine_name}")
            if engine_name in rows.columns:
                rows = rows.withColumnRenamed(engine_name, stored_name)
        rows = (rows.withColumn(BATCH_SNAPSHOT_ID, F.lit(batch.snapshot_id).cast("long"))
                .withColumn(BATCH_FIRST_SNAPSHOT_ID, F.lit(batch.first_snapshot_id).cast("long")))
        # Counted by the write's own tasks (no aggregation job reading the batch back).
        rows, observed = observe_change_counts(rows)
        batch_id = f"{batch.table_name}@{batch.first_snapshot_id}-{batch.snapshot_id}"
        read_with = schema if schema is not None else self._source().current
        if not self._exists():
            (rows.writeTo(self.spark_name)
             .partitionedBy(F.col(BATCH_SNAPSHOT_ID))
             .tableProperty("format-version", "2")
             .tableProperty("write.spark.accept-any-schema", "true")
             .option("snapshot-property.icecdc.batch-id", batch_id)
             .option(f"snapshot-property.{SOURCE_SCHEMA_SUMMARY}", str(read_with.schema_id))
             .create())
            jtable = java_table(self.spark, self.spark_name)
            created = schema_of(self.spark, jtable.schema())
            mapping = encode_mapping(align_by_name(created, read_with))
            jtable.updateProperties().set(FIELD_MAP_PROPERTY, mapping).commit()
        else:
            rows = self._in_table_order(self._as_stored(batch, rows, read_with))
            (rows.writeTo(self.spark_name)
             .option("mergeSchema", "true")
             .option("snapshot-property.icecdc.batch-id", batch_id)
             .option(f"snapshot-property.{SOURCE_SCHEMA_SUMMARY}", str(read_with.schema_id))
             # Every row of the batch is in one partition (its _batch_snapshot_id): no shuffle to
             # cluster rows by partition first (one Spark job less per batch).
             .option("distribution-mode", "none")
             .overwrite(F.col(BATCH_SNAPSHOT_ID) == F.lit(batch.snapshot_id)))
        counts = observed.get()
        if counts is None:  # Spark did not report the metrics: count the stored batch instead
            counts = self.counts(batch)
        # The line is the table's only writer: its current snapshot is the one just committed.
        current = java_table(self.spark, self.spark_name).currentSnapshot()
        return StoredBatch(self.table_name, int(current.snapshotId()) if current is not None else None, counts)

    def _as_stored(self, batch: BatchInfo, rows: "DataFrame", read_with: "Schema") -> "DataFrame":
        """Follow the source (by field id) to the schema the rows were read with, then present the rows'
        data columns under the store's field names and types (nested fields matched by id too)."""
        jtable = java_table(self.spark, self.spark_name)
        stored = schema_of(self.spark, jtable.schema())
        recorded = load_mapping(jtable)
        mapping = self._mapping(jtable, stored, read_with)

        def describe(cause: str) -> str:
            return (f"changelog {self.table_name} cannot follow {batch.table_name} at snapshot {batch.snapshot_id}: "
                    f"{cause}; recover with {resync_command(batch.table_name)}")

        evolution = follow_source_schema(self.spark, jtable, read_with, mapping, recorded, drop=False,
                                         describe=describe)
        jtable.refresh()
        stored = schema_of(self.spark, jtable.schema())
        read_ids = {f.field_id for f in read_with.fields}
        data = [f for f in stored.fields if evolution.mapping.get(f.field_id) in read_ids]
        columns = columns_by_field_id(data, read_with, evolution.mapping, missing_as_null=False)
        source_names = {f.name for f in read_with.fields}
        return rows.select(*columns, *[column(c) for c in rows.columns if c not in source_names])

    def _in_table_order(self, rows: "DataFrame") -> "DataFrame":
        """Existing columns in the table's order, new ones (source schema evolution) last.

        Iceberg checks column order on write; a column added to the source lands
        before our batch columns in the rows, but after them in the table.
        """
        existing = [field.name for field in self.spark.table(self.spark_name).schema.fields]
        present = set(rows.columns)
        ordered = [c for c in existing if c in present]
        return rows.select(*[column(c) for c in ordered], *[column(c) for c in rows.columns if c not in set(existing)])

    def _stored(self, batch: BatchInfo) -> "DataFrame":
        return self.spark.table(self.spark_name).where(F.col(BATCH_SNAPSHOT_ID) == F.lit(batch.snapshot_id))

    def read(self, batch: BatchInfo, schema: "Schema | None" = None) -> "DataFrame":
        """The batch's change rows, as the engine produced them (lineage columns under their own names),
        presented by field id in ``schema`` (None: the source schema of the batch's snapshot)."""
        if schema is None:
            return self._read_as(batch, self._view(batch))
        jtable = java_table(self.spark, self.spark_name)
        stored = schema_of(self.spark, jtable.schema())
        return self._read_as(batch, _BatchView(jtable, stored, schema, self._mapping(jtable, stored, schema)))

    def _view(self, batch: BatchInfo) -> "_BatchView":
        """The store and the batch's source schema, loaded now (the store's columns follow the source)."""
        jtable = java_table(self.spark, self.spark_name)
        stored = schema_of(self.spark, jtable.schema())
        source = self._source()
        want = source.of(batch.schema_id)
        keys = _names_in(source.current, want, batch.identifier_columns) if batch.schema_id is not None \
            else batch.identifier_columns
        return _BatchView(jtable, stored, want, self._mapping(jtable, stored, want), keys)

    def _read_as(self, batch: BatchInfo, view: "_BatchView") -> "DataFrame":
        store_of = {sid: tid for tid, sid in view.mapping.items()}
        rows = self._stored(batch)
        own = [column(c) for c in rows.columns if c in OWN_COLUMNS and c not in BATCH_COLUMNS]
        rows = rows.select(*columns_by_field_id(view.want.fields, view.stored, store_of), *own)
        for engine_name, stored_name in STORED_LINEAGE.items():
            if stored_name in rows.columns:
                rows = rows.withColumnRenamed(stored_name, engine_name)
        return rows

    def read_events(self, batch: BatchInfo, use_row_id: bool) -> "DataFrame":
        """The CDC events sinks apply: one per document id, the latest image; UPDATE_BEFORE dropped.

        ``use_row_id``: the source has v3 row lineage and no identifier columns (ids are ``_row_id``).
        """
        return self._events(batch, self._view(batch), use_row_id)

    def events_and_ranges(self, batch: BatchInfo, use_row_id: bool
                          ) -> tuple["DataFrame", Callable[[Sequence[str]], Ranges | None]]:
        """:meth:`read_events` and :meth:`column_ranges` of one batch from one load of the store and the source
        (two catalog loads fewer per batch than calling both): what a sink's step applies, with its bounds."""
        view = self._view(batch)
        return self._events(batch, view, use_row_id), partial(self._ranges, batch, view)

    def _events(self, batch: BatchInfo, view: "_BatchView", use_row_id: bool) -> "DataFrame":
        # An export's keys were checked when it was computed (one row per key): no ranking.
        return to_events(self._read_as(batch, view), batch.table_name, view.keys, batch.operation,
                         batch.snapshot_id, use_row_id=use_row_id, unique_ids=batch.is_export)

    def column_ranges(self, batch: BatchInfo, columns: Sequence[str]) -> Ranges | None:
        """min and max of each of ``columns`` (named as :meth:`read_events` names them) over the stored batch,
        from its data files' statistics: a sink bounds its write by them without an aggregate over the events
        (:func:`writer.column_ranges`). None where the statistics cannot tell: the caller aggregates instead.

        Raises:
            pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the store or the source cannot be
                loaded, or the store's manifests read (passes through).
        """
        return self._ranges(batch, self._view(batch), columns)

    def _ranges(self, batch: BatchInfo, view: "_BatchView", columns: Sequence[str]) -> Ranges | None:
        store_of = {sid: tid for tid, sid in view.mapping.items()}
        wanted = {f.name: f.field_id for f in view.want.fields}
        stored_fields = {f.field_id: f for f in view.stored.fields}
        fields = {name: stored_fields.get(store_of.get(wanted.get(name, -1), -1)) for name in columns}
        if any(f is None for f in fields.values()):
            return None
        jvm: Any = self.spark._jvm  # noqa: SLF001 - the session's JVM, as java_table uses it
        in_batch = jvm.org.apache.iceberg.expressions.Expressions.equal(BATCH_SNAPSHOT_ID, batch.snapshot_id)
        return column_ranges(jvm, view.jtable, in_batch, {k: f for k, f in fields.items() if f is not None})

    def counts(self, batch: BatchInfo) -> dict[str, int]:
        """Rows per change type of one batch (an aggregate, read back from the stored batch)."""
        if not self._exists():
            return {}
        grouped = self._stored(batch).groupBy(CHANGE_TYPE).count().collect()
        return {row[CHANGE_TYPE]: int(row["count"]) for row in grouped}


def _names_in(current: "Schema", wanted: "Schema", names: tuple[str, ...]) -> tuple[str, ...]:
    """Top-level column names of the current schema, as the same field ids are named in ``wanted``
    (identifier columns of a batch read before they were renamed)."""
    ids = {f.name: f.field_id for f in current.fields}
    by_id = {f.field_id: f.name for f in wanted.fields}
    return tuple(by_id.get(ids.get(n, -1), n) for n in names)
