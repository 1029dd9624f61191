"""The ``equality_deletes`` write mode: one batch as data files + equality deletes, never reading the target.

The batch is collapsed per key like a MERGE batch (:func:`merge.collapse`: the last image wins). Every key
of the batch then gets an equality delete on the identifier columns, so whatever image an older snapshot
holds is deleted, and every key whose last op is not a delete also gets its last image as a data row.
Both go into ONE row-delta snapshot. Iceberg applies an equality delete only to data files of a LOWER
sequence number, so the rows that same commit adds survive it. The files are written on the executors by
Iceberg's own Parquet writers (``EqualityDeltaWriter.java``: Spark cannot write equality deletes), and
the commit goes through :func:`exactly_once.staged_commit` like a MERGE: the batch id and the ledger
are recorded in the same way, so a re-run skips the batch.

What it costs readers: every reader must apply the equality deletes (Spark, Trino, Flink do; pyiceberg
0.12 refuses such tables) until the maintenance asset compacts them (``rewrite_data_files`` by the
delete-file threshold). Partitioned targets: an equality delete reaches only data files of its own
partition, so every partition source column must be an identifier column (a key's old and new image
then share a partition); transforms identity, bucket, truncate, year, month, day, hour and void.
"""

import re
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from icecdc_dagster.errors import CommitDeclinedError, EqualityDeleteTargetError
from icecdc_dagster.runtime.equality_writer import equality_delta_writer
from icecdc_dagster.runtime.java import jvm
from icecdc_dagster.writer.exactly_once import (
    BATCH_ID_PROPERTY,
    STAGING_BRANCH,
    LedgerRetention,
    is_committed,
    java_table,
    staged_commit,
)
from icecdc_dagster.writer.merge import OP_COLUMN, OP_DELETE, WriteOutcome, collapse, write_batch

MERGE, EQUALITY_DELETES = "merge", "equality_deletes"
WRITE_MODES = (MERGE, EQUALITY_DELETES)
DELETE_FLAG = "_icecdc_is_delete"
COUNTED_BY_BATCH = "batch"  # WriteOutcome.counted_by: from the batch alone (the target is never read)
SUPPORTED_TRANSFORMS = re.compile(r"^(identity|bucket\[\d+\]|truncate\[\d+\]|year|month|day|hour|void)$")


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def check_target(jtable: Any, table: str, key_columns: Sequence[str]) -> None:
    """Refuse a target the mode would write wrongly, naming the table and what to change."""
    version = int(jtable.operations().current().formatVersion())
    if version < 2:
        raise EqualityDeleteTargetError(f"{table}: write_mode equality_deletes needs format-version 2 or later "
                                        f"(the table has {version}): ALTER TABLE {table} SET TBLPROPERTIES "
                                        "('format-version'='2')")
    for prop in ("write.format.default", "write.delete.format.default"):
        fmt = str(jtable.properties().get(prop) or "parquet").lower()
        if fmt != "parquet":
            raise EqualityDeleteTargetError(f"{table}: write_mode equality_deletes writes Parquet only ({prop}={fmt})")
    spec = jtable.spec()
    if not spec.isPartitioned():
        return
    if int(jtable.specs().size()) > 1:
        raise EqualityDeleteTargetError(
            f"{table}: write_mode equality_deletes needs a table with one partition spec (an equality delete "
            "reaches only data files of its own spec and partition); the table has "
            f"{int(jtable.specs().size())}: rewrite it under its current spec, or use write_mode merge")
    schema = jtable.schema()
    for field in spec.fields():
        transform = str(field.transform().toString())
        source = str(schema.findColumnName(field.sourceId()))
        if not SUPPORTED_TRANSFORMS.match(transform):
            raise EqualityDeleteTargetError(f"{table}: partition transform {transform}({source}) is not supported "
                                            "by write_mode equality_deletes (identity, bucket, truncate, year, "
                                            "month, day, hour, void are)")
        if source not in key_columns:
            raise EqualityDeleteTargetError(
                f"{table}: partition field {field.name()} = {transform}({source}) is not over an identifier column "
                f"({', '.join(key_columns)}); an equality delete reaches only its own partition, so a key whose "
                f"{source} changed would keep its old row: add {source} to identifier_columns or use write_mode "
                "merge")


def delta_rows(rows: DataFrame, key_columns: Sequence[str], target: Any) -> DataFrame:
    """The collapsed batch in the writer's shape: the table's columns in table order (absent ones null),
    then ``DELETE_FLAG`` (the key's last op is a delete: an equality delete only)."""
    effective = collapse(rows, key_columns)
    present = set(effective.columns)
    columns = [F.col(_quote(f.name)) if f.name in present else F.lit(None).cast(f.dataType).alias(f.name)
               for f in target.fields]
    return effective.select(*columns, (F.col(OP_COLUMN) == OP_DELETE).alias(DELETE_FLAG))


def write_equality_delta(spark: Any, table: str, rows: DataFrame, key_columns: Sequence[str], batch_id: str,
                         properties: dict[str, str] | None = None, ledger: bool = False,
                         retention: LedgerRetention | None = None,
                         before_commit: Callable[[], bool] | None = None) -> WriteOutcome:
    """Write ``rows`` (table columns + op + order) to ``table`` once as one row delta; skipped when
    ``batch_id`` is already recorded. Counts (from the batch, the target is not read): ``upserted`` (data
    rows written) and ``delete_keys`` (keys whose last op is a delete; whether the table held them is not
    known). A key-less table takes the batch as an append, as in ``merge`` mode.

    ``before_commit``: asked once the files are written (what ``rows`` observes has arrived: the write is
    one SQL execution of it) and before they are committed; False declines the batch (``CommitDeclinedError``).
    Why: a caller can write rows it has not computed before, and commit them only if they turn out whole.

    Raises:
        CommitDeclinedError: ``before_commit`` said False (a keyed table; the files are deleted, nothing committed).
        EqualityDeleteTargetError: the target cannot take equality deletes as it is (format v1,
            a partition column outside the key, ...): ``write_mode: merge`` always works.
        RuntimeSetupError: the Java writer cannot be compiled (no javac, no Iceberg runtime jar).
        StagingBranchLostError: the staging branch vanished before the publish (nothing published).
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Spark or Iceberg refused the write or its
            commit; nothing was published.
    """
    if not key_columns:
        if before_commit is not None:
            raise ValueError(f"{table}: before_commit needs identifier columns (a key-less batch is a MERGE append)")
        return write_batch(spark, table, rows, key_columns, batch_id, properties, ledger=ledger, retention=retention)
    if is_committed(spark, table, batch_id, ledger):
        return WriteOutcome(table, batch_id, True, None, {})
    check_target(java_table(spark, table), table, key_columns)
    frame = delta_rows(rows, key_columns, spark.table(table).schema)
    props = {**(properties or {}), BATCH_ID_PROPERTY: batch_id}
    writer = equality_delta_writer(spark)
    view = jvm(spark)

    def write(_branch_table: str) -> list[int]:
        keys = view.java.util.ArrayList()
        for k in key_columns:
            keys.add(k)
        summary = view.java.util.HashMap()
        for key, value in props.items():
            summary.put(key, str(value))
        pending = writer.writeFiles(frame._jdf, table, keys)  # noqa: SLF001 - the JVM Dataset
        if before_commit is not None and not before_commit():
            writer.abort(pending)
            raise CommitDeclinedError(f"{table}: batch {batch_id} declined before its commit")
        return [int(n) for n in str(writer.commit(pending, STAGING_BRANCH, summary)).split(",")]

    published = staged_commit(spark, table, props, write, ledger, retention)
    _, _, data_records, delete_records = published.result
    counts = {"upserted": data_records, "delete_keys": delete_records - data_records}
    return WriteOutcome(table, batch_id, False, published.snapshot_id, counts, COUNTED_BY_BATCH)
