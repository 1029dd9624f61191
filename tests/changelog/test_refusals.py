"""Tables the engine cannot read correctly are refused with a named error that says why and what to do:
no snapshot yet; and an export whose keys do not identify a row fails like a CDC batch."""

import pytest

from icecdc_dagster import changelog
from icecdc_dagster.batch import COMMIT_TIMESTAMP, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from icecdc_dagster.errors import (
    DuplicateKeyChangeError,
    IdentifierColumnError,
    SnapshotNotFoundError,
    TableHasNoSnapshotError,
)
from tests.changelog.workload import mode_properties


def test_table_without_snapshot_is_a_named_error(spark, catalog, catalog_settings):
    spark.sql(f"CREATE TABLE {catalog_settings.name}.db.t (id bigint, v string) USING iceberg "
              f"{mode_properties(2, 'merge-on-read')}")
    table = catalog.load_table("db.t")
    changelog.check_supported(table)  # a fresh v2 table is supported; it just has nothing to read yet
    expected = r"table db\.t has no snapshot: it was created but never written"
    with pytest.raises(TableHasNoSnapshotError, match=expected):
        changelog.changes(spark, catalog_settings.name, table, (None, None), ["id"], net=True)
    with pytest.raises(TableHasNoSnapshotError, match=expected):
        changelog.changes(spark, catalog_settings.name, table, 123)
    with pytest.raises(TableHasNoSnapshotError, match=expected):
        changelog.export(spark, catalog_settings.name, table, 123, ["id"])
    assert issubclass(TableHasNoSnapshotError, SnapshotNotFoundError)


def test_format_v1_is_followed_and_after_an_upgrade_ties_are_ordered(spark, catalog, catalog_settings):
    """v1 snapshots have sequence number 0: the line numbers them by ancestry (test_format_v1), so the
    update chain a -> b -> c -> d nets to a -> d. After the upgrade to v2 the old snapshots keep sequence
    number 0 and, ordered by their position in the range, still net to a -> d."""
    ident = f"{catalog_settings.name}.db.t"
    spark.sql(f"CREATE TABLE {ident} (id bigint NOT NULL, v string) USING iceberg "
              f"TBLPROPERTIES ('format-version'='1')")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a'), (2, 'x')")
    for value in ("b", "c", "d"):
        spark.sql(f"UPDATE {ident} SET v = '{value}' WHERE id = 1")
    table = catalog.load_table("db.t")
    plans = changelog.snapshots_after(table, None)
    assert {p.sequence_number for p in plans} == {0}
    changelog.check_supported(table)
    expected = [(1, "a", UPDATE_BEFORE, plans[1].snapshot_id), (1, "d", UPDATE_AFTER, plans[-1].snapshot_id)]
    net = changelog.changes(spark, catalog_settings.name, table, (plans[0].snapshot_id, plans[-1].snapshot_id),
                            ["id"], net=True).rows.collect()
    assert sorted((r["id"], r["v"], r["_change_type"], r["_commit_snapshot_id"]) for r in net) == expected

    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ('format-version'='2')")
    table = catalog.load_table("db.t")
    changelog.check_supported(table)
    net = changelog.changes(spark, catalog_settings.name, table, (plans[0].snapshot_id, plans[-1].snapshot_id),
                            ["id"], net=True).rows.collect()
    assert sorted((r["id"], r["v"], r["_change_type"], r["_commit_snapshot_id"]) for r in net) == expected
    assert {r["_commit_sequence_number"] for r in net} == {0}


def test_export_fails_on_duplicate_or_null_keys_like_a_cdc_batch(spark, catalog, catalog_settings):
    ident = f"{catalog_settings.name}.db.t"
    spark.sql(f"CREATE TABLE {ident} (id bigint, v string) USING iceberg {mode_properties(2, 'copy-on-write')}")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a'), (1, 'b'), (2, 'c')")
    table = catalog.load_table("db.t")
    sid = table.metadata.current_snapshot().snapshot_id
    with pytest.raises(DuplicateKeyChangeError,
                       match=rf"table db\.t, snapshot {sid}: key \{{'id': 1\}} is held by 2 rows of the export"):
        changelog.export(spark, catalog_settings.name, table, sid, ["id"])
    # the same rows are fine under a key that does identify them, and without keys
    assert changelog.export(spark, catalog_settings.name, table, sid, ["id", "v"]).rows.count() == 3
    assert changelog.export(spark, catalog_settings.name, table, sid).rows.count() == 3

    spark.sql(f"INSERT INTO {ident} VALUES (NULL, 'n')")
    table = catalog.load_table("db.t")
    null_sid = table.metadata.current_snapshot().snapshot_id
    with pytest.raises(IdentifierColumnError,
                       match=rf"column\(s\) id of table db\.t hold null in snapshot {null_sid} .*must not be null"):
        changelog.export(spark, catalog_settings.name, table, null_sid, ["id", "v"])


@pytest.mark.parametrize("version,mode", [(2, "copy-on-write"), (3, "merge-on-read")])
def test_change_rows_carry_their_commit_timestamp(spark, catalog, catalog_settings, version, mode):
    """_commit_timestamp is the snapshot's commit time (a UTC instant), on changes, net changes and the
    export; it is not data: rows rewritten unchanged by later snapshots are still carry-over."""
    ident = f"{catalog_settings.name}.db.t"
    spark.sql(f"CREATE TABLE {ident} (id bigint NOT NULL, v string) USING iceberg {mode_properties(version, mode)}")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"UPDATE {ident} SET v = 'a2' WHERE id = 1")
    spark.sql(f"UPDATE {ident} SET v = 'a' WHERE id = 1")
    table = catalog.load_table("db.t")
    committed = {r.snapshot_id: r.committed_at for r in
                 spark.sql(f"SELECT snapshot_id, committed_at FROM {ident}.snapshots").collect()}
    plans = changelog.snapshots_after(table, None)
    exported = changelog.export(spark, catalog_settings.name, table, plans[0].snapshot_id).rows
    assert dict(exported.dtypes)[COMMIT_TIMESTAMP] == "timestamp"
    for plan in plans:
        rows = changelog.changes(spark, catalog_settings.name, table, plan.snapshot_id, ["id"]).rows.collect()
        assert rows and {r[COMMIT_TIMESTAMP] for r in rows} == {committed[plan.snapshot_id]}
        assert round(rows[0][COMMIT_TIMESTAMP].timestamp() * 1000) == plan.committed_at_ms  # local -> epoch
    assert {r[COMMIT_TIMESTAMP] for r in exported.collect()} == {committed[plans[0].snapshot_id]}
    net = changelog.changes(spark, catalog_settings.name, table, (plans[0].snapshot_id, plans[-1].snapshot_id),
                            ["id"], net=True).rows.collect()
    if version == 2:
        assert net == []  # a -> a2 -> a: nothing changed, whatever the commit times
    else:  # the row's lineage changed (_last_updated_sequence_number), so v3 reports an update
        assert sorted((r["v"], r["_change_type"]) for r in net) == [("a", UPDATE_AFTER), ("a", UPDATE_BEFORE)]
    keyless = changelog.changes(spark, catalog_settings.name, table, (None, plans[-1].snapshot_id),
                                net=True).rows.collect()
    assert sorted((r["id"], r["v"], r["_change_type"]) for r in keyless) == [(1, "a", INSERT), (2, "b", INSERT)]
