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

import datetime
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.runtime import merge_tally
from icecdc_dagster.writer.exactly_once import (
    BATCH_ID_PROPERTY,
    LedgerRetention,
    Published,
    is_committed,
    java_table,
    staged_commit,
    table_properties,
)

OP_COLUMN = "_icecdc_op"
ORDER_COLUMN = "_icecdc_order"
OP_UPSERT, OP_DELETE, OP_INSERT = "upsert", "delete", "insert"
_EXISTS = "_icecdc_exists"
_DELETE_PREFIX = "_icecdc_del_"
# WriteOutcome.counted_by: where the counts came from
COUNTED_BY_SUMMARY = "summary"      # the commit's snapshot summary alone (appends, overwrites)
COUNTED_BY_SOURCE = "merge-source"  # in the MERGE's own job: the rows each clause took, or its source's keys
#                                     against the merged-into keys
COUNTED_BY_JOIN = "join"            # every key of the batch joined with the target after the MERGE (fallback)
_COUNT_NAMES = ("inserted", "updated", "deleted", "delete_missing")


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
    ranges: tuple[tuple[str, Any, Any], ...] = ()  # (key column, min, max) as Python values


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
    ranges = tuple((k, row[f"{prefix}lo{i}"], row[f"{prefix}hi{i}"]) for i, k in enumerate(usable))
    return KeyBounds(column, " AND ".join(sql), ranges)


def bounds_of_ranges(ranges: Mapping[str, tuple[Any, Any]], key_columns: Sequence[str],
                     target: T.StructType) -> KeyBounds | None:
    """The key bounds from each key's (min, max) known already (e.g. from file statistics); None when a key
    column the target can order by has no range (the caller aggregates instead).

    Raises:
        Nothing of its own: it builds a filter from values in memory.
    """
    usable = _orderable(key_columns, target)
    if not usable or not all(k in ranges for k in usable):
        return None
    row = {f"_icecdc_{side}{i}": ranges[k][j] for i, k in enumerate(usable) for j, side in enumerate(("lo", "hi"))}
    return bounds_from(row, key_columns, target)


def _orderable(key_columns: Sequence[str], target: T.StructType) -> list[str]:
    types = {f.name: f.dataType for f in target.fields}
    return [k for k in key_columns if isinstance(types.get(k), _ORDERABLE)]


def _sql(literal: Column) -> str:
    return str(literal._jc.expr().sql())  # noqa: SLF001 - Spark's own rendering of a literal (escapes, types)


def write_batch(spark: Any, table: str, rows: DataFrame, key_columns: Sequence[str], batch_id: str,
                properties: dict[str, str] | None = None, exact_counts: bool = True, ledger: bool = False,
                replace_all: bool = False, bounds: KeyBounds | None = None,
                retention: LedgerRetention | None = None, unique_keys: bool = False,
                before_commit: Callable[[], bool] | None = None) -> WriteOutcome:
    """Write ``rows`` to ``table`` (full Spark name) once: skipped when ``batch_id`` is already in main's history.

    Counts: inserted / updated / deleted (keys that existed) / delete_missing (last op a delete of a
    key the table does not hold: nothing to do), or appended for key-less tables; exact, counted in the
    MERGE's own job (:func:`merged_counts`), else by a join of the batch's keys with the keys of the
    snapshot the MERGE read. ``exact_counts=False``: no counts. A batch none of whose keys a data file of the
    target may hold (by the files' key statistics) is appended instead: the MERGE would only insert.
    ``ledger``: keep the batch id in the table's ledger property too (survives snapshot expiry);
    ``retention``: the ledger's entries below its horizon are dropped in the same commit.
    ``bounds``: the batch's key range when the caller has it already (else one aggregate finds it).
    ``replace_all``: the batch is the table's whole new content (a resync export): one overwrite
    replaces every row, so rows the batch does not hold are gone (counts: ``replaced``).
    ``unique_keys``: the caller's rows hold each key once already (it ranked them): no collapse of its own, whose
    shuffle and sort were a second pass over rows ranked once (a small batch's replica: 0.04-0.07 JVM CPU-s).
    ``before_commit`` (keyed tables): asked once the MERGE is staged (its job has computed ``rows``) and before
    it is published; False declines the batch. The rows are computed in the MERGE's job alone: no key range is
    aggregated first (the caller's ``bounds`` or none: every file may hold a key). Why: a caller can merge rows
    it has not computed before, and publish them only if they turn out whole (ingest's one-job batch).

    Raises:
        CommitDeclinedError: ``before_commit`` said False; the staged files are deleted, nothing published.
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
        content = (collapse(rows, key_columns) if key_columns and not unique_keys else rows).where(
            F.col(OP_COLUMN) != OP_DELETE)
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

    schema = spark.table(table).schema
    if bounds is None and before_commit is None:
        bounds = key_bounds(rows, key_columns, schema)  # the rows' key range is their collapse's
    # The collapse is the MERGE's source, planned into the MERGE's own job (no intermediate), except where the
    # MERGE reads its source twice: copy-on-write first finds the files to rewrite with it, so there the source
    # is persisted. Either way its counts are observed as the MERGE reads it (with a cache: as the cache fills).
    effective = rows if unique_keys else collapse(rows, key_columns)
    twice = _merge_mode(spark, table) == "copy-on-write"
    held: list[DataFrame] = []
    observed = Observation(f"icecdc_counts_{uuid.uuid4().hex}")
    view = f"icecdc_batch_{abs(hash((table, batch_id))) % 10**12}"
    updates = any(c not in key_columns for c in data_columns)  # keys-only tables have no update clause
    tallied: list[merge_tally.Tallies | None] = []  # per MERGE attempt; the last one committed

    def merge(name: str) -> None:
        reach = _reach(spark, table, name, bounds)
        if not reach.within:  # nothing to match: every upsert is an insert, every delete finds no row
            _append_absent(effective, data_columns, observed if exact_counts else None).writeTo(name).append()
            return
        pruning = bounds if reach.skips else None  # in the plan only where they rule a file out (see _Reach)
        tally = merge_tally.tallies(spark) if exact_counts and updates else None
        tallied.append(tally)
        source = _merge_source(spark, name, effective, key_columns, pruning, observed if exact_counts else None,
                               tally is not None)
        if twice:  # observed once, as the cache fills: the second read takes the cached rows
            source = source.persist()
            held.append(source)
        source.drop(_EXISTS).createOrReplaceTempView(view)
        spark.sql(_merge_sql(name, view, data_columns, key_columns, pruning, tally))

    try:
        published = staged_commit(spark, table, props, merge, ledger, retention, before_commit)
        spark.catalog.dropTempView(view)
        counts: dict[str, int] = {}
        counted_by = ""
        if exact_counts:
            seen = observation_values(observed)
            counted = None if seen is None else {k: int(v or 0) for k, v in seen.items()}
            if counted is not None and tallied and tallied[-1] is not None:
                counted = _tallied_counts(counted, *tallied[-1].counts())
            counts, counted_by = merged_counts(spark, table, effective, key_columns, published, counted, bounds)
        return WriteOutcome(table, batch_id, False, published.snapshot_id, counts, counted_by)
    finally:
        for frame in held:
            frame.unpersist()
        for tally in tallied:
            if tally is not None:
                tally.close()


def _merge_source(spark: Any, name: str, effective: DataFrame, key_columns: Sequence[str],
                  pruning: "KeyBounds | None", observed: Observation | None, tallied: bool) -> DataFrame:
    """The MERGE's source, its counts observed as the MERGE reads it (``observed``): from the source alone where
    the clauses' tallies count the matched rows (``tallied``), else with each key's presence joined in."""
    if observed is None:
        return effective
    if tallied:
        return effective.observe(observed, *_source_aggregates())
    return _with_presence(spark, name, effective, key_columns, pruning).observe(observed, *_count_aggregates())


def _merge_sql(name: str, view: str, data_columns: Sequence[str], key_columns: Sequence[str],
               pruning: "KeyBounds | None", tally: "merge_tally.Tallies | None") -> str:
    """The MERGE of ``view`` into ``name``. The bounds are the batch's own: a target row outside them matches no
    batch row, so they change nothing but the files the MERGE reads (pruned by their column statistics). A
    tally last in a matched clause's condition counts the rows that clause takes (runtime/MergeTally.java)."""
    on = " AND ".join([f"t.{_quote(k)} = s.{_quote(k)}" for k in key_columns] + ([pruning.sql] if pruning else []))
    counted = {clause: f" AND {tally.condition(clause, 's.' + _quote(key_columns[0]))}" if tally else ""
               for clause in ("deleted", "updated")}
    sets = ", ".join(f"t.{_quote(c)} = s.{_quote(c)}" for c in data_columns if c not in key_columns)
    update = f"WHEN MATCHED{counted['updated']} THEN UPDATE SET {sets} " if sets else ""
    cols = ", ".join(_quote(c) for c in data_columns)
    vals = ", ".join(f"s.{_quote(c)}" for c in data_columns)
    return (f"MERGE INTO {name} t USING {view} s ON {on} "
            f"WHEN MATCHED AND s.{OP_COLUMN} = '{OP_DELETE}'{counted['deleted']} THEN DELETE "
            f"{update}"
            f"WHEN NOT MATCHED AND s.{OP_COLUMN} <> '{OP_DELETE}' THEN INSERT ({cols}) VALUES ({vals})")


def _merge_mode(spark: Any, table: str) -> str:
    """The table's ``write.merge.mode`` (Iceberg's default: copy-on-write)."""
    return table_properties(java_table(spark, table)).get("write.merge.mode", "copy-on-write")


def _with_presence(spark: Any, name: str, effective: DataFrame, key_columns: Sequence[str],
                   bounds: "KeyBounds | None") -> DataFrame:
    """The MERGE's source with each key's presence (:data:`_EXISTS`) in the snapshot the MERGE merges into
    (``name``, read in the same statement): what the MERGE will do to each key, known from the rows it consumes.

    The target's keys are read within ``bounds`` when given (the files the MERGE itself reads), each key once
    (identifier columns are not enforced: a key held twice is still one key)."""
    keys = [_quote(k) for k in key_columns]
    target_keys = spark.table(name).select(*keys)
    if bounds is not None:
        target_keys = target_keys.where(bounds.column)
    present = target_keys.dropDuplicates().withColumn(_EXISTS, F.lit(True))
    return effective.join(present, list(key_columns), "left")


def _append_absent(effective: DataFrame, data_columns: Sequence[str], observed: Observation | None) -> DataFrame:
    """The rows a MERGE of ``effective`` would insert into a target holding none of its keys (its upserts),
    with the counts observed as the write reads them (every key absent). An append: no join, no read of the
    target (bench/batch_profile.py: a replica's batch of new keys)."""
    if observed is not None:
        effective = effective.withColumn(_EXISTS, F.lit(None).cast("boolean")).observe(observed, *_count_aggregates())
    return effective.where(F.col(OP_COLUMN) != OP_DELETE).select(*[F.col(_quote(c)) for c in data_columns])


@dataclass(frozen=True)
class _Reach:
    """How a batch's key range meets the live data files of the snapshot it merges into, from the files' key
    statistics (a file without them may hold any key).

    ``within``: a file may hold a key of the batch. When none can (the usual append of new keys), every key is
    absent, known without reading the target: the batch is appended (:func:`_append_absent`), no MERGE, no join
    (bench/batch_profile.py, new keys appended, merge-on-read: the presence join alone was 0.15-0.2 JVM CPU-s
    and a broadcast job of a small batch).
    ``skips``: the range rules a file out. Only then do the bounds go into the MERGE's plan: a literal in a plan
    is compiled into its generated code, so bounds that change with every batch made Spark generate and the JVM
    compile new classes for every MERGE (4 per batch, ~0.5 CPU-s of a small batch's 3.3 in compilation and
    colder code, /tmp probes of bench/ingest.py's shape); where they skip nothing they buy nothing."""

    within: bool
    skips: bool


def _reach(spark: Any, table: str, name: str, bounds: "KeyBounds | None") -> _Reach:
    """:class:`_Reach` of ``bounds`` in ``name`` (``table`` or its branch ``<table>.branch_<b>``): one planning
    of its manifests, every data file counted against the snapshot's own total. No bounds: every file may (a
    table without data files has none)."""
    prefix = f"{table}.branch_"
    branch = name[len(prefix):] if name.startswith(prefix) else None
    jtable = java_table(spark, table)
    if branch and jtable.refs().get(branch) is None:
        branch = None
    snapshot = jtable.snapshot(branch) if branch else jtable.currentSnapshot()
    if snapshot is None or jtable.currentSnapshot() is None:
        return _Reach(False, False)  # no snapshot on main: no file (a staging branch's own is empty)
    if bounds is None:
        total = snapshot.summary().get("total-data-files")
        return _Reach(total is None or int(total) > 0, False)
    expressions = spark._jvm.org.apache.iceberg.expressions.Expressions  # noqa: SLF001 - the session's JVM
    both = getattr(expressions, "and")  # Java's Expressions.and (a Python keyword)
    condition = expressions.alwaysTrue()
    for column, low, high in bounds.ranges:
        within = both(expressions.greaterThanOrEqual(column, _iceberg_literal(low)),
                      expressions.lessThanOrEqual(column, _iceberg_literal(high)))
        condition = both(condition, within)
    tasks = jtable.newScan().useSnapshot(snapshot.snapshotId()).filter(condition).planFiles()
    try:
        planned = int(spark._jvm.org.apache.iceberg.relocated.com.google.common.collect.Iterables.size(tasks))  # noqa: SLF001
    finally:
        tasks.close()
    total = snapshot.summary().get("total-data-files")
    return _Reach(planned > 0, total is None or planned < int(total))


def _iceberg_literal(value: Any) -> Any:
    """A Python key bound as Iceberg's expressions take it (a date as its day number)."""
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return (value - datetime.date(1970, 1, 1)).days
    return value


def _count_aggregates() -> list[Column]:
    """rows, inserted, updated, deleted and delete_missing of a :func:`_with_presence` source."""
    exists, deleting = F.col(_EXISTS).isNotNull(), F.col(OP_COLUMN) == OP_DELETE
    return [F.count(F.lit(1)).alias("rows"),
            *[F.sum((op & found).cast("long")).alias(count)
              for count, op, found in (("inserted", ~deleting, ~exists), ("updated", ~deleting, exists),
                                       ("deleted", deleting, exists), ("delete_missing", deleting, ~exists))]]


def _source_aggregates() -> list[Column]:
    """rows, upserts and deletes of a MERGE's source whose matched clauses carry tallies (:func:`_tallied_counts`)."""
    deleting = F.col(OP_COLUMN) == OP_DELETE
    return [F.count(F.lit(1)).alias("rows"), F.sum((~deleting).cast("long")).alias("upserts"),
            F.sum(deleting.cast("long")).alias("deletes")]


def _tallied_counts(source: dict[str, int], deleted: int, updated: int) -> dict[str, int] | None:
    """The MERGE's counts from its source's rows and the rows its delete and update clauses took; None where
    they cannot be a MERGE's (then the caller joins)."""
    counts = {"rows": source["rows"], "inserted": source["upserts"] - updated, "updated": updated,
              "deleted": deleted, "delete_missing": source["deletes"] - deleted}
    return counts if min(counts.values()) >= 0 else None


def _counts_of(row: Any) -> dict[str, int] | None:
    return None if row is None else {k: int(row[k] or 0) for k in ("rows", *_COUNT_NAMES)}


def observation_values(observed: Observation, timeout_s: float = 120.0) -> dict[str, Any] | None:
    """The values an :class:`Observation` collected, once Spark's listener has them; None when they did not
    arrive within ``timeout_s`` or the observation was never attached (the caller counts another way).
    Spark's own ``get`` would wait forever.

    Raises:
        Nothing of its own: it waits on the JVM observation's future.
    """
    jobserved = observed._jo  # noqa: SLF001 - the JVM Observation (its future: a bounded wait)
    if jobserved is None:
        return None
    future = jobserved.future()
    deadline = time.monotonic() + timeout_s
    while not future.isCompleted():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.005)
    return dict(observed.get)


def merged_counts(spark: Any, table: str, effective: DataFrame, key_columns: Sequence[str],
                  published: "Published[Any]", counted: dict[str, int] | None, bounds: KeyBounds | None
                  ) -> tuple[dict[str, int], str]:
    """inserted / updated / deleted / delete_missing of a published MERGE, and how they were counted.

    ``counted``: the counts of the MERGE's own source, whose rows carried each key's presence in the snapshot
    it merged into (:func:`_with_presence`; observed as the MERGE consumed them, or as the cache of the
    persisted source a copy-on-write MERGE reads twice filled): the MERGE's own counts, for every format, write mode
    and delete file around. Where the commit's summary is exact (:func:`records_delta`) it must agree
    (inserted - deleted). When it does not, or no counts arrived, the batch's keys are joined with that
    snapshot's keys (:func:`batch_counts`: the batch and the target read once more).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the fallback join could not read
            the snapshot the MERGE read.
    """
    delta = records_delta(published)
    if counted is not None and sum(counted[k] for k in _COUNT_NAMES) == counted["rows"] and (
            delta is None or counted["inserted"] - counted["deleted"] == delta):
        return {k: counted[k] for k in _COUNT_NAMES if counted[k]}, COUNTED_BY_SOURCE
    return batch_counts(spark, table, effective, key_columns, published, bounds)


def records_delta(published: "Published[Any]") -> int | None:
    """inserted - deleted (keys) of a MERGE, read from its own snapshot summary; None where that is not exact
    (:func:`merged_counts` checks its counts against it).

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
                 published: "Published[Any]", bounds: KeyBounds | None) -> tuple[dict[str, int], str]:
    """inserted / updated / deleted / delete_missing of a published MERGE by a join of every key of the batch
    with the keys of the snapshot the MERGE read (the fallback of :func:`merged_counts`).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Spark could not read that snapshot.
    """
    keys = _staged_keys(spark, table, key_columns, published, bounds).withColumn(_EXISTS, F.lit(True))
    grouped = (effective.join(keys, list(key_columns), "left")
               .groupBy(OP_COLUMN, F.col(_EXISTS).isNotNull().alias("e")).count().collect())
    counts: dict[str, int] = {}
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
