"""Snapshot epochs: a completed Debezium snapshot is a table's whole content (no Dagster).

Debezium marks the records of a snapshot in ``source.snapshot``: a table's first record ``first`` (the
snapshot's first) or ``first_in_data_collection``, its last ``last`` (the snapshot's last) or
``last_in_data_collection``, the others ``true``; stream events ``false`` (or nothing); incremental-snapshot
chunks ``incremental``. A row deleted in the source between two snapshot attempts is never streamed, so
upserts alone leave it in the target. A snapshot *epoch* of one target starts at a ``first`` /
``first_in_data_collection`` read (op ``r``) and ends at the target's next ``last`` /
``last_in_data_collection`` read: every key upserted in between (snapshot reads and stream events alike) is
marked, and when the end commits, every row of the target that is not marked is deleted.

- Marks of an epoch that spans batches are kept in ``<target>__snapshot_keys`` (the key columns and the
  epoch id; Iceberg), written before the target under the same batch id (its own ledger: a re-run skips
  it); the target's batch summary (and ledger entry) carries the open epoch's id (``icecdc.snapshot-epoch``).
  A sweep reads the marks as they were before the batch (:func:`marks_before`), so a crash anywhere re-runs
  the batch to the same result and an epoch resumes where it was. The marks table is not one of the batch's
  tables (the ingest ledger does not read it): its entries, kept longer than the target's, never make an old
  batch look partly committed.
- The deletion is synthetic delete rows at the end's position, added to the batch before it is collapsed
  per key: a key upserted again after the end (in the same batch) keeps its newer image; nothing is read to
  the driver (the keys stay in Spark: an anti-join of the target's keys with the marks).
- An epoch that never ends (the snapshot died) deletes nothing; a new ``first`` starts a new epoch, so
  the re-sent snapshot alone decides. Without a start marker (older Debezium versions, a table whose
  snapshot holds a single row, an empty table) no epoch starts: nothing is deleted.
"""

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from icecdc_dagster.writer import (
    BATCH_ID_PROPERTY,
    LAST_BATCH_PROPERTY,
    java_table,
    ledger_entries,
    main_ancestors,
    table_properties,
)

EPOCH_PROPERTY = "icecdc.snapshot-epoch"   # in a target's batch summary / ledger entry: the open epoch's id
MARKS_OF_PROPERTY = "icecdc.snapshot-marks-of"  # in a marks table's summaries: the source (not the ingest ledger's)
MARKS_SUFFIX = "__snapshot_keys"
EPOCH_COLUMN = "_icecdc_epoch"
MARKER_COLUMN = "_icecdc_snapshot_marker"
STARTS = ("first", "first_in_data_collection")
ENDS = ("last", "last_in_data_collection")
_PREFILTER = r'"snapshot"\s*:\s*"(first|last)'  # cheap test before a JSON read (most lines never match)


def marks_table(target: str) -> str:
    return f"{target}{MARKS_SUFFIX}"


def marker(raw: Column) -> Column:
    """A line's epoch marker (one of :data:`STARTS` / :data:`ENDS`) when it is a snapshot read, else null.
    Runs in executors; the JSON is read only for the few lines the text test lets through."""
    def field(path: str) -> Column:
        return F.coalesce(F.get_json_object(raw, f"$.payload.{path}"), F.get_json_object(raw, f"$.{path}"))

    value = field("source.snapshot")
    # byte searches first: a regular expression over every line costs more than the JSON read of the few
    maybe = (raw.contains('"first') | raw.contains('"last')) & raw.contains('"snapshot"')
    snapshot_read = (field("op") == F.lit("r")) & value.isin(*STARTS, *ENDS)
    return F.when(maybe & raw.rlike(_PREFILTER), F.when(snapshot_read, value))


@dataclass(frozen=True)
class Epoch:
    epoch_id: str
    start: int | None  # order of its start in this batch; None: started in an earlier batch


@dataclass(frozen=True)
class EpochPlan:
    """What one batch does to one target's epochs: the epochs it ends (with the end's order), the one open
    after it, and the one open before it."""

    closed: tuple[tuple[Epoch, int], ...]
    open_after: Epoch | None
    prior: str | None

    @property
    def active(self) -> bool:
        return bool(self.prior or self.closed or self.open_after)


def plan(prior: str | None, markers: Iterable[tuple[int, str]], batch_id: str) -> EpochPlan:
    """Walk the batch's markers (order, marker) in order from the epoch open before it (``prior``)."""
    current = Epoch(prior, None) if prior else None
    closed: list[tuple[Epoch, int]] = []
    for order, mark in sorted(markers):
        if mark in STARTS:
            current = Epoch(f"{batch_id}@{order}", order)  # an unfinished earlier attempt is dropped
        elif mark in ENDS and current is not None:
            closed.append((current, order))
            current = None
    return EpochPlan(tuple(closed), current, prior)


def open_epoch(spark: object, table: str, source_key: str, source: str) -> str | None:
    """The epoch open in ``table`` (full name) after the newest batch of ``source`` (``source_key``: the
    summary property naming the source): the last batch's properties, else the ledger's newest entry."""
    props = table_properties(java_table(spark, table))
    last = json.loads(props.get(LAST_BATCH_PROPERTY) or "null")
    if isinstance(last, dict) and last.get(source_key) == source:
        return last.get(EPOCH_PROPERTY) or None
    for entry in reversed(ledger_entries(props)):
        if entry.get(source_key) == source:
            return entry.get(EPOCH_PROPERTY) or None
    return None


def with_sweeps(spark: object, table: str, marks: DataFrame | None, rows: DataFrame, keys: Sequence[str],
                op_column: str, order_column: str, delete_op: str, the_plan: EpochPlan) -> DataFrame:
    """``rows`` (the target's columns + op + order) plus, for each epoch the batch ends, a delete at the end's
    order of every key present (in ``table`` or upserted by the batch before the end) and not marked in the
    epoch (``marks``: the marks table before the batch, None when it does not exist)."""
    upserts = rows.where(F.col(op_column) != F.lit(delete_op))
    cols = [F.col(_quote(k)) for k in keys]
    for epoch, end in the_plan.closed:
        seen = upserts.where(F.col(order_column) <= end)
        if epoch.start is not None:
            seen = seen.where(F.col(order_column) >= epoch.start)
        marked = seen.select(*cols)
        if epoch.start is None and marks is not None:
            marked = marked.unionByName(marks.where(F.col(EPOCH_COLUMN) == epoch.epoch_id)
                                        .select(*cols))
        present = pinned(spark, table).select(*cols).unionByName(
            upserts.where(F.col(order_column) < end).select(*cols))
        doomed = present.join(marked, list(keys), "left_anti")
        values = [F.col(_quote(f.name)) if f.name in keys else F.lit(None).cast(f.dataType).alias(f.name)
                  for f in rows.schema.fields if f.name not in (op_column, order_column)]
        deletes = doomed.select(*values, F.lit(delete_op).alias(op_column), F.lit(end).cast("long").alias(order_column))
        rows = rows.unionByName(deletes)
    return rows


def marks_before(spark: object, marks: str, batch_id: str) -> DataFrame:
    """The marks table as it was before ``batch_id`` wrote it (a re-run of the batch sees what the first
    attempt saw), fixed to that snapshot."""
    for snap in main_ancestors(java_table(spark, marks)):
        if snap.summary().get(BATCH_ID_PROPERTY) != batch_id:
            return spark.read.option("snapshot-id", str(snap.snapshotId())).table(marks)  # type: ignore[attr-defined]
    return spark.read.table(marks).limit(0)  # type: ignore[attr-defined]


def pinned(spark: object, table: str) -> DataFrame:
    """``table`` at its current snapshot, fixed: Spark re-caches a cached frame that reads a table after a
    write to it, and the batch's frame (counted after its commit) must keep the keys the sweep saw."""
    snapshot = java_table(spark, table).currentSnapshot()
    frame = spark.read.table(table) if snapshot is None else (  # type: ignore[attr-defined]
        spark.read.option("snapshot-id", str(snapshot.snapshotId())).table(table))  # type: ignore[attr-defined]
    return frame


@dataclass(frozen=True)
class MarksWrite:
    """The marks table's part of a batch: its whole new content (``replace``) or rows to append."""

    rows: DataFrame
    replace: bool


def marks_write(rows: DataFrame, keys: Sequence[str], op_column: str, order_column: str, delete_op: str,
                the_plan: EpochPlan, marks_exist: bool) -> MarksWrite | None:
    """The marks the batch leaves for the epoch open after it (None: nothing to write). An epoch started in
    this batch replaces the table's content (marks of older epochs go); one that continues appends; when
    the batch ends the last open epoch, the marks are emptied."""
    opened = the_plan.open_after
    if opened is None:
        if not marks_exist or not (the_plan.prior or the_plan.closed):
            return None
        return MarksWrite(_marks(rows.limit(0), keys, ""), True)
    seen = rows.where(F.col(op_column) != F.lit(delete_op))
    if opened.start is not None:
        seen = seen.where(F.col(order_column) >= opened.start)
    return MarksWrite(_marks(seen, keys, opened.epoch_id), opened.start is not None or bool(the_plan.closed))


def _marks(rows: DataFrame, keys: Sequence[str], epoch_id: str) -> DataFrame:
    return rows.select(*[F.col(_quote(k)) for k in keys], F.lit(epoch_id).alias(EPOCH_COLUMN)).distinct()


def ensure_marks_table(spark: object, target: str, keys: Sequence[str]) -> None:
    """``<target>__snapshot_keys``: the target's key columns (their types) and the epoch id."""
    types = {f.name: f.dataType for f in spark.table(target).schema.fields}  # type: ignore[attr-defined]
    cols = ", ".join(f"{_quote(k)} {types[k].simpleString()}" for k in keys)
    spark.sql(f"CREATE TABLE IF NOT EXISTS {marks_table(target)} ({cols}, {EPOCH_COLUMN} string) "  # type: ignore[attr-defined]
              "USING iceberg TBLPROPERTIES ('format-version'='2')")


def markers_by_target(rows: Iterable[tuple[str, int, str]]) -> dict[str, list[tuple[int, str]]]:
    """(target, order, marker) rows -> per target its markers in order."""
    out: dict[str, list[tuple[int, str]]] = {}
    for target, order, mark in rows:
        out.setdefault(target, []).append((int(order), mark))
    return {t: sorted(m) for t, m in out.items()}


def epoch_properties(the_plan: EpochPlan) -> Mapping[str, str]:
    """The summary property a target's commit carries: the epoch open after the batch."""
    return {EPOCH_PROPERTY: the_plan.open_after.epoch_id} if the_plan.open_after else {}


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
