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

from icecdc_dagster.writer.exactly_once import (
    BATCH_ID_PROPERTY,
    LedgerRetention,
    Published,
    is_committed,
    staged_commit,
)

OP_COLUMN = "_icecdc_op"
ORDER_COLUMN = "_icecdc_order"
OP_UPSERT, OP_DELETE, OP_INSERT = "upsert", "delete", "insert"
_EXISTS = "_icecdc_exists"
_DELETE_PREFIX = "_icecdc_del_"
_BROADCAST_DELETES = 1_000_000  # delete keys up to this many are broadcast to the count join
# WriteOutcome.counted_by: where the counts came from
COUNTED_BY_SUMMARY = "summary"                          # the commit's snapshot summary alone
COUNTED_BY_SUMMARY_AND_DELETES = "summary+delete-keys"  # + the batch's delete keys joined with the target
COUNTED_BY_JOIN = "join"                                # every key of the batch joined with the target


@dataclass(frozen=True)
class WriteOutcome:
    table: str
    batch_id: str
    skipped: bool
    snapshot_id: int | None
    counts: dict[str, int] = field(default_factory=dict)
    counted_by: str = ""  # COUNTED_BY_*: empty when nothing was counted


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


def bounds_aggregates(key_columns: Sequence[str], target: T.StructType, prefix: str = "_icecdc_",
                      where: Column | None = None) -> list[Column]:
    """The aggregates :func:`bounds_from` reads (so a caller can fold them into its own aggregate);
    ``where``: only over the rows it holds for (e.g. the batch's deletes).

    Raises:
        Nothing of its own: it builds aggregate expressions only.
    """
    usable = _orderable(key_columns, target)

    def value(k: str) -> Column:
        return F.col(_quote(k)) if where is None else F.when(where, F.col(_quote(k)))
    return ([F.min(value(k)).alias(f"{prefix}lo{i}") for i, k in enumerate(usable)]
            + [F.max(value(k)).alias(f"{prefix}hi{i}") for i, k in enumerate(usable)])


def bounds_from(row: Any, key_columns: Sequence[str], target: T.StructType,
                prefix: str = "_icecdc_") -> KeyBounds | None:
    """The key bounds of a batch from its aggregated row (None: no key column is orderable).

    Raises:
        Nothing of its own: it reads an aggregated row in memory.
    """
    usable = _orderable(key_columns, target)
    if not usable or row is None or row[f"{prefix}lo0"] is None:
        return None
    types = {f.name: f.dataType for f in target.fields}
    column = F.lit(True)
    sql = []
    for i, k in enumerate(usable):
        lo, hi = (F.lit(row[f"{prefix}{side}{i}"]).cast(types[k]) for side in ("lo", "hi"))
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
                replace_all: bool = False, bounds: KeyBounds | None = None,
                retention: LedgerRetention | None = None) -> WriteOutcome:
    """Write ``rows`` to ``table`` (full Spark name) once: skipped when ``batch_id`` is already in main's history.

    Counts: inserted / updated / deleted (keys that existed) / delete_missing (last op a delete of a
    key the table does not hold: nothing to do), or appended for key-less tables; exact, from the
    commit's own summary where that is provably exact (:func:`batch_counts`), else by a join of the
    batch's keys with the keys of the snapshot the MERGE read. ``exact_counts=False``: no counts.
    ``ledger``: keep the batch id in the table's ledger property too (survives snapshot expiry);
    ``retention``: the ledger's entries below its horizon are dropped in the same commit.
    ``bounds``: the batch's key range when the caller has it already (else one aggregate finds it).
    ``replace_all``: the batch is the table's whole new content (a resync export): one overwrite
    replaces every row, so rows the batch does not hold are gone (counts: ``replaced``).

    Raises:
        StagingBranchLostError: the staging branch vanished while the batch was written (an expiry ran
            on the table); nothing was published, running the batch again is safe.
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Spark or Iceberg refused the
            write (no such table, rows that do not fit its schema, a failed commit); nothing was published.
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

        published = staged_commit(spark, table, props, overwrite, ledger, retention)
        count = int(published.summary.get("total-records") or 0)
        return WriteOutcome(table, batch_id, False, published.snapshot_id, {"replaced": count}, COUNTED_BY_SUMMARY)
    if not key_columns:
        appended = rows.where(F.col(OP_COLUMN) != OP_DELETE).select(*data_columns)

        def append(name: str) -> None:
            appended.writeTo(name).append()

        published = staged_commit(spark, table, props, append, ledger, retention)
        count = int(published.summary.get("added-records") or 0)
        return WriteOutcome(table, batch_id, False, published.snapshot_id, {"appended": count}, COUNTED_BY_SUMMARY)

    effective = collapse(rows, key_columns).persist()
    try:
        schema = spark.table(table).schema
        is_delete = F.col(OP_COLUMN) == OP_DELETE
        stats = effective.agg(F.count(F.lit(1)).alias("_icecdc_rows"),
                              F.sum(is_delete.cast("long")).alias("_icecdc_deletes"),
                              *([] if bounds else bounds_aggregates(key_columns, schema)),
                              *bounds_aggregates(key_columns, schema, _DELETE_PREFIX, is_delete)).first()
        assert stats is not None, "an aggregate without grouping has one row"
        bounds = bounds or bounds_from(stats, key_columns, schema)
        deletes = int(stats["_icecdc_deletes"] or 0)
        upserts = int(stats["_icecdc_rows"] or 0) - deletes
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

        published = staged_commit(spark, table, props, merge, ledger, retention)
        spark.catalog.dropTempView(view)
        counts: dict[str, int] = {}
        counted_by = ""
        if exact_counts:
            delete_bounds = bounds_from(stats, key_columns, schema, _DELETE_PREFIX)
            counts, counted_by = batch_counts(spark, table, effective, key_columns, published, upserts, deletes,
                                              delete_bounds, bounds)
        return WriteOutcome(table, batch_id, False, published.snapshot_id, counts, counted_by)
    finally:
        effective.unpersist()


def records_delta(published: "Published[Any]") -> int | None:
    """inserted - deleted (keys) of a MERGE, read from its own snapshot summary; None where that is not exact.

    Every row a MERGE writes, rewrites or deletes shows in the summary: data files added and removed
    (``added-records`` / ``deleted-records``: whole files, so copy-on-write carry-over rows count on
    both sides) and position deletes added and removed. With L = data records - position-delete
    records = the live rows, a MERGE changes L by exactly (inserted keys - deleted keys), PROVIDED every
    position-delete record the commit adds or removes stands for one distinct live row. That holds when

    * the staged-on snapshot has no delete file at all (``total-delete-files`` = 0; or no snapshot):
      copy-on-write or merge-on-read, v2 or v3 — nothing older to rewrite, drop or fold in; or
    * v2 merge-on-read that removed no data file: Spark writes one position delete per matched live row
      (its scan hides deleted rows). With file granularity (Spark's default) it also rewrites a touched
      file's older file-scoped deletes into the new file and removes them: both sides of the summary,
      net zero (Iceberg-written delete files never hold a position twice). The only other delete files a
      commit removes are the ones no live data file can see any more (data sequence number below every
      live data file's), dropped by any commit and counted as removed: ruled out by the staged-on
      snapshot's manifest list (its delete files are no older than its oldest data file).

    Not exact, so None (the caller joins): v3 with live delete files (a deletion vector folds in older
    v2 partition-scoped deletes, which stay live: invisible in the summary), a possible drop of dangling
    deletes, equality deletes, a copy-on-write rewrite of files that had deletes (their deleted rows count
    in ``deleted-records``), summaries without position-delete counts (delete manifests appended whole),
    more than one snapshot per write.
    """
    summary, parent = published.summary, published.parent_summary

    def n(key: str) -> int:
        return int(summary.get(key) or 0)
    if not published.single_commit or n("added-equality-delete-files") or n("removed-equality-delete-files"):
        return None
    if (n("added-delete-files") and "added-position-deletes" not in summary) or (
            n("removed-delete-files") and "removed-position-deletes" not in summary):
        return None  # Iceberg left the delete counts out (delete manifests appended whole)
    clean = published.parent_id is None or (parent is not None and parent.get("total-delete-files") == "0")
    if not clean:
        if published.format_version != 2 or n("deleted-data-files"):
            return None
        if n("removed-delete-files") and not _no_dangling_deletes(published):
            return None
    return (n("added-records") - n("deleted-records")
            - n("added-position-deletes") + n("removed-position-deletes"))


def _no_dangling_deletes(published: "Published[Any]") -> bool:
    """Whether the staged-on snapshot's delete files are all at least as new as its oldest live data file
    (then no commit on it drops a delete file as dangling). Reads its manifest list only."""
    jtable = published.jtable
    parent = jtable.snapshot(published.parent_id)
    io = jtable.io()
    data = [int(m.minSequenceNumber()) for m in parent.dataManifests(io)]
    deletes = [int(m.minSequenceNumber()) for m in parent.deleteManifests(io)]
    if any(seq < 0 for seq in data + deletes):
        return False  # a manifest without an assigned sequence number: cannot tell
    return not deletes or (bool(data) and min(deletes) >= min(data))


def batch_counts(spark: Any, table: str, effective: DataFrame, key_columns: Sequence[str],
                 published: "Published[Any]", upserts: int, deletes: int, delete_bounds: KeyBounds | None,
                 bounds: KeyBounds | None) -> tuple[dict[str, int], str]:
    """inserted / updated / deleted / delete_missing of a published MERGE, and how they were counted.

    ``upserts`` (U) and ``deletes`` (D) are the collapsed batch's; the MERGE inserted I keys, updated
    U - I and deleted M of the D (the rest were absent). The summary gives I - M (:func:`records_delta`):
    with D = 0 that is I, and nothing is read; with D > 0, M comes from the batch's delete keys joined with
    the staged-on snapshot's keys (broadcast, bounded by the deletes' key range). Where the summary is not
    exact, every key of the batch is joined with that snapshot's keys. Both read the snapshot the MERGE
    read, so the counts are the MERGE's own."""
    delta = records_delta(published)
    if delta is not None:
        matched = 0
        if deletes:
            batch_deletes = effective.where(F.col(OP_COLUMN) == OP_DELETE).select(*[_quote(k) for k in key_columns])
            if deletes <= _BROADCAST_DELETES:
                batch_deletes = F.broadcast(batch_deletes)
            matched = _staged_keys(spark, table, key_columns, published, delete_bounds).join(
                batch_deletes, list(key_columns), "left_semi").count()
        inserted = delta + matched
        if 0 <= inserted <= upserts and matched <= deletes:
            counts = {"inserted": inserted, "updated": upserts - inserted, "deleted": matched,
                      "delete_missing": deletes - matched}
            return {k: v for k, v in counts.items() if v}, (COUNTED_BY_SUMMARY_AND_DELETES if deletes
                                                           else COUNTED_BY_SUMMARY)
        # out of range: the target held a key twice (identifier columns are not enforced); count by joining
    keys = _staged_keys(spark, table, key_columns, published, bounds).withColumn(_EXISTS, F.lit(True))
    grouped = (effective.join(keys, list(key_columns), "left")
               .groupBy(OP_COLUMN, F.col(_EXISTS).isNotNull().alias("e")).count().collect())
    counts = {}
    for op, exists, n in grouped:
        name = ("deleted" if exists else "delete_missing") if op == OP_DELETE else (
            "updated" if exists else "inserted")
        counts[name] = counts.get(name, 0) + n
    return counts, COUNTED_BY_JOIN


def _staged_keys(spark: Any, table: str, key_columns: Sequence[str], published: "Published[Any]",
                 bounds: KeyBounds | None) -> DataFrame:
    """The key columns of the snapshot the batch was staged on (empty for a table that had none)."""
    cols = [F.col(_quote(k)) for k in key_columns]
    if published.parent_id is None:
        return spark.table(table).select(*cols).limit(0)
    keys = spark.read.option("snapshot-id", str(published.parent_id)).table(table).select(*cols)
    return keys.where(bounds.column) if bounds else keys
