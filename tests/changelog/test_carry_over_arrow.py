"""Carry-over removal in Arrow (inside Spark tasks) against the Spark path and Iceberg's changelog view.

The Spark path (``carry_over="spark"``: a shuffle and a sort of every row read) is the reference; the
Arrow path must give the same change rows on every copy-on-write snapshot, v2 (exact multiset matching
of every column) and v3 (row lineage, no value compared), and Iceberg's create_changelog_view agrees on
v2 where it can be the oracle (no binary; no maps without keys).
"""

import decimal
from collections import Counter

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from icecdc_dagster import changelog
from icecdc_dagster.batch import CHANGE_TYPE, COMMIT_SNAPSHOT_ID, DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from icecdc_dagster.changelog.carry_over import pack, schema_supported, unmatched, unmatched_by_lineage
from icecdc_dagster.column_names import quote
from tests.changelog.test_properties import COMMON, Workload, as_counter, compared_columns, programs, tables, view_rows
from tests.changelog.workload import apply_changes, mode_properties, rows_at

# --- the matching itself (no Spark) ---------------------------------------------------------------

NESTED = pa.struct([("a", pa.int32()), ("b", pa.list_(pa.string()))])
MAP = pa.map_(pa.string(), pa.decimal128(38, 10))


def side(keys: list, structs: list, maps: list, floats: list) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "s": pa.array(structs, NESTED), "m": pa.array(maps, MAP),
                     "f": pa.array(floats, pa.float64())})


def colliding(df: pl.DataFrame) -> pl.Series:
    """A row hash under which every row collides: the exact fallback matches everything."""
    return pl.Series([7] * df.height, dtype=pl.UInt64)


HASHES = [pytest.param(None, id="row-hash"), pytest.param(colliding, id="all-collide")]


@pytest.mark.parametrize("row_hash", HASHES)
def test_unmatched_is_a_multiset_difference_exact_on_nested_values_and_nulls(row_hash):
    """Three identical DELETEs and two identical INSERTs leave one DELETE; a null struct is not a struct
    of nulls, an empty list not a null one; null equals null, -0.0 equals 0.0, NaN equals NaN (as in
    Spark's grouping). The same when every row hash collides."""
    one = [("x", decimal.Decimal("1.5"))]
    deleted = side([1, 1, 1, 2, 3, 4, 5],
                   [{"a": 1, "b": ["x"]}] * 3 + [None, {"a": 1, "b": []}, {"a": None, "b": None}, None],
                   [one] * 3 + [None, [], None, None], [0.5] * 3 + [None, float("nan"), 0.0, 1.0])
    added = side([1, 1, 2, 3, 4, 5, 6],
                 [{"a": 1, "b": ["x"]}] * 2 + [{"a": None, "b": None}, {"a": 1, "b": None}, {"a": None, "b": None},
                                               None, None],
                 [one] * 2 + [None, [], None, None, None], [0.5] * 2 + [None, float("nan"), -0.0, 1.0, 1.0])
    kept_deleted, kept_added = unmatched(deleted, added, row_hash)
    assert sorted(kept_deleted["k"].to_pylist()) == [1, 2, 3]
    assert sorted(kept_added["k"].to_pylist()) == [2, 3, 6]
    assert kept_deleted.filter(pa.compute.equal(kept_deleted["k"], 1))["m"].to_pylist() == [
        [("x", decimal.Decimal("1.5000000000"))]]


@pytest.mark.parametrize("row_hash", HASHES)
def test_unmatched_keeps_every_copy_without_a_partner(row_hash):
    deleted = side([7, 7, 8], [None, None, None], [None, None, None], [1.0, 1.0, 2.0])
    added = side([7, 7, 7, 7, 9], [None] * 5, [None] * 5, [1.0] * 4 + [2.0])
    kept_deleted, kept_added = unmatched(deleted, added, row_hash)
    assert (kept_deleted["k"].to_pylist(), sorted(kept_added["k"].to_pylist())) == ([8], [7, 7, 9])
    kept_deleted, kept_added = unmatched(added, deleted, row_hash)
    assert (sorted(kept_deleted["k"].to_pylist()), kept_added["k"].to_pylist()) == ([7, 7, 9], [8])


def test_lineage_cancels_by_sequence_number_and_row_id_only():
    """v3: an added row last updated before the snapshot (sequence 5) is carried over with its removed row;
    an update (same row id, new sequence number) and a delete stay, whatever the values."""
    deleted = pa.table({"v": ["a", "b", "c"], "_row_id": [0, 1, 2], "_last_updated_sequence_number": [1, 1, 3]})
    added = pa.table({"v": ["a", "b", "new"], "_row_id": [0, 1, 9], "_last_updated_sequence_number": [1, 5, 5]})
    kept_deleted, kept_added = unmatched_by_lineage(deleted, added, 5)
    assert kept_deleted["_row_id"].to_pylist() == [1, 2]
    assert kept_added["_row_id"].to_pylist() == [1, 9]


def test_pack_balances_bytes_over_at_most_one_bin_per_slot():
    assert pack([5, 1, 4, 2, 3], 2) == [[0, 3, 1], [2, 4]]
    assert pack([7], 4) == [[0]]
    assert sorted(i for b in pack(list(range(20)), 3) for i in b) == list(range(20))


def test_types_pyiceberg_reads_wrong_take_the_spark_path():
    """pyiceberg 0.12 reads a null list of structs or a null map of struct values as an empty one."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, ListType, MapType, NestedField, StringType, StructType

    inner = StructType(NestedField(10, "f", IntegerType(), required=False))
    fine = Schema(NestedField(1, "s", StructType(NestedField(2, "m", MapType(3, StringType(), 4,
                                                                                  ListType(5, IntegerType())))),
                              required=False))
    assert schema_supported(fine)
    for nested in (ListType(6, inner), MapType(7, StringType(), 8, inner)):
        assert not schema_supported(Schema(NestedField(1, "s", StructType(NestedField(9, "x", nested)))))


# --- real tables: Arrow path = Spark path (= Iceberg's view) --------------------------------------

def change_counter(change_set, columns: list[str]) -> Counter:
    return as_counter(change_set.rows.collect(), columns)


def compare_paths(spark, catalog, catalog_name: str, name: str, keys: tuple, columns: list[str],
                  view_names: list[str] | None = None, **arrow_options) -> int:
    """Every snapshot: Arrow path == Spark path (== view, when ``view_names``); returns the Arrow groups used.
    On v3 every Arrow group is matched by row lineage."""
    source = catalog.load_table(name)
    groups = 0
    for plan in changelog.snapshots_after(source, None):
        where = f"{plan.operation} snapshot {plan.snapshot_id} of {name}"
        arrow = changelog.changes(spark, catalog_name, source, plan.snapshot_id, keys,
                                 **{"carry_over": "arrow", **arrow_options})
        reference = changelog.changes(spark, catalog_name, source, plan.snapshot_id, keys, carry_over="spark")
        assert reference.stats["carry_over_groups_in_arrow"] == 0
        got = change_counter(arrow, columns)
        assert got == change_counter(reference, columns), where
        if "rows_read" in arrow.stats:  # from the files' record counts: the count of the rows as read
            assert arrow.stats["rows_read"] == reference.raw_rows.count(), where
        groups += arrow.stats["carry_over_groups_in_arrow"]
        lineage = arrow.stats["carry_over_groups_by_lineage"]
        assert lineage == (arrow.stats["carry_over_groups_in_arrow"] if plan.format_version >= 3 else 0), where
        if view_names is not None:
            options = (f"compute_updates => true, identifier_columns => array('{quote(keys[0])}')" if keys
                       else "compute_updates => false")
            assert as_counter(arrow.rows.collect(), view_names) == view_rows(
                spark, catalog_name, name, view_names, plan.parent_id, plan.snapshot_id, options), where
    return groups


@pytest.mark.long
def test_duplicates_nested_nulls_and_partitions_match_spark_and_the_view(spark, catalog, catalog_settings):
    """Keyless CoW v2, partitioned: identical duplicate rows (multiset), nulls and a struct of lists,
    an update of one of two identical rows, a partition move, a delete of every copy."""
    ident = f"{catalog_settings.name}.db.t"
    spark.sql(f"CREATE TABLE {ident} (p int, v string, s struct<a: int, l: array<string>>, n double) USING iceberg "
              f"PARTITIONED BY (p) {mode_properties(2, 'copy-on-write')}")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a', named_struct('a', 1, 'l', array('x', NULL)), NULL), "
              f"(1, 'a', named_struct('a', 1, 'l', array('x', NULL)), NULL), (1, 'a', named_struct('a', 1, 'l', "
              f"array('x', NULL)), NULL), (1, NULL, NULL, 2.5), (2, 'b', named_struct('a', NULL, 'l', NULL), 0.0), "
              f"(2, 'c', named_struct('a', 2, 'l', array()), -1.0), (3, 'd', NULL, NULL)")
    spark.sql(f"UPDATE {ident} SET n = 7.0 WHERE p = 1 AND v IS NULL")
    spark.sql(f"DELETE FROM {ident} WHERE v = 'b'")
    spark.sql(f"UPDATE {ident} SET p = 3 WHERE v = 'c'")
    spark.sql(f"INSERT INTO {ident} SELECT * FROM {ident} WHERE p = 1 AND v = 'a'")
    spark.sql(f"DELETE FROM {ident} WHERE p = 1 AND n IS NULL AND v = 'a' AND s.a = 1")
    columns = ["p", "v", "s", "n"]
    groups = compare_paths(spark, catalog, catalog_settings.name, "db.t", (), columns, view_names=columns)
    assert groups >= 3
    table = catalog.load_table("db.t")
    update = changelog.plan_snapshot(table, changelog.snapshots_after(table, None)[1].snapshot_id)
    rows = changelog.changes(spark, catalog_settings.name, table, update.snapshot_id,
                            carry_over="arrow").rows.collect()
    assert sorted((r["n"], r[CHANGE_TYPE]) for r in rows) == [(2.5, DELETE), (7.0, INSERT)]
    # groups larger than a task may hold go the Spark way, with the same result
    assert compare_paths(spark, catalog, catalog_settings.name, "db.t", (), columns, max_group_bytes=0) == 0


@pytest.mark.parametrize("version", [2, 3])
def test_keyed_updates_and_partition_evolution(spark, catalog, catalog_settings, version):
    """Keyed CoW: updates found across partitions; after a partition spec change a rewrite moves rows from
    the old spec's files to the new spec's (one group), still cancelled."""
    ident = f"{catalog_settings.name}.db.t"
    spark.sql(f"CREATE TABLE {ident} (id bigint NOT NULL, p int, v string, m map<string, int>) USING iceberg "
              f"PARTITIONED BY (p) {mode_properties(version, 'copy-on-write')}")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 1, 'a', map('x', 1)), (2, 1, 'b', NULL), (3, 2, 'c', map()), "
              f"(4, 2, 'd', NULL)")
    spark.sql(f"UPDATE {ident} SET p = 2 WHERE id = 1")
    spark.sql(f"ALTER TABLE {ident} ADD PARTITION FIELD bucket(2, id)")
    spark.sql(f"UPDATE {ident} SET v = 'bb' WHERE id = 2")
    spark.sql(f"ALTER TABLE {ident} RENAME COLUMN v TO w")
    spark.sql(f"UPDATE {ident} SET m = map('y', 2) WHERE id = 3")
    columns = ["id", "p", "w", "m"] + (["_row_id", "_last_updated_sequence_number"] if version >= 3 else [])
    groups = compare_paths(spark, catalog, catalog_settings.name, "db.t", ("id",), columns)
    assert groups >= 3
    table = catalog.load_table("db.t")
    last = table.metadata.current_snapshot().snapshot_id
    rows = changelog.changes(spark, catalog_settings.name, table, last, ["id"], carry_over="arrow").rows.collect()
    assert sorted(((r["id"], r["w"], r["m"], r[CHANGE_TYPE]) for r in rows), key=lambda r: r[3]) == [
        (3, "c", {"y": 2}, UPDATE_AFTER), (3, "c", {}, UPDATE_BEFORE)]


# --- Hypothesis: random CoW workloads -------------------------------------------------------------

COW_KINDS = [  # version, keyed, maps allowed, binary allowed, the view is an oracle
    pytest.param(2, True, True, False, True, id="cow-v2-keys"),
    pytest.param(2, False, False, False, True, id="cow-v2-keyless"),
    pytest.param(2, False, True, True, False, id="cow-v2-keyless-maps-binary"),
    pytest.param(3, True, True, True, False, id="cow-v3-keys"),
    pytest.param(3, False, True, True, False, id="cow-v3-row-id"),
]


# The default run's one example is Hypothesis' simplest draw: an unpartitioned table and a MERGE whose updates
# write the rows it found (minimal values), so nothing but carry-overs. It is made to hold what the Arrow path
# is for: a partitioned table, updates that change non-key values (to NULL, from the simplest non-null value),
# and a compaction between them.
RICH_STEPS = [("set_null", [0, 1], 0), ("compact",), ("set_null", [2], 1)]


def arrow_readable(dtype) -> bool:  # noqa: ANN001
    """No list of structs or map of struct values inside (pyiceberg reads their nulls wrong: the Spark way,
    see ``schema_supported``): a table of such columns never exercises the Arrow path."""
    if isinstance(dtype, T.ArrayType):
        return not isinstance(dtype.elementType, T.StructType) and arrow_readable(dtype.elementType)
    if isinstance(dtype, T.MapType):
        return not isinstance(dtype.valueType, T.StructType) and all(
            arrow_readable(t) for t in (dtype.keyType, dtype.valueType))
    if isinstance(dtype, T.StructType):
        return all(arrow_readable(f.dataType) for f in dtype.fields)
    return True


def rich_table(table) -> bool:  # noqa: ANN001
    return bool(table.partition) and all(arrow_readable(t) for _, t in table.columns)


def check_workload(spark, catalog, catalog_name: str, data, version: int, keyed: bool, allow_maps: bool,  # noqa: ANN001
                   allow_binary: bool, view: bool, rich: bool = False) -> None:
    drawn = tables(version, "copy-on-write", keyed, allow_maps, allow_binary)
    table = data.draw(drawn.filter(rich_table) if rich else drawn, label="table")
    workload = Workload(spark, catalog_name, table)
    program = data.draw(programs(table), label="program") + (RICH_STEPS if rich else [])
    for step in program:
        workload.run(step)
    keys = (table.key,) if keyed else ()
    columns = compared_columns(table)
    groups = compare_paths(spark, catalog, catalog_name, workload.name, keys, columns,
                           view_names=table.names if view else None)
    assert groups > 0, f"the Arrow path never ran on {table}"
    source = catalog.load_table(workload.name)
    for plan in changelog.snapshots_after(source, None):  # and the Arrow path replays the table's history
        rows = changelog.changes(spark, catalog_name, source, plan.snapshot_id, keys,
                                 carry_over="arrow").rows.collect()
        assert apply_changes(rows_at(spark, workload.ident, plan.parent_id, columns), rows, columns) == rows_at(
            spark, workload.ident, plan.snapshot_id, columns), f"{plan.operation} {plan.snapshot_id} of {table}"
        assert {r[COMMIT_SNAPSHOT_ID] for r in rows} <= {plan.snapshot_id}


@pytest.mark.parametrize("version,keyed,allow_maps,allow_binary,view", [  # the rest: -m slow, and the deep run
    p if p.id in ("cow-v2-keys", "cow-v3-row-id") else pytest.param(*p.values, marks=pytest.mark.slow, id=p.id)
    for p in COW_KINDS])
@settings(max_examples=1, **COMMON)
@given(data=st.data())
def test_arrow_path_matches_spark_path_and_view(spark, catalog, catalog_settings, version, keyed, allow_maps,
                                                allow_binary, view, data):
    check_workload(spark, catalog, catalog_settings.name, data, version, keyed, allow_maps, allow_binary, view,
                   rich=True)


@pytest.mark.slow
@pytest.mark.parametrize("version,keyed,allow_maps,allow_binary,view", COW_KINDS)
@settings(max_examples=12, derandomize=False, **COMMON)
@given(data=st.data())
def test_arrow_path_matches_spark_path_and_view_deep(spark, catalog, catalog_settings, version, keyed, allow_maps,
                                                     allow_binary, view, data):
    check_workload(spark, catalog, catalog_settings.name, data, version, keyed, allow_maps, allow_binary, view)
