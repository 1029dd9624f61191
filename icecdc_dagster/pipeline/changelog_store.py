"""The persisted changelog: one Iceberg table of CDC events per source table.

Every sink and every analyst reads the same batch from here. A batch is
written with an atomic overwrite of its own rows (``_batch_snapshot_id``), so a
retried or repeated run replaces the batch instead of duplicating it.
"""

from dataclasses import dataclass

from icecdc_dagster.batch import CHANGE_TYPE, BatchInfo

BATCH_SNAPSHOT_ID = "_batch_snapshot_id"
BATCH_FIRST_SNAPSHOT_ID = "_batch_first_snapshot_id"
BATCH_COLUMNS = (BATCH_SNAPSHOT_ID, BATCH_FIRST_SNAPSHOT_ID)


def changelog_table_name(source_table_name: str) -> str:
    return f"{source_table_name}__changelog"


@dataclass(frozen=True)
class StoredBatch:
    table_name: str
    snapshot_id: int | None  # the changelog table's snapshot after the write
    counts: dict[str, int]

    @property
    def rows(self) -> int:
        return sum(self.counts.values())


class ChangelogStore:
    def __init__(self, spark, catalog_name: str, source_table_name: str):  # noqa: ANN001
        self.spark = spark
        self.catalog_name = catalog_name
        self.table_name = changelog_table_name(source_table_name)
        self.spark_name = f"{catalog_name}.{self.table_name}"

    def _exists(self) -> bool:
        return self.spark.catalog.tableExists(self.spark_name)

    def write(self, batch: BatchInfo, events) -> StoredBatch:  # noqa: ANN001 - Spark DataFrame
        from pyspark.sql import functions as F

        rows = (events.withColumn(BATCH_SNAPSHOT_ID, F.lit(batch.snapshot_id).cast("long"))
                .withColumn(BATCH_FIRST_SNAPSHOT_ID, F.lit(batch.first_snapshot_id).cast("long")))
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
             .overwrite(F.col(BATCH_SNAPSHOT_ID) == F.lit(batch.snapshot_id)))
        counts = self.counts(batch)
        snapshot = self.spark.sql(
            f"SELECT snapshot_id FROM {self.spark_name}.snapshots ORDER BY committed_at DESC LIMIT 1").first()
        return StoredBatch(self.table_name, snapshot.snapshot_id if snapshot else None, counts)

    def _in_table_order(self, rows):  # noqa: ANN001, ANN202 - Spark DataFrame
        """Existing columns in the table's order, new ones (source schema evolution) last.

        Iceberg checks column order on write; a column added to the source lands
        before our batch columns in the events, but after them in the table.
        """
        existing = [field.name for field in self.spark.table(self.spark_name).schema.fields]
        present = set(rows.columns)
        ordered = [c for c in existing if c in present]
        return rows.select(*ordered, *[c for c in rows.columns if c not in set(existing)])

    def read(self, batch: BatchInfo):  # noqa: ANN201 - Spark DataFrame
        from pyspark.sql import functions as F

        events = self.spark.table(self.spark_name).where(F.col(BATCH_SNAPSHOT_ID) == F.lit(batch.snapshot_id))
        return events.drop(*BATCH_COLUMNS)

    def counts(self, batch: BatchInfo) -> dict[str, int]:
        """Rows per change type of one batch (an aggregate, read back from the stored batch)."""
        if not self._exists():
            return {}
        grouped = self.read(batch).groupBy(CHANGE_TYPE).count().collect()
        return {row[CHANGE_TYPE]: int(row["count"]) for row in grouped}
