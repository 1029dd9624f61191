"""Change rows of a snapshot or a range: read, carry-over removal, update detection, net changes.

Everything stays lazy in Spark except two small aggregated checks (duplicate keys, null keys)
that must fail the batch with a named error before any sink sees it.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
import weakref
from functools import reduce

from pyspark import StorageLevel

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.batch import (
    CHANGE_COLUMNS, CHANGE_ORDINAL, CHANGE_TYPE, COMMIT_SEQUENCE_NUMBER, COMMIT_SNAPSHOT_ID, DELETE, INSERT,
    LAST_UPDATED_SEQUENCE_NUMBER, ROW_ID, UPDATE_AFTER, UPDATE_BEFORE)
from icecdc_dagster.changelog.plan import SnapshotPlan, ancestry_ids, plan_snapshot, table_name
from icecdc_dagster.changelog.read import read_files, touched_files
from icecdc_dagster.errors import DuplicateKeyChangeError, IdentifierColumnError, SnapshotNotFoundError

LINEAGE_COLUMNS = (ROW_ID, LAST_UPDATED_SEQUENCE_NUMBER)
_TMP = "__icecdc_"


@dataclass
class ChangeSet:
    """Change rows (lazy) with the plans they came from. ``stats`` holds metadata-level figures;
    ``compute_stats()`` adds row counts (runs Spark aggregations)."""

    rows: DataFrame
    plans: list[SnapshotPlan]
    stats: dict = field(default_factory=dict)
    raw_rows: DataFrame | None = None

    def compute_stats(self) -> dict:
        counts = {r[CHANGE_TYPE]: r["count"] for r in self.rows.groupBy(CHANGE_TYPE).count().collect()}
        result = dict(self.stats)
        result.update({f"{t.lower()}_rows": int(counts.get(t, 0)) for t in (INSERT, DELETE, UPDATE_BEFORE,
                                                                           UPDATE_AFTER)})
        if self.raw_rows is not None:
            raw = {r[CHANGE_TYPE]: r["count"] for r in self.raw_rows.groupBy(CHANGE_TYPE).count().collect()}
            result["rows_read"] = int(sum(raw.values()))
            result["carry_over_removed"] = int(sum(raw.values()) - sum(counts.values()))
        self.stats.update(result)
        return result


def uses_row_lineage(table) -> bool:  # noqa: ANN001
    return int(table.metadata.format_version) >= 3


def data_columns(table) -> list[str]:  # noqa: ANN001
    return [f.name for f in table.schema().fields]


def validate_identifier_columns(table, identifier_columns: Sequence[str]) -> tuple[str, ...]:  # noqa: ANN001
    """Identifier columns must be top-level primitive columns of the current schema."""
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
    return F.to_json(F.col(name)) if _has_map(dtype) else F.col(name)


def remove_carry_over(rows: DataFrame, per_snapshot: bool = True,
                      cluster_by: Sequence[str] = ()) -> DataFrame:
    """Cancel DELETE/INSERT pairs of identical rows (pairwise: 3 deletes + 2 inserts leave 1 delete).

    Compares every column but the change columns, so with v3 row lineage a carry-over also needs the
    same ``_row_id`` and ``_last_updated_sequence_number``. ``cluster_by`` (snapshot + key columns)
    shuffles by the key once, so that update detection after it needs no second shuffle.
    """
    value_columns = [c for c in rows.columns if c not in CHANGE_COLUMNS]
    keys = [comparable(rows, c).alias(f"{_TMP}v{i}") for i, c in enumerate(value_columns)]
    df = (rows.repartition(*cluster_by) if cluster_by else rows).select("*", *keys)
    group = [f"{_TMP}v{i}" for i in range(len(value_columns))]
    if per_snapshot:
        group = [COMMIT_SNAPSHOT_ID, *group]
    is_insert = (F.col(CHANGE_TYPE) == INSERT).cast("long")
    # One window (one sort): DELETE sorts before INSERT, so an INSERT's rank among inserts is
    # row_number - deletes; the k-th INSERT cancels the k-th DELETE.
    ordered = Window.partitionBy(*group).orderBy(CHANGE_TYPE, COMMIT_SEQUENCE_NUMBER, CHANGE_ORDINAL)
    whole = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    df = (df.withColumn(f"{_TMP}ins", F.sum(is_insert).over(whole))
            .withColumn(f"{_TMP}del", F.sum(1 - is_insert).over(whole))
            .withColumn(f"{_TMP}rn", F.row_number().over(ordered)))
    rank_in_type = F.when(F.col(CHANGE_TYPE) == INSERT, F.col(f"{_TMP}rn") - F.col(f"{_TMP}del")) \
        .otherwise(F.col(f"{_TMP}rn"))
    keep = (((F.col(CHANGE_TYPE) == INSERT) & (rank_in_type > F.col(f"{_TMP}del")))
            | ((F.col(CHANGE_TYPE) == DELETE) & (rank_in_type > F.col(f"{_TMP}ins"))))
    return df.where(keep).select(*rows.columns)


def key_string(keys: Sequence[str]) -> str:
    return ", ".join(keys)


def detect_updates(rows: DataFrame, keys: Sequence[str], name: str) -> DataFrame:
    """DELETE+INSERT of one key in one snapshot -> UPDATE_BEFORE+UPDATE_AFTER.

    Fails (aggregated check, nothing collected but the first offending key) on a null key or on a
    key with more than one INSERT or DELETE left in one snapshot.
    """
    is_insert = (F.col(CHANGE_TYPE) == INSERT).cast("long")
    bad = (rows.groupBy(COMMIT_SNAPSHOT_ID, *keys)
           .agg(F.sum(is_insert).alias("inserts"), F.sum(1 - is_insert).alias("deletes"))
           .where((F.col("inserts") > 1) | (F.col("deletes") > 1)
                  | reduce(lambda a, b: a | b, [F.col(k).isNull() for k in keys]))
           .limit(1).collect())
    if bad:
        row = bad[0]
        key = {k: row[k] for k in keys}
        if any(v is None for v in key.values()):
            null_cols = [k for k, v in key.items() if v is None]
            raise IdentifierColumnError(
                f"identifier column(s) {', '.join(null_cols)} of table {name} hold null in snapshot "
                f"{row[COMMIT_SNAPSHOT_ID]} (key {key}); a key must not be null")
        raise DuplicateKeyChangeError(
            f"table {name}, snapshot {row[COMMIT_SNAPSHOT_ID]}: key {key} has {row['inserts']} INSERT and "
            f"{row['deletes']} DELETE rows after carry-over removal; the identifier columns "
            f"({key_string(keys)}) do not identify a row")
    window = Window.partitionBy(COMMIT_SNAPSHOT_ID, *keys)
    both = (F.sum(is_insert).over(window) == 1) & (F.sum(1 - is_insert).over(window) == 1)
    change_type = (F.when(both & (F.col(CHANGE_TYPE) == INSERT), F.lit(UPDATE_AFTER))
                   .when(both & (F.col(CHANGE_TYPE) == DELETE), F.lit(UPDATE_BEFORE))
                   .otherwise(F.col(CHANGE_TYPE)))
    return rows.withColumn(CHANGE_TYPE, change_type)


def _phase() -> Column:
    """0 for a before image (DELETE, UPDATE_BEFORE), 1 for an after image."""
    return F.when(F.col(CHANGE_TYPE).isin(DELETE, UPDATE_BEFORE), 0).otherwise(1)


def net_changes(rows: DataFrame, keys: Sequence[str], value_columns: Sequence[str]) -> DataFrame:
    """Collapse per key over a range: first before image and last after image survive.

    Shuffles by key only. INSERT..DELETE inside the range vanishes; an update chain becomes one
    UPDATE_BEFORE (first image) + UPDATE_AFTER (last image); an update back to the first image vanishes.
    """
    if not keys:
        return remove_carry_over(rows, per_snapshot=False)
    ordered = Window.partitionBy(*keys).orderBy(COMMIT_SEQUENCE_NUMBER, _phase())
    whole = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    image = F.to_json(F.struct(*[F.col(c) for c in value_columns]))
    df = (rows.withColumn(f"{_TMP}phase", _phase())
          .withColumn(f"{_TMP}image", image)
          .withColumn(f"{_TMP}rn", F.row_number().over(ordered))
          .withColumn(f"{_TMP}n", F.count(F.lit(1)).over(whole))
          .withColumn(f"{_TMP}first", F.first(f"{_TMP}phase").over(whole))
          .withColumn(f"{_TMP}last", F.last(f"{_TMP}phase").over(whole))
          .withColumn(f"{_TMP}first_image", F.first(f"{_TMP}image").over(whole))
          .withColumn(f"{_TMP}last_image", F.last(f"{_TMP}image").over(whole)))
    first, last = F.col(f"{_TMP}first"), F.col(f"{_TMP}last")
    is_first_before = (F.col(f"{_TMP}rn") == 1) & (first == 0)
    is_last_after = (F.col(f"{_TMP}rn") == F.col(f"{_TMP}n")) & (last == 1)
    unchanged = (first == 0) & (last == 1) & (F.col(f"{_TMP}first_image") == F.col(f"{_TMP}last_image"))
    updated = (first == 0) & (last == 1)
    change_type = (F.when(is_first_before & updated, F.lit(UPDATE_BEFORE))
                   .when(is_first_before, F.lit(DELETE))
                   .when(is_last_after & updated, F.lit(UPDATE_AFTER))
                   .otherwise(F.lit(INSERT)))
    return (df.where((is_first_before | is_last_after) & ~unchanged)
              .withColumn(CHANGE_TYPE, change_type)
              .select(*rows.columns))


def _resolve_range(table, snapshot_id) -> list[int]:  # noqa: ANN001
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
    return df.select(*[F.col(c) for c in columns],
                     F.lit(change_type).alias(CHANGE_TYPE),
                     F.lit(plan.snapshot_id).cast("long").alias(COMMIT_SNAPSHOT_ID),
                     F.lit(plan.sequence_number).cast("long").alias(COMMIT_SEQUENCE_NUMBER),
                     F.lit(ordinal).cast("int").alias(CHANGE_ORDINAL))


def output_columns(table) -> list[str]:  # noqa: ANN001
    """The table's current columns, plus the v3 row lineage columns when the table has them."""
    return data_columns(table) + (list(LINEAGE_COLUMNS) if uses_row_lineage(table) else [])


def changes(spark, catalog_name: str, table, snapshot_id,  # noqa: ANN001
            identifier_columns: Sequence[str] = (), net: bool = False) -> ChangeSet:
    """Change rows of one snapshot, or of ``(start_exclusive, end_inclusive)`` along the ancestry."""
    name = table_name(table)
    keys = validate_identifier_columns(table, tuple(identifier_columns))
    plans = [plan_snapshot(table, sid) for sid in _resolve_range(table, snapshot_id)]
    columns = output_columns(table)
    parts, files_read = [], 0
    for ordinal, plan in enumerate(plans):
        before, after = touched_files(table, plan)
        files_read += len(before) + len(after)
        if before:
            parts.append(_with_change_columns(read_files(spark, catalog_name, table, plan.parent_id, before),
                                              columns, DELETE, plan, ordinal))
        if after:
            parts.append(_with_change_columns(read_files(spark, catalog_name, table, plan.snapshot_id, after),
                                              columns, INSERT, plan, ordinal))
    if not parts:
        empty_plan = plans[-1] if plans else None
        source = read_files(spark, catalog_name, table, table.metadata.current_snapshot().snapshot_id, set())
        parts.append(_with_change_columns(source, columns, INSERT, empty_plan or _NO_PLAN, 0))
    raw = reduce(DataFrame.unionByName, parts)
    row_keys = list(keys) or ([ROW_ID] if uses_row_lineage(table) else [])
    rows = remove_carry_over(raw, cluster_by=[COMMIT_SNAPSHOT_ID, *row_keys] if row_keys else ())
    cached = None
    if row_keys:
        # The duplicate/null key check runs before any sink sees the batch; keep what it computed
        # (change rows after carry-over removal, small next to the rows read) for the real use.
        cached = rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            rows = detect_updates(rows, row_keys, name)
        except Exception:
            cached.unpersist()
            raise
    if net and len(plans) > 1:
        rows = net_changes(rows, row_keys, data_columns(table))
    stats = {"snapshots": len(plans), "files_read": files_read,
             "delete_files_added": sum(len(p.added_delete_files) for p in plans)}
    change_set = ChangeSet(rows=rows, plans=plans, stats=stats, raw_rows=raw)
    if cached is not None:
        weakref.finalize(change_set, cached.unpersist)
    return change_set


_NO_PLAN = SnapshotPlan(table_name="", snapshot_id=0, parent_id=None, sequence_number=0, operation="append",
                        committed_at_ms=0, added_data_files=(), removed_data_files=(), added_delete_files=(),
                        affected_partitions=(), has_delete_files=False, live_delete_files=False)


def export(spark, catalog_name: str, table, snapshot_id: int) -> ChangeSet:  # noqa: ANN001
    """Every row of the snapshot as INSERT (bootstrap batch), read with the current schema."""
    plan = plan_snapshot(table, snapshot_id)
    source = read_files(spark, catalog_name, table, plan.snapshot_id, None)
    rows = _with_change_columns(source, output_columns(table), INSERT, plan, 0)
    return ChangeSet(rows=rows, plans=[plan], stats={"snapshots": 1, "export": True})
