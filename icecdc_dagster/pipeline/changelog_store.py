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
"""

from typing import TYPE_CHECKING
from dataclasses import dataclass

from icecdc_dagster.batch import CHANGE_TYPE, LAST_UPDATED_SEQUENCE_NUMBER, ROW_ID, BatchInfo
from icecdc_dagster.column_names import column
from icecdc_dagster.errors import ChangelogError
from icecdc_dagster.pipeline.observed import observe_change_counts
from icecdc_dagster.writer.exactly_once import java_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql import SparkSession

BATCH_SNAPSHOT_ID = "_batch_snapshot_id"
BATCH_FIRST_SNAPSHOT_ID = "_batch_first_snapshot_id"
BATCH_COLUMNS = (BATCH_SNAPSHOT_ID, BATCH_FIRST_SNAPSHOT_ID)
SOURCE_ROW_ID = "_source_row_id"
SOURCE_LAST_UPDATED_SEQUENCE_NUMBER = "_source_last_updated_sequence_number"
STORED_LINEAGE = {ROW_ID: SOURCE_ROW_ID, LAST_UPDATED_SEQUENCE_NUMBER: SOURCE_LAST_UPDATED_SEQUENCE_NUMBER}


def changelog_table_name(source_table_name: str) -> str:
    return f"{source_table_name}__changelog"


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

    def _exists(self) -> bool:
        return self.spark.catalog.tableExists(self.spark_name)

    def write(self, batch: BatchInfo, rows: "DataFrame") -> StoredBatch:
        from pyspark.sql import functions as F

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
        if not self._exists():
            (rows.writeTo(self.spark_name)
             .partitionedBy(F.col(BATCH_SNAPSHOT_ID))
             .tableProperty("format-version", "2")
             .tableProperty("write.spark.accept-any-schema", "true")
             .option("snapshot-property.icecdc.batch-id", batch_id)
             .create())
        else:
            rows = self._in_table_order(rows)
            (rows.writeTo(self.spark_name)
             .option("mergeSchema", "true")
             .option("snapshot-property.icecdc.batch-id", batch_id)
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
        from pyspark.sql import functions as F

        return self.spark.table(self.spark_name).where(F.col(BATCH_SNAPSHOT_ID) == F.lit(batch.snapshot_id))

    def read(self, batch: BatchInfo) -> "DataFrame":
        """The batch's change rows, as the engine produced them (lineage columns under their own names)."""
        rows = self._stored(batch).drop(*BATCH_COLUMNS)
        for engine_name, stored_name in STORED_LINEAGE.items():
            if stored_name in rows.columns:
                rows = rows.withColumnRenamed(stored_name, engine_name)
        return rows

    def read_events(self, batch: BatchInfo, use_row_id: bool) -> "DataFrame":
        """The CDC events sinks apply: one per document id, the latest image; UPDATE_BEFORE dropped.

        ``use_row_id``: the source has v3 row lineage and no identifier columns (ids are ``_row_id``).
        """
        from icecdc_dagster.changelog import to_events

        return to_events(self.read(batch), batch.table_name, batch.identifier_columns, batch.operation,
                         batch.snapshot_id, use_row_id=use_row_id)

    def counts(self, batch: BatchInfo) -> dict[str, int]:
        """Rows per change type of one batch (an aggregate, read back from the stored batch)."""
        if not self._exists():
            return {}
        grouped = self._stored(batch).groupBy(CHANGE_TYPE).count().collect()
        return {row[CHANGE_TYPE]: int(row["count"]) for row in grouped}
