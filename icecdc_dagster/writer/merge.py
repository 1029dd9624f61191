"""Apply one batch of row images to an Iceberg table: collapse per key, then one MERGE.

Input rows carry the table's columns plus ``_icecdc_op`` (upsert / delete / insert)
and ``_icecdc_order`` (position inside the batch). With key columns the batch is
collapsed per key (the last image wins, whatever came before it) and written with a
single ``MERGE INTO``: a last delete removes the key (a no-op when it is absent), a
last insert/upsert writes the row. Nothing is inferred from the first op of a key: input
is at-least-once (a re-delivered insert may open a key's run in a batch although the key
already exists), so "insert then delete" cannot be assumed to cancel. Spark's MERGE
honours the table's write modes and never writes equality deletes, so pyiceberg and
DuckDB still read the result. Without key columns the batch is append-only (the caller
dead-letters deletes).
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.writer.exactly_once import BATCH_ID_PROPERTY, is_committed, staged_commit

OP_COLUMN = "_icecdc_op"
ORDER_COLUMN = "_icecdc_order"
OP_UPSERT, OP_DELETE, OP_INSERT = "upsert", "delete", "insert"
_EXISTS = "_icecdc_exists"


@dataclass(frozen=True)
class WriteOutcome:
    table: str
    batch_id: str
    skipped: bool
    snapshot_id: int | None
    counts: dict[str, int] = field(default_factory=dict)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def collapse(rows: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """One row per key: the last image (highest order)."""
    by_key = Window.partitionBy(*[F.col(_quote(k)) for k in key_columns]).orderBy(F.col(ORDER_COLUMN).desc())
    return rows.withColumn("_icecdc_rank", F.row_number().over(by_key)).where("_icecdc_rank = 1").drop(
        "_icecdc_rank")


@dataclass(frozen=True)
class KeyBounds:
    """The batch's key range, as a filter on the target: lets a scan skip files whose key statistics miss it."""

    column: Column
    sql: str


_ORDERABLE = (T.IntegralType, T.StringType, T.DateType)


def key_bounds(batch: DataFrame, key_columns: Sequence[str], target: T.StructType) -> KeyBounds | None:
    """min..max of every orderable key column of ``batch`` (one small aggregate); None for an empty batch
    or keys without a plain order (Iceberg prunes data files by these bounds where the keys cluster)."""
    aggregates = bounds_aggregates(key_columns, target)
    if not aggregates:
        return None
    return bounds_from(batch.agg(*aggregates).first(), key_columns, target)


def bounds_aggregates(key_columns: Sequence[str], target: T.StructType) -> list[Column]:
    """The aggregates :func:`bounds_from` reads (so a caller can fold them into its own aggregate)."""
    usable = _orderable(key_columns, target)
    return ([F.min(F.col(_quote(k))).alias(f"_icecdc_lo{i}") for i, k in enumerate(usable)]
            + [F.max(F.col(_quote(k))).alias(f"_icecdc_hi{i}") for i, k in enumerate(usable)])


def bounds_from(row: Any, key_columns: Sequence[str], target: T.StructType) -> KeyBounds | None:
    usable = _orderable(key_columns, target)
    if not usable or row is None or row["_icecdc_lo0"] is None:
        return None
    types = {f.name: f.dataType for f in target.fields}
    column = F.lit(True)
    sql = []
    for i, k in enumerate(usable):
        lo, hi = (F.lit(row[f"_icecdc_{side}{i}"]).cast(types[k]) for side in ("lo", "hi"))
        column = column & F.col(_quote(k)).between(lo, hi)
        sql.append(f"t.{_quote(k)} BETWEEN {_sql(lo)} AND {_sql(hi)}")
    return KeyBounds(column, " AND ".join(sql))


def _orderable(key_columns: Sequence[str], target: T.StructType) -> list[str]:
    types = {f.name: f.dataType for f in target.fields}
    return [k for k in key_columns if isinstance(types.get(k), _ORDERABLE)]


def _sql(literal: Column) -> str:
    return str(literal._jc.expr().sql())  # noqa: SLF001 - Spark's own rendering of a literal (escapes, types)


def write_batch(spark: Any, table: str, rows: DataFrame, key_columns: Sequence[str], batch_id: str,
                properties: dict[str, str] | None = None, exact_counts: bool = True, ledger: bool = False,
                replace_all: bool = False, bounds: KeyBounds | None = None) -> WriteOutcome:
    """Write ``rows`` to ``table`` (full Spark name) once: skipped when ``batch_id`` is already in main's history.

    Counts: inserted / updated / deleted (keys that existed) / delete_missing (last op a delete of a
    key the table does not hold: nothing to do), or appended for key-less tables.
    ``exact_counts`` joins the batch's keys with the table's keys to split these counts.
    ``ledger``: keep the batch id in the table's ledger property too (survives snapshot expiry).
    ``bounds``: the batch's key range when the caller has it already (else one aggregate finds it).
    ``replace_all``: the batch is the table's whole new content (a resync export): one overwrite
    replaces every row, so rows the batch does not hold are gone (counts: ``replaced``).
    """
    if is_committed(spark, table, batch_id, ledger):
        return WriteOutcome(table, batch_id, True, None, {})
    target_columns = [f.name for f in spark.table(table).schema.fields]
    data_columns = [c for c in rows.columns if c in target_columns]
    props = {**(properties or {}), BATCH_ID_PROPERTY: batch_id}
    if replace_all:
        content = (collapse(rows, key_columns) if key_columns else rows).where(F.col(OP_COLUMN) != OP_DELETE)
        content = content.select(*data_columns)

        def overwrite(name: str) -> None:
            content.writeTo(name).overwrite(F.lit(True))

        _, snapshot_id = staged_commit(spark, table, props, overwrite, ledger)
        count = int(spark.sql(f"SELECT summary['total-records'] FROM {table}.snapshots "
                              f"WHERE snapshot_id = {snapshot_id}").first()[0] or 0)
        return WriteOutcome(table, batch_id, False, snapshot_id, {"replaced": count})
    if not key_columns:
        appended = rows.where(F.col(OP_COLUMN) != OP_DELETE).select(*data_columns)

        def append(name: str) -> int:
            appended.writeTo(name).append()
            return 0

        _, snapshot_id = staged_commit(spark, table, props, append, ledger)
        count = int(spark.sql(f"SELECT summary['added-records'] FROM {table}.snapshots "
                              f"WHERE snapshot_id = {snapshot_id}").first()[0] or 0)
        return WriteOutcome(table, batch_id, False, snapshot_id, {"appended": count})

    effective = collapse(rows, key_columns).persist()
    try:
        counts: dict[str, int] = {}
        bounds = bounds or key_bounds(effective, key_columns, spark.table(table).schema)
        if exact_counts:
            keys = spark.table(table).where(bounds.column if bounds else F.lit(True)).select(
                *[F.col(_quote(k)) for k in key_columns]).withColumn(_EXISTS, F.lit(True))
            grouped = (effective.join(keys, list(key_columns), "left")
                       .groupBy(OP_COLUMN, F.col(_EXISTS).isNotNull().alias("e")).count().collect())
            for op, exists, n in grouped:
                name = ("deleted" if exists else "delete_missing") if op == OP_DELETE else (
                    "updated" if exists else "inserted")
                counts[name] = counts.get(name, 0) + n
        view = f"icecdc_batch_{abs(hash((table, batch_id))) % 10**12}"
        effective.createOrReplaceTempView(view)
        # The bounds are the batch's own: a target row outside them matches no batch row, so they change
        # nothing but the files the MERGE reads (pruned by their column statistics).
        on = " AND ".join([f"t.{_quote(k)} = s.{_quote(k)}" for k in key_columns] + ([bounds.sql] if bounds else []))
        sets = ", ".join(f"t.{_quote(c)} = s.{_quote(c)}" for c in data_columns if c not in key_columns)
        cols = ", ".join(_quote(c) for c in data_columns)
        vals = ", ".join(f"s.{_quote(c)}" for c in data_columns)
        update = f"WHEN MATCHED THEN UPDATE SET {sets} " if sets else ""

        def merge(name: str) -> None:
            spark.sql(f"MERGE INTO {name} t USING {view} s ON {on} "
                      f"WHEN MATCHED AND s.{OP_COLUMN} = '{OP_DELETE}' THEN DELETE "
                      f"{update}"
                      f"WHEN NOT MATCHED AND s.{OP_COLUMN} <> '{OP_DELETE}' THEN INSERT ({cols}) VALUES ({vals})")

        _, snapshot_id = staged_commit(spark, table, props, merge, ledger)
        spark.catalog.dropTempView(view)
        return WriteOutcome(table, batch_id, False, snapshot_id, counts)
    finally:
        effective.unpersist()
