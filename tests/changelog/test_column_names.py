"""Column names Spark would parse (dots, spaces, backticks, unicode) in data, key and partition columns:
per-snapshot changes, net changes and the export on CoW and MoR tables, v2 and v3, against time travel."""

from collections import Counter

import pytest

from icecdc_dagster import changelog
from icecdc_dagster.batch import INSERT, UPDATE_AFTER, UPDATE_BEFORE
from icecdc_dagster.column_names import quote
from icecdc_dagster.errors import DuplicateKeyChangeError
from tests.changelog.workload import apply_changes, mode_properties, rows_at

KEY, KEY2, DATA, TICK, UNI = "the id", "k.ey", "the.data", "a`b", "ünï côde"
KEYS = (KEY, KEY2)


@pytest.mark.parametrize("version,mode", [(2, "copy-on-write"), (2, "merge-on-read"), (3, "copy-on-write"),
                                          (3, "merge-on-read")])
def test_changes_net_and_export_with_names_spark_would_parse(spark, catalog, catalog_settings, version, mode):
    ident = f"{catalog_settings.name}.db.t"
    k, k2, data, tick, uni = (quote(c) for c in (KEY, KEY2, DATA, TICK, UNI))
    spark.sql(f"CREATE TABLE {ident} ({k} bigint NOT NULL, {k2} string NOT NULL, {data} string, {tick} int, "
              f"{uni} struct<{quote('x.y')}: int, {quote('z w')}: string>) USING iceberg "
              f"PARTITIONED BY ({tick}) {mode_properties(version, mode)}")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a.1', 'one', 0, named_struct('x.y', 1, 'z w', 'p')), "
              f"(2, 'a.2', 'two', 0, NULL), (3, 'a.3', NULL, 1, named_struct('x.y', 3, 'z w', NULL)), "
              f"(4, 'a.4', 'four', 1, named_struct('x.y', 4, 'z w', 'q'))")
    spark.sql(f"UPDATE {ident} SET {data} = 'ONE' WHERE {k} = 1")                   # update in place
    spark.sql(f"UPDATE {ident} SET {tick} = 1 WHERE {k} = 2")                       # moves partition
    spark.sql(f"UPDATE {ident} SET {data} = {data} WHERE {k} = 4")                  # no-op rewrite
    spark.sql(f"DELETE FROM {ident} WHERE {k} = 3")
    table = catalog.load_table("db.t")
    plans = changelog.snapshots_after(table, None)
    columns = [KEY, KEY2, DATA, TICK, UNI] + (["_row_id"] if version == 3 else [])
    per_snapshot = []
    for plan in plans:
        rows = changelog.changes(spark, catalog_settings.name, table, plan.snapshot_id, KEYS).rows.collect()
        assert apply_changes(rows_at(spark, ident, plan.parent_id, columns), rows, columns) == \
            rows_at(spark, ident, plan.snapshot_id, columns), f"{plan.operation} {plan.snapshot_id}"
        per_snapshot.append(sorted((r[KEY], r[KEY2], r[DATA], r["_change_type"]) for r in rows))
    assert per_snapshot[1:] == [
        [(1, "a.1", "ONE", UPDATE_AFTER), (1, "a.1", "one", UPDATE_BEFORE)],
        [(2, "a.2", "two", UPDATE_AFTER), (2, "a.2", "two", UPDATE_BEFORE)],
        [] if version == 2 else [(4, "a.4", "four", UPDATE_AFTER), (4, "a.4", "four", UPDATE_BEFORE)],
        [(3, "a.3", None, "DELETE")]]
    net = changelog.changes(spark, catalog_settings.name, table, (plans[0].snapshot_id, plans[-1].snapshot_id),
                            KEYS, net=True).rows.collect()
    assert apply_changes(rows_at(spark, ident, plans[0].snapshot_id, columns), net, columns) == \
        rows_at(spark, ident, plans[-1].snapshot_id, columns)
    keyless = changelog.changes(spark, catalog_settings.name, table, (plans[0].snapshot_id, plans[-1].snapshot_id),
                                net=True).rows.collect()
    assert apply_changes(rows_at(spark, ident, plans[0].snapshot_id, columns), keyless, columns) == \
        rows_at(spark, ident, plans[-1].snapshot_id, columns)
    exported = changelog.export(spark, catalog_settings.name, table, plans[-1].snapshot_id, KEYS).rows
    assert exported.columns[:5] == [KEY, KEY2, DATA, TICK, UNI]
    assert Counter(tuple(r[c] for c in columns) for r in exported.collect()) == \
        rows_at(spark, ident, plans[-1].snapshot_id, columns)
    assert {r["_change_type"] for r in exported.collect()} == {INSERT}


def test_duplicate_key_named_by_its_unusual_column(spark, catalog, catalog_settings):
    ident = f"{catalog_settings.name}.db.t"
    spark.sql(f"CREATE TABLE {ident} ({quote(TICK)} bigint, {quote(DATA)} string) USING iceberg "
              f"{mode_properties(2, 'merge-on-read')}")
    spark.sql(f"INSERT INTO {ident} VALUES (7, 'x'), (7, 'y')")
    table = catalog.load_table("db.t")
    sid = table.metadata.current_snapshot().snapshot_id
    with pytest.raises(DuplicateKeyChangeError, match=rf"snapshot {sid}: key \{{'a`b': 7\}} has 2 INSERT"):
        changelog.changes(spark, catalog_settings.name, table, sid, [TICK])
