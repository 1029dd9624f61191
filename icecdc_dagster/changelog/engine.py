"""Change rows of a snapshot or a range: read, carry-over removal, update detection, net changes.

Everything stays lazy in Spark except small aggregated checks (duplicate keys, null keys) that must
fail the batch with a named error before any sink sees it; inside a
:func:`~icecdc_dagster.changelog.key_checks.deferred_key_checks` block those checks travel in the rows' plan
and fail the write that stores them instead (no job of their own).

Column names come from the table and may hold dots, spaces, backticks or any unicode: every reference
to one goes through :func:`column` (a quoted reference), never a bare string that Spark would parse.
"""

import functools
import operator
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.batch import (
    CHANGE_COLUMNS,
    CHANGE_ORDINAL,
    CHANGE_TYPE,
    COMMIT_SEQUENCE_NUMBER,
    COMMIT_SNAPSHOT_ID,
    COMMIT_TIMESTAMP,
    DELETE,
    INSERT,
    LAST_UPDATED_SEQUENCE_NUMBER,
    ROW_ID,
    UPDATE_AFTER,
    UPDATE_BEFORE,
)
from icecdc_dagster.changelog import key_checks
from icecdc_dagster.changelog.carry_over import (
    DEFAULT_MAX_GROUP_BYTES,
    FileGroup,
    arrow_supported,
    descriptor,
    group_files,
    matched_rows,
    read_context,
    uses_lineage,
)
from icecdc_dagster.changelog.ordinals import OrdinalAnchor, check_copy_on_write, ordered_plans
from icecdc_dagster.changelog.plan import SnapshotPlan, ancestry_ids, plan_snapshot, table_name
from icecdc_dagster.changelog.read import changed_files, java_data_file_changes, java_table, read_files, touched_files
from icecdc_dagster.column_names import column
from icecdc_dagster.errors import (
    DuplicateKeyChangeError,
    IdentifierColumnError,
    SnapshotNotFoundError,
    TableHasNoSnapshotError,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import Row, SparkSession

    from icecdc_dagster.runtime.java import JavaObject

LINEAGE_COLUMNS = (ROW_ID, LAST_UPDATED_SEQUENCE_NUMBER)
_TMP = "__icecdc_"
# Up to this many rows read, a batch's key check runs in one task (:func:`_in_one_task_when_small`).
ONE_TASK_ROWS = 100_000


SnapshotSelector = int | str | tuple[int | None, int]
"""One snapshot id, or ``(start_exclusive, end_inclusive)`` along the ancestry."""

def _cols(names: Iterable[str]) -> list[Column]:
    return [column(n) for n in names]


@dataclass
class ChangeSet:
    """Change rows (lazy) with the plans they came from. ``stats`` holds metadata-level figures;
    ``compute_stats()`` adds row counts (runs Spark aggregations)."""

    rows: DataFrame
    plans: list[SnapshotPlan]
    stats: dict[str, Any] = field(default_factory=dict)
    raw: "DataFrame | Callable[[], DataFrame] | None" = None  # the rows as read, or how to plan them

    @property
    def raw_rows(self) -> DataFrame | None:
        """The rows as read, before carry-over removal (planned on first use when the change rows did
        not need them)."""
        if self.raw is not None and not isinstance(self.raw, DataFrame):
            self.raw = self.raw()
        return self.raw

    def compute_stats(self) -> dict[str, Any]:
        counts = {r[CHANGE_TYPE]: r["count"] for r in self.rows.groupBy(column(CHANGE_TYPE)).count().collect()}
        result = dict(self.stats)
        result.update({f"{t.lower()}_rows": int(counts.get(t, 0)) for t in (INSERT, DELETE, UPDATE_BEFORE,
                                                                           UPDATE_AFTER)})
        if "rows_read" in self.stats:  # from the files' record counts (:func:`changes`): no count job
            result["carry_over_removed"] = int(self.stats["rows_read"]) - int(sum(counts.values()))
        elif self.raw_rows is not None:
            raw = {r[CHANGE_TYPE]: r["count"]
                   for r in self.raw_rows.groupBy(column(CHANGE_TYPE)).count().collect()}
            result["rows_read"] = int(sum(raw.values()))
            result["carry_over_removed"] = int(sum(raw.values()) - sum(counts.values()))
        self.stats.update(result)
        return result


def uses_row_lineage(table: "Table") -> bool:
    """Whether the table carries v3 row lineage (``_row_id``): format version 3 or later.

    Raises:
        Nothing of its own: it reads the table's metadata in memory.
    """
    return int(table.metadata.format_version) >= 3


def check_supported(table: "Table") -> None:
    """Refuse a table whose changes cannot be read as its settings say, from metadata only (call it at load).

    Every format version is followed: v1 snapshots have no sequence numbers, so a v1 line orders them by
    their ancestry (:mod:`icecdc_dagster.changelog.ordinals`); a v1 table set to merge-on-read is refused.

    Raises:
        UnsupportedFormatVersionError: a v1 table whose write mode is merge-on-read.
    """
    check_copy_on_write(table)


def _require_snapshot(table: "Table") -> None:
    if table.metadata.current_snapshot() is None:
        raise TableHasNoSnapshotError(
            f"table {table_name(table)} has no snapshot: it was created but never written, so there are no "
            f"rows to export and no changes to read until its first commit")


def data_columns(table: "Table") -> list[str]:
    """The table's current top-level column names, in schema order.

    Raises:
        Nothing of its own: it reads the table's schema in memory.
    """
    return [f.name for f in table.schema().fields]


def validate_identifier_columns(table: "Table", identifier_columns: Sequence[str]) -> tuple[str, ...]:
    """Identifier columns must be top-level primitive columns of the current schema.

    Raises:
        IdentifierColumnError: no identifier column is declared or set on the table, or one is
            missing or nested.
    """
    schema = table.schema()
    fields = {f.name: f for f in schema.fields}
    for name in identifier_columns:
        if name not in fields:
            if "." in name and name.split(".")[0] in fields:
                raise IdentifierColumnError(
                    f"identifier column {name!r} of table {table_name(table)} is nested; "
                    f"only top-level primitive columns can identify a row")
            raise IdentifierColumnError(
                f"identifier column {name!r} does not exist in table {table_name(table)} "
                f"(columns: {', '.join(fields)})")
        if not fields[name].field_type.is_primitive:
            raise IdentifierColumnError(
                f"identifier column {name!r} of table {table_name(table)} is nested "
                f"({fields[name].field_type}); only top-level primitive columns can identify a row")
    if len(set(identifier_columns)) != len(identifier_columns):
        raise IdentifierColumnError(f"identifier columns of table {table_name(table)} repeat: {identifier_columns}")
    return tuple(identifier_columns)


def _has_map(dtype: T.DataType) -> bool:
    if isinstance(dtype, T.MapType):
        return True
    if isinstance(dtype, T.ArrayType):
        return _has_map(dtype.elementType)
    if isinstance(dtype, T.StructType):
        return any(_has_map(f.dataType) for f in dtype.fields)
    return False


def comparable(df: DataFrame, name: str) -> Column:
    """A value Spark can group by: maps are not comparable in Spark, so they compare as JSON.
    Binary, decimal, struct and array values compare by value (null-safe in grouping)."""
    dtype = df.schema[name].dataType
    return F.to_json(column(name)) if _has_map(dtype) else column(name)


def value_columns(rows: DataFrame) -> list[str]:
    """What a row is: every column but the change columns (v3 lineage columns included)."""
    return [c for c in rows.columns if c not in CHANGE_COLUMNS]


def _with_values(rows: DataFrame) -> tuple[DataFrame, list[Column]]:
    """``rows`` plus one groupable column per value column, and references to those."""
    names = [f"{_TMP}v{i}" for i in range(len(value_columns(rows)))]
    values = [comparable(rows, c).alias(n) for c, n in zip(value_columns(rows), names, strict=False)]
    return rows.select("*", *values), _cols(names)


def _phase() -> Column:
    """0 for a before image (DELETE, UPDATE_BEFORE), 1 for an after image."""
    return F.when(column(CHANGE_TYPE).isin(DELETE, UPDATE_BEFORE), 0).otherwise(1)


def change_order() -> list[Column]:
    """Commit order of change rows: sequence number (a v1 line's ordinal, :mod:`.ordinals`), then the
    snapshot's position in the range (the two agree; the position alone orders snapshots whose sequence
    numbers tie, as the snapshots of a table upgraded from v1 do), before images first.

    Raises:
        Nothing of its own: it builds column expressions only.
    """
    return [column(COMMIT_SEQUENCE_NUMBER), column(CHANGE_ORDINAL), _phase()]


def _carry_over_window(rows: DataFrame, lead: Sequence[str]) -> tuple[DataFrame, Column]:
    """``rows`` with a ``keep`` condition that cancels DELETE/INSERT pairs of identical rows pairwise.

    One window (one sort): its partition is ``lead`` (the columns the rows are already clustered
    by, so Spark adds no exchange) then every other value column; DELETE sorts before INSERT, so an
    INSERT's rank among inserts is row_number - deletes, and the k-th INSERT cancels the k-th DELETE.
    A high-cardinality column first (the key) gives the sort a useful prefix.
    """
    others = [comparable(rows, c) for c in value_columns(rows) if c not in lead]
    ordered = Window.partitionBy(*_cols(lead), *others).orderBy(column(CHANGE_TYPE), column(COMMIT_SEQUENCE_NUMBER),
                                                         column(CHANGE_ORDINAL))
    whole = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    is_insert = _is_insert()
    inserts, deletes, rn = F.col(f"{_TMP}ins"), F.col(f"{_TMP}del"), F.col(f"{_TMP}rn")
    # One select: the three window expressions share one Window operator (one pass over the sort).
    df = rows.select("*", F.sum(is_insert).over(whole).alias(f"{_TMP}ins"),
                     F.sum(1 - is_insert).over(whole).alias(f"{_TMP}del"),
                     F.row_number().over(ordered).alias(f"{_TMP}rn"))
    rank_in_type = F.when(column(CHANGE_TYPE) == INSERT, rn - deletes).otherwise(rn)
    keep = (((column(CHANGE_TYPE) == INSERT) & (rank_in_type > deletes))
            | ((column(CHANGE_TYPE) == DELETE) & (rank_in_type > inserts)))
    return df, keep


def remove_carry_over(rows: DataFrame, per_snapshot: bool = True,
                      cluster_by: Sequence[str] = ()) -> DataFrame:
    """Cancel DELETE/INSERT pairs of identical rows (pairwise: 3 deletes + 2 inserts leave 1 delete).

    Compares every column but the change columns, so with v3 row lineage a carry-over also needs the
    same ``_row_id`` and ``_last_updated_sequence_number``. ``cluster_by`` (key columns, and the
    snapshot) shuffles by them once, so that work by key after it needs no second shuffle.

    Raises:
        Nothing of its own: a lazy plan; Spark's errors surface when it is evaluated.
    """
    lead = list(cluster_by)
    if per_snapshot and COMMIT_SNAPSHOT_ID not in lead:
        lead.append(COMMIT_SNAPSHOT_ID)
    source = rows.repartition(*_cols(cluster_by)) if cluster_by else rows
    df, keep = _carry_over_window(source, lead)
    return df.where(keep).select(*_cols(rows.columns))


def _keyed_changes(rows: DataFrame, keys: Sequence[str]) -> DataFrame:
    """Carry-over removal, update detection and the duplicate/null key flags in one shuffle and one sort.

    Rows are shuffled by (key, snapshot); the carry-over window sorts by (key, snapshot, other
    values, change type), which already groups the rows of a key, so the per-key window after the
    carry-over filter needs neither an exchange nor a sort. Adds ``{_TMP}ins``/``{_TMP}del`` (rows
    per key and snapshot left after carry-over) and ``{_TMP}bad`` (null key, or more than one row of
    a kind) for :func:`_raise_on_bad_key`.
    """
    by_key = [*keys, COMMIT_SNAPSHOT_ID]
    df, keep = _carry_over_window(rows.repartition(*_cols(by_key)), by_key)
    return _keyed_updates(df.where(keep).select(*_cols(rows.columns)), keys)


def _keyed_updates(rows: DataFrame, keys: Sequence[str]) -> DataFrame:
    """Update detection and the key flags of :func:`_keyed_changes` on rows without carry-over."""
    is_insert = _is_insert()
    per_key = Window.partitionBy(*_cols([*keys, COMMIT_SNAPSHOT_ID]))
    inserts, deletes = F.col(f"{_TMP}ins"), F.col(f"{_TMP}del")
    counted = rows.select("*", F.sum(is_insert).over(per_key).alias(f"{_TMP}ins"),
                          F.sum(1 - is_insert).over(per_key).alias(f"{_TMP}del"))
    return _mark_updates(counted, keys, inserts, deletes)


def _mark_updates(counted: DataFrame, keys: Sequence[str], inserts: Column, deletes: Column) -> DataFrame:
    both = (inserts == 1) & (deletes == 1)
    change_type = (F.when(both & (column(CHANGE_TYPE) == INSERT), F.lit(UPDATE_AFTER))
                   .when(both & (column(CHANGE_TYPE) == DELETE), F.lit(UPDATE_BEFORE))
                   .otherwise(column(CHANGE_TYPE)))
    any_null = _any_null(keys)
    bad = (inserts > 1) | (deletes > 1) | any_null
    columns = [change_type.alias(CHANGE_TYPE) if c == CHANGE_TYPE else column(c)
               for c in counted.columns if c not in (f"{_TMP}ins", f"{_TMP}del")]
    return counted.select(*columns, inserts.alias(f"{_TMP}ins"), deletes.alias(f"{_TMP}del"),
                          bad.alias(f"{_TMP}bad"))


def _raise_on_bad_key(flagged: DataFrame, keys: Sequence[str], name: str, export: bool = False) -> None:
    """Raise the named error for the smallest flagged (snapshot, key); collects one small row.

    One global aggregate (one pass over every partition, which also fills a persisted ``flagged``)
    rather than ``limit(1)``, whose incremental jobs rescan the partitions when no key is bad.
    """
    offender = F.min(F.when(F.col(f"{_TMP}bad"), F.struct(
        column(COMMIT_SNAPSHOT_ID), *_cols(keys), F.col(f"{_TMP}ins"), F.col(f"{_TMP}del"))))
    bad = flagged.agg(offender.alias("offender")).collect()[0]["offender"]
    if bad is not None:
        _raise_key_error(bad, keys, name, export, f"{_TMP}ins", f"{_TMP}del")


def key_string(keys: Sequence[str]) -> str:
    return ", ".join(keys)


def check_keys(rows: DataFrame, keys: Sequence[str], name: str, export: bool = False) -> None:
    """Fail on a null key, or on a key with more than one INSERT or DELETE row in one snapshot.

    One aggregation per key, then one global aggregate that keeps the smallest offending (snapshot, key):
    one Spark job, and only that row reaches the driver. (``limit(1)`` instead ran one job per scan of
    its partitions when no key was bad: two jobs per small batch on two cores.)

    Raises:
        IdentifierColumnError: a key column is null in a change row.
        DuplicateKeyChangeError: one key has two INSERTs or DELETEs left (``export``: two rows).
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the rows cannot be computed (passes through).
    """
    is_insert = _is_insert()
    inserts, deletes = f"{_TMP}inserts", f"{_TMP}deletes"
    any_null = _any_null(keys)
    per_key = (rows.groupBy(column(COMMIT_SNAPSHOT_ID), *_cols(keys))
               .agg(F.sum(is_insert).alias(inserts), F.sum(1 - is_insert).alias(deletes)))
    offender = F.min(F.when((F.col(inserts) > 1) | (F.col(deletes) > 1) | any_null, F.struct(
        column(COMMIT_SNAPSHOT_ID), *_cols(keys), F.col(inserts), F.col(deletes))))
    bad = per_key.agg(offender.alias("offender")).collect()[0]["offender"]
    if bad is not None:
        _raise_key_error(bad, keys, name, export, inserts, deletes)


def _raise_key_error(row: "Row", keys: Sequence[str], name: str, export: bool, inserts: str,
                     deletes: str) -> None:
    snapshot_id = row[COMMIT_SNAPSHOT_ID]
    key = {k: row[k] for k in keys}
    null_columns = [k for k, v in key.items() if v is None]
    if null_columns:
        raise IdentifierColumnError(
            f"identifier column(s) {', '.join(null_columns)} of table {name} hold null in snapshot "
            f"{snapshot_id} (key {key}); a key must not be null")
    if export:
        raise DuplicateKeyChangeError(
            f"table {name}, snapshot {snapshot_id}: key {key} is held by {row[inserts]} rows of the export; "
            f"the identifier columns ({key_string(keys)}) do not identify a row, so a sink keyed by them "
            f"would keep one of them and lose the others")
    raise DuplicateKeyChangeError(
        f"table {name}, snapshot {snapshot_id}: key {key} has {row[inserts]} INSERT and "
        f"{row[deletes]} DELETE rows after carry-over removal; the identifier columns "
        f"({key_string(keys)}) do not identify a row")


def detect_updates(rows: DataFrame, keys: Sequence[str], name: str) -> DataFrame:
    """DELETE+INSERT of one key in one snapshot -> UPDATE_BEFORE+UPDATE_AFTER.

    Fails (aggregated check, nothing collected but the first offending key) on a null key or on a
    key with more than one INSERT or DELETE left in one snapshot.

    Raises:
        IdentifierColumnError, DuplicateKeyChangeError: as :func:`check_keys`, when the returned frame is
            evaluated (the check runs inside the plan).
    """
    check_keys(rows, keys, name)
    is_insert = _is_insert()
    window = Window.partitionBy(column(COMMIT_SNAPSHOT_ID), *_cols(keys))
    both = (F.sum(is_insert).over(window) == 1) & (F.sum(1 - is_insert).over(window) == 1)
    change_type = (F.when(both & (column(CHANGE_TYPE) == INSERT), F.lit(UPDATE_AFTER))
                   .when(both & (column(CHANGE_TYPE) == DELETE), F.lit(UPDATE_BEFORE))
                   .otherwise(column(CHANGE_TYPE)))
    return rows.withColumn(CHANGE_TYPE, change_type)


def net_changes(rows: DataFrame, keys: Sequence[str], compared_columns: Sequence[str] | None = None) -> DataFrame:
    """Collapse per key over a range: first before image and last after image survive.

    Shuffles by key only. INSERT..DELETE inside the range vanishes; an update chain becomes one
    UPDATE_BEFORE (first image) + UPDATE_AFTER (last image); an update back to the first image (same
    ``compared_columns``, by default every column but the change columns) vanishes. Rows are ordered by
    :func:`change_order`. Without keys: :func:`net_changes_without_keys`.

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Spark cannot compute the rows (passes through);
            nothing of its own.
    """
    if not keys:
        return net_changes_without_keys(rows)
    compared = list(compared_columns) if compared_columns is not None else value_columns(rows)
    ordered = Window.partitionBy(*_cols(keys)).orderBy(*change_order())
    whole = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    image = F.to_json(F.struct(*_cols(compared)))
    phase, rn, n = F.col(f"{_TMP}phase"), F.col(f"{_TMP}rn"), F.col(f"{_TMP}n")
    df = (rows.withColumn(f"{_TMP}phase", _phase())
          .withColumn(f"{_TMP}image", image)
          .withColumn(f"{_TMP}rn", F.row_number().over(ordered))
          .withColumn(f"{_TMP}n", F.count(F.lit(1)).over(whole))
          .withColumn(f"{_TMP}first", F.first(phase).over(whole))
          .withColumn(f"{_TMP}last", F.last(phase).over(whole))
          .withColumn(f"{_TMP}first_image", F.first(F.col(f"{_TMP}image")).over(whole))
          .withColumn(f"{_TMP}last_image", F.last(F.col(f"{_TMP}image")).over(whole)))
    first, last = F.col(f"{_TMP}first"), F.col(f"{_TMP}last")
    is_first_before = (rn == 1) & (first == 0)
    is_last_after = (rn == n) & (last == 1)
    unchanged = (first == 0) & (last == 1) & (F.col(f"{_TMP}first_image") == F.col(f"{_TMP}last_image"))
    updated = (first == 0) & (last == 1)
    change_type = (F.when(is_first_before & updated, F.lit(UPDATE_BEFORE))
                   .when(is_first_before, F.lit(DELETE))
                   .when(is_last_after & updated, F.lit(UPDATE_AFTER))
                   .otherwise(F.lit(INSERT)))
    return (df.where((is_first_before | is_last_after) & ~unchanged)
              .withColumn(CHANGE_TYPE, change_type)
              .select(*_cols(rows.columns)))


def net_changes_without_keys(rows: DataFrame) -> DataFrame:
    """Net changes of identical rows, as Iceberg's ``create_changelog_view(net_changes => true)``.

    The copies of one row are walked in :func:`change_order`: an INSERT and a DELETE cancel, and a run
    that cancels out ends. What survives is |inserts - deletes| copies of the first row of the last run,
    credited to that row's snapshot. Fed the rows as read (carry-over included, like Iceberg), a row
    inserted at s1 and rewritten unchanged at s2 and s3 is credited to s3, its last rewrite.

    Raises:
        Nothing of its own: a lazy plan; Spark's errors surface when it is evaluated.
    """
    df, group = _with_values(rows)
    ordered = Window.partitionBy(*group).orderBy(*change_order())
    whole = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    so_far = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    sign = F.when(column(CHANGE_TYPE).isin(INSERT, UPDATE_AFTER), 1).otherwise(-1)
    rn, balance, total, last_zero = (F.col(f"{_TMP}{n}") for n in ("rn", "balance", "total", "last_zero"))
    df = (df.withColumn(f"{_TMP}rn", F.row_number().over(ordered))
            .withColumn(f"{_TMP}balance", F.sum(sign).over(so_far))
            .withColumn(f"{_TMP}total", F.sum(sign).over(whole)))
    # A run ends where the balance (inserts - deletes so far) is back at 0; the last run never does.
    df = df.withColumn(f"{_TMP}last_zero", F.max(F.when(balance == 0, rn).otherwise(0)).over(whole))
    in_last_run = rn > last_zero
    commit = [COMMIT_SNAPSHOT_ID, COMMIT_SEQUENCE_NUMBER, CHANGE_ORDINAL, COMMIT_TIMESTAMP]
    commit = [c for c in commit if c in rows.columns]
    order = [c.alias(f"{_TMP}o{i}") for i, c in enumerate(change_order())]
    first = F.min(F.when(in_last_run, F.struct(*order, *_cols(commit)))).over(whole)
    df = df.withColumn(f"{_TMP}first", first)
    run_sign = F.signum(total).cast("int")
    # Rows of the run's kind so far in the last run: (rows in run + balance * run sign) / 2.
    rank_in_run = (rn - last_zero + balance * run_sign) / 2
    keep = in_last_run & (total != 0) & (sign == run_sign) & (rank_in_run <= F.abs(total))
    out = df.where(keep).withColumn(CHANGE_TYPE, F.when(total > 0, F.lit(INSERT)).otherwise(F.lit(DELETE)))
    for name in commit:
        out = out.withColumn(name, F.col(f"{_TMP}first").getField(name))
    return out.select(*_cols(rows.columns))


def _resolve_range(table: "Table", snapshot_id: "SnapshotSelector") -> list[int]:
    if isinstance(snapshot_id, tuple):
        start, end = snapshot_id
        return ancestry_ids(table, start, end)
    sid = int(snapshot_id)
    ids = ancestry_ids(table, None)
    if sid not in ids:
        plan_snapshot(table, sid)  # raises when it is not in the history at all
        raise SnapshotNotFoundError(
            f"snapshot {sid} of table {table_name(table)} is not an ancestor of its current snapshot")
    return [sid]


def _with_change_columns(df: DataFrame, columns: Sequence[str], change_type: str, plan: SnapshotPlan,
                         ordinal: int) -> DataFrame:
    return df.select(*_cols(columns),
                     F.lit(change_type).alias(CHANGE_TYPE),
                     F.lit(plan.snapshot_id).cast("long").alias(COMMIT_SNAPSHOT_ID),
                     F.lit(plan.sequence_number).cast("long").alias(COMMIT_SEQUENCE_NUMBER),
                     F.lit(ordinal).cast("int").alias(CHANGE_ORDINAL),
                     F.timestamp_millis(F.lit(plan.committed_at_ms).cast("long")).alias(COMMIT_TIMESTAMP))


def output_columns(table: "Table") -> list[str]:
    """The table's current columns, plus the v3 row lineage columns when the table has them."""
    return data_columns(table) + (list(LINEAGE_COLUMNS) if uses_row_lineage(table) else [])


@dataclass
class _PlanRows:
    """How one snapshot's rows are read: every row as read (statistics, and the Spark path's input), and
    where the Arrow path is taken, the same rows split by who removes their carry-over."""

    reader: "Callable[[set[str], str], DataFrame]"  # Spark's read of some files as DELETE or INSERT rows
    sides: list[tuple[set[str], str]] = field(default_factory=list)  # every file read, by change type
    descriptors: list[str] = field(default_factory=list)  # groups matched in Arrow
    sizes: list[int] = field(default_factory=list)  # their data file bytes
    lineage_groups: int = 0  # of which matched by v3 row lineage (no value compared)
    clean_sides: list[tuple[set[str], str]] = field(default_factory=list)  # groups with one side only
    to_match_sides: list[tuple[set[str], str]] = field(default_factory=list)  # groups too large for a task
    files_read: int = 0
    records: int = 0  # rows in the files read, from metadata (known when split: no delete file)
    two_sided: bool = False
    split: bool = False  # the Arrow path was taken

    # Spark's reads are planned only when used (the Arrow path of a snapshot reads only its one-sided
    # and too-large groups with Spark).
    @functools.cached_property
    def as_read(self) -> list[DataFrame]:
        return [self.reader(paths, kind) for paths, kind in self.sides]

    @functools.cached_property
    def clean(self) -> list[DataFrame]:
        """Groups with one side only: nothing to cancel."""
        return [self.reader(paths, kind) for paths, kind in self.clean_sides]

    @functools.cached_property
    def to_match(self) -> list[DataFrame]:
        """Groups too large for a task: Spark cancels their carry-over."""
        return [self.reader(paths, kind) for paths, kind in self.to_match_sides]


def _arrow_groups(spark: "SparkSession", jtable: "JavaObject", plan: SnapshotPlan, before: set[str],
                  after: set[str]) -> list[FileGroup] | None:
    """Groups of a plain copy-on-write rewrite (no delete file on either side), or None."""
    if plan.has_delete_files or plan.live_delete_files:
        return None
    files = changed_files(spark, jtable, plan.snapshot_id)
    if files is None:
        return None
    if ({f.path for f in files if not f.added} != before or {f.path for f in files if f.added} != after):
        return None
    return group_files(files)


def _plan_rows(spark: "SparkSession", catalog_name: str, table: "Table", plan: SnapshotPlan, ordinal: int,
               jtable: "JavaObject", arrow: bool, max_group_bytes: int) -> _PlanRows:
    before, after = touched_files(table, plan)
    # Without delete files the touched files are exactly the ones the snapshot removed and added:
    # their scan tasks come from the snapshot's own manifests, not from planning the table.
    changed_by = None if plan.needs_diff else plan.snapshot_id
    columns = output_columns(table)

    def read(paths: set[str], change_type: str) -> DataFrame:
        at = plan.parent_id if change_type == DELETE else plan.snapshot_id
        assert at is not None, "a snapshot that removes rows has a parent"
        return _with_change_columns(read_files(spark, catalog_name, table, at, paths, changed_by, jtable),
                                    columns, change_type, plan, ordinal)

    result = _PlanRows(reader=read, files_read=len(before) + len(after), two_sided=bool(before and after),
                       sides=[(paths, kind) for paths, kind in ((before, DELETE), (after, INSERT)) if paths])
    groups = _arrow_groups(spark, jtable, plan, before, after) if arrow and result.two_sided else None
    if groups is None:
        return result
    result.split = True
    result.records = sum(f.record_count for g in groups for f in (*g.deleted, *g.added))
    lineage = uses_row_lineage(table)
    for group in groups:
        sides = [({f.path for f in g}, kind) for g, kind in ((group.deleted, DELETE), (group.added, INSERT)) if g]
        if group.one_sided:
            result.clean_sides += sides
        elif group.size > max_group_bytes:
            result.to_match_sides += sides
        else:
            result.descriptors.append(descriptor(group, plan, ordinal, lineage))
            result.sizes.append(group.size)
            result.lineage_groups += int(lineage and uses_lineage(group))
    return result


def _union(parts: Sequence[DataFrame]) -> DataFrame:
    return reduce(DataFrame.unionByName, parts)


def _arrow_rows(spark: "SparkSession", table: "Table", schema: T.StructType, descriptors: list[str],
                sizes: list[int]) -> DataFrame:
    """The groups' rows after carry-over removal, from Arrow tasks (:func:`matched_rows`); ``schema``:
    the change rows' (Spark's read of the table plus the change columns)."""
    values = T.StructType(schema.fields[:len(output_columns(table))])
    return matched_rows(spark, read_context(table, values, schema), descriptors, sizes, schema)


def _split_rows(spark: "SparkSession", table: "Table", read: list[_PlanRows]) -> tuple[list[DataFrame], bool]:
    """Rows of the Arrow path: carry-over already removed (Arrow groups, one-sided groups, plans with one
    side), and whether some rows (groups too large for a task, plans not split) still need Spark's removal."""
    parts: list[DataFrame] = []
    descriptors = [d for p in read for d in p.descriptors]
    if descriptors:
        schema = next(p.as_read[0] for p in read if p.split).schema
        parts.append(_arrow_rows(spark, table, schema, descriptors, [n for p in read for n in p.sizes]))
    to_match: list[DataFrame] = []
    for p in read:
        if p.split:
            parts += p.clean
            to_match += p.to_match
        elif p.two_sided:
            to_match += p.as_read
        else:
            parts += p.as_read
    return parts + to_match, bool(to_match)


def changes(spark: "SparkSession", catalog_name: str, table: "Table", snapshot_id: "SnapshotSelector",
            identifier_columns: Sequence[str] = (), net: bool = False, carry_over: str = "arrow",
            max_group_bytes: int = DEFAULT_MAX_GROUP_BYTES, anchor: OrdinalAnchor | None = None) -> ChangeSet:
    """Change rows of one snapshot, or of ``(start_exclusive, end_inclusive)`` along the ancestry.

    ``carry_over``: "arrow" (the default: a third of the Spark path's CPU on the changelog bench,
    docs/carry-over.md) cancels the carry-over of copy-on-write rewrites inside Spark tasks, group by
    group (:mod:`icecdc_dagster.changelog.carry_over`), for groups of at most ``max_group_bytes`` of data
    files; "spark" shuffles and sorts every row read (the reference path, always used for merge-on-read
    snapshots, larger groups, column types the Arrow reader does not hand over unchanged, and keyless net
    changes).

    ``anchor``: where a format v1 line counts its snapshots from (:mod:`.ordinals`; ignored on v2+): the
    rows' ``_commit_sequence_number`` is then the snapshot's ordinal in the line.

    No change row comes to the driver: every path ends in a DataFrame computed by the executors.

    Raises:
        TableHasNoSnapshotError: the table was never written (transient: the line waits).
        SnapshotNotFoundError: a snapshot of the range is gone or not on the current ancestry;
            :class:`SnapshotOrderLostError` when a v1 snapshot can no longer be numbered from ``anchor``.
        UnsupportedFormatVersionError: a v1 table set to merge-on-read.
        IdentifierColumnError, DuplicateKeyChangeError: a key is missing, null or changed twice
            (raised while the rows are computed, so also when the returned frames are evaluated; inside a
            ``deferred_key_checks`` block, on leaving it after they were evaluated).
        ValueError: an unknown ``carry_over`` mode (a caller's bug).
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Spark cannot read the table's files (passes
            through).
    """
    if carry_over not in ("arrow", "spark"):
        raise ValueError(f"carry_over must be 'arrow' or 'spark', not {carry_over!r}")
    name = table_name(table)
    check_supported(table)
    _require_snapshot(table)
    keys = validate_identifier_columns(table, tuple(identifier_columns))
    jtable = java_table(spark, catalog_name, table)
    jvm_changes = java_data_file_changes(spark, jtable)
    plans = ordered_plans(table, [plan_snapshot(table, sid, jvm_changes) for sid in _resolve_range(table, snapshot_id)],
                          anchor)
    row_keys = list(keys) or ([ROW_ID] if uses_row_lineage(table) else [])
    keyless_net = net and len(plans) > 1 and not row_keys
    arrow = carry_over == "arrow" and not keyless_net and arrow_supported(table)
    read = [_plan_rows(spark, catalog_name, table, plan, ordinal, jtable, arrow, max_group_bytes)
            for ordinal, plan in enumerate(plans)]

    planned: list[DataFrame] = []
    as_read: DataFrame | None = None  # the rows as read when the change rows are they, with their check carried

    def rows_as_read() -> DataFrame:
        """Every row as read, planned once and only when used (the Arrow path does not need them)."""
        if not planned:
            parts = [part for p in read for part in p.as_read]
            if not parts:
                parts.append(_empty_rows(spark, catalog_name, table, plans[-1] if plans else _NO_PLAN))
            planned.append(_union(parts))
        return planned[0]

    # Carry-over (and so an update) needs a DELETE and an INSERT in one snapshot: when no snapshot
    # reads both sides (appends, whole-file deletes), the plan proves there is none to remove.
    one_sided = not any(p.two_sided for p in read)
    split = any(p.split for p in read)
    cached = None
    if keyless_net:
        # Like Iceberg, keyless net changes start from the rows as read: carry-over decides attribution.
        rows = net_changes_without_keys(rows_as_read())
    elif split and not row_keys:
        split_parts, needs_removal = _split_rows(spark, table, read)
        rows = remove_carry_over(_union(split_parts)) if needs_removal else _union(split_parts)
    elif not row_keys:
        rows = rows_as_read() if one_sided else remove_carry_over(rows_as_read())
    elif one_sided:
        as_read = _carried_key_check(rows_as_read(), row_keys, name) if _small(plans) else None
        if as_read is None:
            check_keys(_in_one_task_when_small(rows_as_read(), plans), row_keys, name)  # an aggregate over the keys
        rows = as_read if as_read is not None else rows_as_read()
        rows = net_changes(rows, row_keys) if net and len(plans) > 1 else rows
    else:
        # One shuffle and one sort; the duplicate/null key check runs before any sink sees the batch: carried
        # into the write that stores the rows (key_checks), else run now, keeping what it computed (change rows
        # after carry-over removal, small next to the rows read).
        if split:
            split_parts, needs_removal = _split_rows(spark, table, read)
            unioned = _union(split_parts)
            keyed = _keyed_changes(unioned, row_keys) if needs_removal else _keyed_updates(unioned, row_keys)
        else:
            unioned = rows_as_read()
            keyed = _keyed_changes(unioned, row_keys)
        carried = key_checks.carried(keyed, F.col(f"{_TMP}bad"),
                                     lambda: _raise_on_bad_key(keyed, row_keys, name), name)
        if carried is not None:  # checked by the write that reads them: computed once, nothing to keep
            rows = carried.select(*_cols(unioned.columns))
        else:
            cached = keyed.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                _raise_on_bad_key(cached, row_keys, name)
            except Exception:
                cached.unpersist()
                raise
            rows = cached.select(*_cols(unioned.columns))
        if net and len(plans) > 1:
            rows = net_changes(rows, row_keys)
    stats = {"snapshots": len(plans), "files_read": sum(p.files_read for p in read),
             "delete_files_added": sum(len(p.added_delete_files) for p in plans),
             "carry_over_groups_in_arrow": sum(len(p.descriptors) for p in read),
             "carry_over_groups_by_lineage": sum(p.lineage_groups for p in read)}
    if split and all(p.split or not p.files_read for p in read):
        # No delete file in any snapshot read: every row read is a row of a file read whole, so the rows
        # read are the files' record counts (no count job over the rows as read).
        stats["rows_read"] = sum(p.records for p in read)
    raw = as_read if as_read is not None else planned[0] if planned else rows_as_read
    change_set = ChangeSet(rows=rows, plans=plans, stats=stats, raw=raw)
    if cached is not None:
        weakref.finalize(change_set, cached.unpersist)
    return change_set


def _is_insert() -> Column:
    """1 for an INSERT change row, 0 for a DELETE: summed per key, the rows of each kind a key has."""
    return (column(CHANGE_TYPE) == INSERT).cast("long")


def _any_null(keys: Sequence[str]) -> Column:
    """A key column of the row is null."""
    return reduce(operator.or_, [column(k).isNull() for k in keys])


def _small(plans: Sequence[SnapshotPlan]) -> bool:
    """The files read hold at most :data:`ONE_TASK_ROWS` rows (from metadata)."""
    return sum(p.added_records + p.removed_records for p in plans) <= ONE_TASK_ROWS


def _in_one_task_when_small(rows: DataFrame, plans: Sequence[SnapshotPlan]) -> DataFrame:
    """``rows`` in one partition when :func:`_small`.

    An aggregate over one partition needs no shuffle: the key check of a small batch is one stage and one task
    instead of three stages. bench/batch_profile.py, interleaved: 0.16 -> 0.12 JVM CPU-s per small batch."""
    return rows.coalesce(1) if _small(plans) else rows


def _carried_key_check(rows: DataFrame, keys: Sequence[str], name: str) -> DataFrame | None:
    """A small batch's rows in one partition, carrying :func:`check_keys` in their plan (:mod:`.key_checks`);
    None when the check is to run now. A window over one partition is a sort in the reading stage itself, no
    exchange: the write that stores the rows checks them in its one task."""
    one = rows.coalesce(1)
    is_insert = _is_insert()
    per_key = Window.partitionBy(*_cols([COMMIT_SNAPSHOT_ID, *keys]))
    any_null = _any_null(keys)
    bad = (F.sum(is_insert).over(per_key) > 1) | (F.sum(1 - is_insert).over(per_key) > 1) | any_null
    return key_checks.carried(one, bad, lambda: check_keys(one, keys, name), name)


def _empty_rows(spark: "SparkSession", catalog_name: str, table: "Table", plan: SnapshotPlan) -> DataFrame:
    """No row, with the columns (and their types) of the change rows: a relation of the current schema,
    planned without reading a file."""
    current = table.metadata.current_snapshot()
    assert current is not None, "check_supported refuses a table without snapshots"
    source = read_files(spark, catalog_name, table, current.snapshot_id, set())
    return _with_change_columns(source, output_columns(table), INSERT, plan, 0)


_NO_PLAN = SnapshotPlan(table_name="", snapshot_id=0, parent_id=None, sequence_number=0, operation="append",
                        committed_at_ms=0, added_data_files=(), removed_data_files=(), added_delete_files=(),
                        affected_partitions=(), has_delete_files=False, live_delete_files=False)


def export(spark: "SparkSession", catalog_name: str, table: "Table", snapshot_id: int,
           identifier_columns: Sequence[str] = (), anchor: OrdinalAnchor | None = None) -> ChangeSet:
    """Every row of the snapshot as INSERT (bootstrap batch), read with the current schema.

    With identifier columns the export is held to the rule of CDC batches: a null key
    (IdentifierColumnError) or a key held by two rows (DuplicateKeyChangeError) fails it, instead of
    a keyed sink silently keeping one row. One aggregation; only the first offending key is collected.
    (v3 tables without keys are identified by ``_row_id``, which cannot repeat.) ``anchor``: as for
    :func:`changes` (a v1 line's ordinals).

    Raises:
        TableHasNoSnapshotError, SnapshotNotFoundError: the table has no snapshot, or ``snapshot_id`` is gone.
        UnsupportedFormatVersionError: a v1 table set to merge-on-read.
        IdentifierColumnError, DuplicateKeyChangeError: a key column is missing or null, or two rows
            share a key (when the rows are evaluated).
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Spark cannot read the snapshot (passes through).
    """
    check_supported(table)
    _require_snapshot(table)
    keys = validate_identifier_columns(table, tuple(identifier_columns))
    plan = ordered_plans(table, [plan_snapshot(table, snapshot_id)], anchor)[0]
    source = read_files(spark, catalog_name, table, plan.snapshot_id, None)
    rows = _with_change_columns(source, output_columns(table), INSERT, plan, 0)
    if keys:
        check_keys(rows, keys, table_name(table), export=True)
    return ChangeSet(rows=rows, plans=[plan], stats={"snapshots": 1, "export": True})

