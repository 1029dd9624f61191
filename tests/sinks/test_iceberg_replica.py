"""Replica sink on real Iceberg tables, with hand-built change events (export, CDC batches, reruns)."""

from functools import partial

import pytest

from icecdc_dagster import changelog
from icecdc_dagster.batch import BatchInfo
from icecdc_dagster.errors import CheckpointError
from icecdc_dagster.sinks.iceberg import IcebergReplicaSink
from icecdc_dagster.steps.batches import compute_batch, keys_to_request
from icecdc_dagster.steps.changelog_store import ChangelogStore

CHANGE_SCHEMA = ("id long, name string, day date, _change_type string, _commit_snapshot_id long, "
                 "_commit_sequence_number long, _change_ordinal long")


def _events(spark, rows, snapshot_id, seq):
    """Hand-built change rows of one snapshot as a sink is given them: CDC events, the last of a key's changes."""
    import datetime as dt

    data = [(i, n, dt.date(2024, 1, 1 + i % 28), ct, snapshot_id, seq, o) for o, (ct, i, n) in enumerate(rows)]
    return changelog.to_events(spark.createDataFrame(data, CHANGE_SCHEMA), "db.src", ("id",), "overwrite",
                               snapshot_id, use_row_id=False)


def _batch(snapshot_id, seq, preds, export=False):
    return BatchInfo("db.src", snapshot_id, seq, snapshot_id, tuple(preds), "overwrite", 0, is_export=export,
                     identifier_columns=("id",))


@pytest.mark.parametrize("version,mode,catalog_settings", [
    (2, "merge-on-read", "sql"), (3, "merge-on-read", "sql"), (2, "copy-on-write", "sql"),
    (3, "merge-on-read", "rest")], indirect=["catalog_settings"])
def test_replica_export_then_batches(spark, catalog, catalog_settings, version, mode):
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.src (id bigint NOT NULL, name string, day date) USING iceberg "
              f"PARTITIONED BY (days(day)) TBLPROPERTIES ('format-version'='{version}', "
              f"'write.merge.mode'='{mode}', 'write.update.mode'='{mode}', 'write.delete.mode'='{mode}')")
    sink = IcebergReplicaSink(spark, cat, catalog, "db.dst", catalog.load_table("db.src"), ("id",), write_mode=mode)
    assert sink.read_checkpoint() is None
    with pytest.raises(CheckpointError):
        sink.apply(_batch(10, 1, [9]), _events(spark, [("INSERT", 1, "a")], 10, 1))

    export = _events(spark, [("INSERT", i, f"n{i}") for i in range(6)], 100, 1)
    result = sink.apply(_batch(100, 1, [], export=True), export)
    assert not result.skipped and result.counts["inserted"] == 6
    assert result.event_counts == {"INSERT": 6}  # counted by the write's own tasks, not by a job of their own
    target = catalog.load_table("db.dst")
    assert [f.transform.__class__.__name__ for f in target.spec().fields] == ["DayTransform"]
    assert target.schema().identifier_field_names() == {"id"}
    assert target.format_version == version
    assert target.properties["write.merge.mode"] == mode

    # update 1 (before+after), delete 2, insert 7, insert+delete 8 in one batch, two updates of 3 (last wins)
    changes = [("UPDATE_BEFORE", 1, "n1"), ("UPDATE_AFTER", 1, "x1"), ("DELETE", 2, "n2"), ("INSERT", 7, "n7"),
               ("INSERT", 8, "n8"), ("DELETE", 8, "n8"), ("UPDATE_AFTER", 3, "y3"), ("UPDATE_AFTER", 3, "z3")]
    result = sink.apply(_batch(101, 2, [100]), _events(spark, changes, 101, 2))
    assert result.counts == {"updated": 2, "deleted": 1, "inserted": 1, "delete_missing": 1}
    # every event the sink was given, as the caller's aggregate would count them (the last change of each key)
    assert result.event_counts == {"UPDATE_AFTER": 2, "DELETE": 2, "INSERT": 1}
    expected = {0: "n0", 1: "x1", 3: "z3", 4: "n4", 5: "n5", 7: "n7"}
    got = {r.id: r.name for r in spark.table(f"{cat}.db.dst").collect()}
    assert got == expected
    assert sink.read_checkpoint().snapshot_id == 101

    # rerun: no-op, no new snapshot
    snaps = len(catalog.load_table("db.dst").snapshots())
    assert sink.apply(_batch(101, 2, [100]), _events(spark, changes, 101, 2)).skipped
    assert len(catalog.load_table("db.dst").snapshots()) == snaps

    # pyiceberg reads the (merge-on-read) result; Spark wrote no equality deletes
    table = catalog.load_table("db.dst")
    assert {r["id"]: r["name"] for r in table.scan().to_arrow().to_pylist()} == expected
    assert table.current_snapshot().summary["total-equality-deletes"] == "0"
    if mode == "merge-on-read":
        assert int(table.current_snapshot().summary["total-delete-files"]) > 0


@pytest.mark.parametrize("version,source_mode,created", [
    (2, "copy-on-write", "merge-on-read"), (1, "copy-on-write", "copy-on-write")])
def test_a_replica_is_created_merge_on_read_unless_its_format_has_no_delete_files(spark, catalog, catalog_settings,
                                                                                 version, source_mode, created):
    """The sink's default write mode, whatever the source's (a replica takes one small MERGE per batch); format v1
    has no delete files, so a v1 replica stays copy-on-write. Either way a batch applies exactly."""
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.src (id bigint NOT NULL, name string) USING iceberg "
              f"TBLPROPERTIES ('format-version'='{version}', 'write.merge.mode'='{source_mode}', "
              f"'write.update.mode'='{source_mode}', 'write.delete.mode'='{source_mode}')")
    sink = IcebergReplicaSink(spark, cat, catalog, "db.dst", catalog.load_table("db.src"), ("id",))
    sink.apply(_batch(100, 1, [], export=True), _events(spark, [("INSERT", i, f"n{i}") for i in range(4)], 100, 1))
    result = sink.apply(_batch(101, 2, [100]), _events(spark, [("UPDATE_AFTER", 1, "x1"), ("DELETE", 2, "n2")], 101, 2))
    target = catalog.load_table("db.dst")
    assert {target.properties[f"write.{op}.mode"] for op in ("merge", "update", "delete")} == {created}
    assert target.format_version == version
    assert result.counts == {"updated": 1, "deleted": 1, "inserted": 0, "delete_missing": 0}
    assert {r.id: r.name for r in spark.table(f"{cat}.db.dst").collect()} == {0: "n0", 1: "x1", 3: "n3"}
    deletes = int(target.current_snapshot().summary.get("total-delete-files", "0"))
    assert (deletes > 0) == (created == "merge-on-read")


def test_replica_propagates_added_column(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.src (id bigint NOT NULL, name string, day date) USING iceberg "
              "TBLPROPERTIES ('format-version'='2')")
    sink = IcebergReplicaSink(spark, cat, catalog, "db.dst", "db.src", ("id",))
    sink.apply(_batch(100, 1, [], export=True), _events(spark, [("INSERT", 1, "a"), ("INSERT", 2, "b")], 100, 1))
    spark.sql(f"ALTER TABLE {cat}.db.src ADD COLUMN score double")
    events = _events(spark, [("UPDATE_AFTER", 1, "a2")], 101, 2).selectExpr("*", "1.5d AS score")
    result = sink.apply(_batch(101, 2, [100]), events)
    assert result.details["added_columns"] == ["score"]
    got = {r.id: (r.name, r.score) for r in spark.table(f"{cat}.db.dst").collect()}
    assert got == {1: ("a2", 1.5), 2: ("b", None)}


def _stored(spark, cat, catalog, snapshot_id, bootstrap_id):
    """The batch as the changelog asset computes and stores it; the store it is in."""
    request = keys_to_request("db.src", [str(snapshot_id)], [str(bootstrap_id)], False, ("id",))
    store = ChangelogStore(spark, cat, "db.src")
    with changelog.staged_scans(spark):
        computed = compute_batch(spark, cat, catalog.load_table("db.src"), request)
        store.write(computed.info, computed.rows)
    return store, computed.info


def _jobs_of(spark, label, apply):
    """The Spark jobs ``apply()`` ran (tagged with a job group of their own)."""
    spark.sparkContext.setJobGroup(label, label)
    try:
        apply()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(label))


def test_a_stored_batchs_key_range_spares_the_replica_an_aggregate(spark, catalog, catalog_settings):
    """With the key range read from the store's file statistics, a replica applies a batch with one Spark job
    fewer (no aggregate finds its MERGE's key bounds), to the same rows as with the aggregate; and a created
    replica merges its manifests early (every MERGE plans its read from them)."""
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.src (id bigint NOT NULL, name string) USING iceberg "
              "TBLPROPERTIES ('format-version'='2', 'write.update.mode'='copy-on-write')")
    spark.sql(f"INSERT INTO {cat}.db.src SELECT id, CAST(id AS string) FROM range(100)")
    first = catalog.load_table("db.src").current_snapshot().snapshot_id
    sinks = {name: IcebergReplicaSink(spark, cat, catalog, f"db.{name}", catalog.load_table("db.src"), ("id",))
             for name in ("ranged", "aggregated")}
    store, info = _stored(spark, cat, catalog, first, first)
    for name, sink in sinks.items():
        sink.apply(info, store.read_events(info, use_row_id=False))
    jobs = {}
    for i in range(3):
        spark.sql(f"MERGE INTO {cat}.db.src t USING (SELECT id, id = {50 + i} AS gone FROM range(100) "
                  f"WHERE id % 7 = {i} OR id = {50 + i}) s ON t.id = s.id "
                  f"WHEN MATCHED AND s.gone THEN DELETE WHEN MATCHED THEN UPDATE SET name = 'u{i}'")
        snapshot = catalog.load_table("db.src").current_snapshot().snapshot_id
        store, info = _stored(spark, cat, catalog, snapshot, first)
        for name, sink in sinks.items():
            ranges = partial(store.column_ranges, info) if name == "ranged" else None
            jobs[name] = _jobs_of(spark, f"{name}-{i}", lambda s=sink, r=ranges: s.apply(
                info, store.read_events(info, use_row_id=False), r))
        assert jobs["ranged"] == jobs["aggregated"] - 1, jobs
    source = sorted(spark.table(f"{cat}.db.src").collect())
    assert sorted(spark.table(f"{cat}.db.ranged").collect()) == source
    assert sorted(spark.table(f"{cat}.db.aggregated").collect()) == source
    assert catalog.load_table("db.ranged").properties["commit.manifest.min-count-to-merge"] == "8"
