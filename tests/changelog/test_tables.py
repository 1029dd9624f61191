"""Changelog on hand-made tables: column types, schema and partition spec evolution, cross-partition
updates, equality deletes, plans, and the named errors."""

import base64
import decimal
from collections import Counter

import pytest

from icecdc_dagster import changelog
from icecdc_dagster.batch import DELETE, UPDATE_AFTER, UPDATE_BEFORE
from icecdc_dagster.changelog import engine
from icecdc_dagster.changelog import plan as plan_module
from icecdc_dagster.changelog.read import _manifest_may_hold, java_data_file_changes, java_table
from icecdc_dagster.errors import DuplicateKeyChangeError, IdentifierColumnError, SnapshotNotFoundError
from tests.changelog.workload import apply_changes, create_table, mode_properties, rows_at, run_workload
from tests.helpers import BOTH_CATALOGS


def current(catalog, name="db.t"):
    table = catalog.load_table(name)
    return table, table.metadata.current_snapshot().snapshot_id


def change_types(rows) -> Counter:
    return Counter(r["_change_type"] for r in rows)


@BOTH_CATALOGS
@pytest.mark.parametrize("version,mode", [(2, "copy-on-write"), (3, "merge-on-read")])
def test_rich_types_compare_by_value_and_document_ids(spark, catalog, catalog_settings, version, mode):
    """Binary/decimal/timestamptz/date/struct/list/map rows rewritten unchanged are carry-over
    (binary by value, unlike Iceberg's view); a real change of a nested value is an update."""
    ident = f"{catalog_settings.name}.db.t"
    spark.sql(f"CREATE TABLE {ident} (k binary NOT NULL, d decimal(10,2), ts timestamp, day date, "
              f"s struct<a: int, b: string>, l array<int>, m map<string, int>, grp int) USING iceberg "
              f"PARTITIONED BY (grp) {mode_properties(version, mode)}")
    spark.sql(f"INSERT INTO {ident} VALUES "
              "(X'0102', 12.50, TIMESTAMP'2024-01-31 10:00:00+02:00', DATE'2024-01-31', named_struct('a', 1, 'b', 'x'), "
              "array(1, 2), map('a', 1, 'b', 2), 1), "
              "(X'03', NULL, NULL, NULL, NULL, NULL, NULL, 1), "
              "(X'04', 0.10, TIMESTAMP'2024-02-01 00:00:00Z', DATE'2024-02-01', named_struct('a', 2, 'b', NULL), "
              "array(), map(), 1)")
    spark.sql(f"UPDATE {ident} SET m = map('a', 1, 'b', 3) WHERE k = X'04'")
    table, sid = current(catalog)
    rows = changelog.changes(spark, catalog_settings.name, table, sid, ["k"]).rows.collect()
    assert sorted((bytes(r["k"]), r["_change_type"]) for r in rows) == [(b"\x04", UPDATE_AFTER),
                                                                        (b"\x04", UPDATE_BEFORE)]
    after = next(r for r in rows if r["_change_type"] == UPDATE_AFTER)
    assert after["m"] == {"a": 1, "b": 3} and after["d"] == decimal.Decimal("0.10")

    events = changelog.to_events(changelog.export(spark, catalog_settings.name, table, sid).rows, "db.t",
                                 ["k", "d", "ts", "day"], "append", sid, use_row_id=False).collect()
    ids = {bytes(e["k"]): e["document_id"] for e in events}
    assert ids[b"\x01\x02"] == "|".join([base64.b64encode(b"\x01\x02").decode(), "12.50",
                                         "2024-01-31T08:00:00.000000Z", "2024-01-31"])
    assert ids[b"\x04"] == "BA==|0.10|2024-02-01T00:00:00.000000Z|2024-02-01"
    assert {e["bulk_action"] for e in events} == {"INDEX"}


def test_schema_evolution_reads_old_files_with_current_schema(spark, catalog, catalog_settings):
    ident = f"{catalog_settings.name}.db.t"
    spark.sql(f"CREATE TABLE {ident} (id bigint NOT NULL, a int, old string, gone string) USING iceberg "
              f"{mode_properties(2, 'merge-on-read')}")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 10, 'x', 'g'), (2, 20, 'y', 'g')")
    spark.sql(f"ALTER TABLE {ident} ADD COLUMN added string")
    spark.sql(f"ALTER TABLE {ident} RENAME COLUMN old TO renamed")
    spark.sql(f"ALTER TABLE {ident} DROP COLUMN gone")
    spark.sql(f"ALTER TABLE {ident} ALTER COLUMN a TYPE bigint")
    spark.sql(f"UPDATE {ident} SET added = 'new' WHERE id = 2")
    table, sid = current(catalog)
    rows = changelog.changes(spark, catalog_settings.name, table, sid, ["id"]).rows
    assert rows.columns[:4] == ["id", "a", "renamed", "added"]
    got = sorted((r["_change_type"], r["id"], r["a"], r["renamed"], r["added"]) for r in rows.collect())
    assert got == [(UPDATE_AFTER, 2, 20, "y", "new"), (UPDATE_BEFORE, 2, 20, "y", None)]
    first = changelog.snapshots_after(table, None)[0].snapshot_id
    exported = changelog.export(spark, catalog_settings.name, table, first).rows
    assert dict(exported.dtypes)["a"] == "bigint"
    assert sorted((r["id"], r["renamed"]) for r in exported.collect()) == [(1, "x"), (2, "y")]


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
def test_partition_spec_evolution_and_cross_partition_update(spark, catalog, catalog_settings, mode):
    ident = f"{catalog_settings.name}.db.t"
    spark.sql(f"CREATE TABLE {ident} (id bigint NOT NULL, region string, v int) USING iceberg "
              f"PARTITIONED BY (region) {mode_properties(2, mode)}")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'eu', 1), (2, 'eu', 2), (3, 'us', 3)")
    spark.sql(f"ALTER TABLE {ident} ADD PARTITION FIELD bucket(2, id)")
    spark.sql(f"INSERT INTO {ident} VALUES (4, 'us', 4)")
    spark.sql(f"UPDATE {ident} SET region = 'us' WHERE id = 1")  # moves partition
    spark.sql(f"UPDATE {ident} SET v = 40 WHERE id = 4")  # file of the new spec
    table = catalog.load_table("db.t")
    plans = changelog.snapshots_after(table, None)
    assert {spec for p in plans for spec, _ in p.affected_partitions} == {0, 1}
    columns = ["id", "region", "v"]
    for plan in plans:
        change_rows = changelog.changes(spark, catalog_settings.name, table, plan.snapshot_id, ["id"]).rows.collect()
        assert apply_changes(rows_at(spark, ident, plan.parent_id, columns), change_rows, columns) == \
            rows_at(spark, ident, plan.snapshot_id, columns)
    move = changelog.changes(spark, catalog_settings.name, table, plans[-2].snapshot_id, ["id"]).rows.collect()
    assert sorted((r["_change_type"], r["region"]) for r in move) == [(UPDATE_AFTER, "us"), (UPDATE_BEFORE, "eu")]


def test_equality_deletes_restricted_by_partition(spark, catalog, catalog_settings):
    """Spark writes no equality deletes; we commit one through Iceberg's Java API (py4j)."""
    ident = f"{catalog_settings.name}.db.t"
    # id is int: py4j hands Python ints to Java as Integer
    spark.sql(f"CREATE TABLE {ident} (id int NOT NULL, p int, v string) USING iceberg PARTITIONED BY (p) "
              f"{mode_properties(2, 'merge-on-read')}")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 0, 'a'), (2, 0, 'b'), (3, 1, 'c')")
    spark.sql(f"INSERT INTO {ident} VALUES (4, 0, 'd')")
    spark.sql(f"INSERT INTO {ident} VALUES (5, 1, 'e')")  # a manifest that holds only p=1
    write_equality_delete(spark, catalog, ident, partition_value=0, ids=[2, 4])
    table = catalog.load_table("db.t")
    plan = changelog.plan_snapshot(table, table.metadata.current_snapshot().snapshot_id)
    assert [d.content for d in plan.delete_files] == ["equality"]
    change_set = changelog.changes(spark, catalog_settings.name, table, plan.snapshot_id, ["id"])
    rows = change_set.rows.collect()
    assert sorted((r["_change_type"], r["id"]) for r in rows) == [(DELETE, 2), (DELETE, 4)]
    assert change_set.stats["files_read"] == 4  # the two files of partition p=0, before and after; not p=1
    # planning reads only the manifests whose partition summaries may hold p=0 (2 of the parent's 3)
    manifests = table.metadata.snapshot_by_id(plan.parent_id).manifests(table.io)
    spec_id = manifests[0].partition_spec_id
    read = [m for m in manifests if _manifest_may_hold(table, m, {(spec_id, (0,))})]
    assert (len(manifests), len(read)) == (3, 2)


def write_equality_delete(spark, catalog, ident: str, partition_value: int, ids: list[int]) -> None:
    jvm = spark._jvm
    jtable = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, ident)
    schema = jtable.schema()
    delete_schema = schema.select(jvm.java.util.Collections.singletonList("id"))
    records = jvm.java.util.ArrayList()
    for key in ids:
        record = jvm.org.apache.iceberg.data.GenericRecord.create(delete_schema)
        record.setField("id", key)
        records.add(record)
    spec = jtable.spec()
    part = jvm.org.apache.iceberg.data.GenericRecord.create(spec.partitionType())
    part.set(0, partition_value)
    field_ids = spark.sparkContext._gateway.new_array(jvm.int, 1)
    field_ids[0] = schema.findField("id").fieldId()
    factory = jvm.org.apache.iceberg.data.GenericAppenderFactory(schema, spec, field_ids, delete_schema, None)
    out = jvm.org.apache.iceberg.encryption.EncryptedFiles.plainAsEncryptedOutput(
        jtable.io().newOutputFile(f"{jtable.location()}/data/eq-delete-{partition_value}.parquet"))
    writer = factory.newEqDeleteWriter(out, jvm.org.apache.iceberg.FileFormat.PARQUET, part)
    for record in records:
        writer.write(record)
    writer.close()
    delete_file = writer.toDeleteFile()
    jtable.newRowDelta().addDeletes(delete_file).commit()


def test_plan_is_metadata_and_ranges_follow_ancestry(spark, catalog, catalog_settings):
    ident = f"{catalog_settings.name}.db.t"
    spark.sql(f"CREATE TABLE {ident} (id bigint, v string) USING iceberg {mode_properties(3, 'merge-on-read')}")
    spark.sql(f"INSERT INTO {ident} SELECT /*+ COALESCE(1) */ * FROM VALUES (1, 'a'), (2, 'b') AS s(id, v)")
    spark.sql(f"DELETE FROM {ident} WHERE id = 1")  # one file holds both rows: a deletion vector
    spark.sql(f"CALL {catalog_settings.name}.system.rewrite_data_files(table => 'db.t', "
              f"options => map('rewrite-all', 'true'))")
    spark.sql(f"INSERT INTO {ident} VALUES (3, 'c')")
    table = catalog.load_table("db.t")
    plans = changelog.snapshots_after(table, None)
    assert [p.operation for p in plans] == ["append", "delete", "replace", "append"]
    assert plans[1].delete_files[0].content == "deletion_vector" and plans[1].delete_files[0].referenced_data_file
    assert changelog.accepted_predecessors(table, plans[3].snapshot_id) == (plans[2].snapshot_id,
                                                                            plans[1].snapshot_id)
    assert changelog.changes(spark, catalog_settings.name, table, plans[2].snapshot_id).rows.count() == 0
    assert [p.snapshot_id for p in changelog.snapshots_after(table, plans[1].snapshot_id)] == \
        [plans[2].snapshot_id, plans[3].snapshot_id]
    # v3 without identifier columns: _row_id identifies rows and becomes the document id
    net = changelog.changes(spark, catalog_settings.name, table, (plans[0].snapshot_id, plans[3].snapshot_id),
                            net=True).rows
    events = changelog.to_events(net, "db.t", (), "x", plans[3].snapshot_id, use_row_id=True).collect()
    assert sorted((e["v"], e["bulk_action"]) for e in events) == [("a", "DELETE"), ("c", "INDEX")]
    assert all(e["document_id"] == str(e["_row_id"]) for e in events)
    with pytest.raises(SnapshotNotFoundError, match=r"snapshot 12345 .*db\.t"):
        changelog.plan_snapshot(table, 12345)
    with pytest.raises(SnapshotNotFoundError, match="not an ancestor"):
        changelog.snapshots_after(table, plans[3].snapshot_id, plans[1].snapshot_id)


@pytest.mark.parametrize("one_task_rows", [engine.ONE_TASK_ROWS, 0])
def test_duplicate_key_and_identifier_errors(spark, catalog, catalog_settings, monkeypatch, one_task_rows):
    """The key check of a one-sided batch, in one task (a small batch: one stage, no shuffle) or shuffled by key
    (three stages), finds the same offenders."""
    monkeypatch.setattr(engine, "ONE_TASK_ROWS", one_task_rows)
    ident = f"{catalog_settings.name}.db.t"
    spark.sql(f"CREATE TABLE {ident} (id bigint, v string, s struct<x: int>) USING iceberg "
              f"{mode_properties(2, 'copy-on-write')}")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a', NULL), (1, 'b', NULL)")
    spark.sql(f"INSERT INTO {ident} VALUES (NULL, 'n', NULL)")
    spark.sql(f"INSERT INTO {ident} VALUES (2, 'c', NULL), (3, 'd', NULL)")
    table, fine_sid = current(catalog)
    null_sid = changelog.plan_snapshot(table, fine_sid).parent_id
    sid = changelog.plan_snapshot(table, null_sid).parent_id
    label = f"key-check-{one_task_rows}"
    spark.sparkContext.setJobGroup(label, label)
    try:
        changelog.changes(spark, catalog_settings.name, table, fine_sid, ["id"])  # the check's job, rows lazy
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    tracker = spark.sparkContext.statusTracker()
    (job,) = tracker.getJobIdsForGroup(label)
    assert len(tracker.getJobInfo(job).stageIds) == (1 if one_task_rows else 3)
    with pytest.raises(DuplicateKeyChangeError, match=rf"table db\.t, snapshot {sid}: key \{{'id': 1\}} has 2 INSERT"):
        changelog.changes(spark, catalog_settings.name, table, sid, ["id"])
    with pytest.raises(IdentifierColumnError, match=r"identifier column 'nope' does not exist in table db\.t"):
        changelog.changes(spark, catalog_settings.name, table, sid, ["nope"])
    with pytest.raises(IdentifierColumnError, match="is nested"):
        changelog.changes(spark, catalog_settings.name, table, sid, ["s"])
    with pytest.raises(IdentifierColumnError, match="is nested"):
        changelog.changes(spark, catalog_settings.name, table, sid, ["s.x"])
    with pytest.raises(IdentifierColumnError, match=rf"column\(s\) id of table db\.t hold null in snapshot {null_sid}"):
        changelog.changes(spark, catalog_settings.name, table, null_sid, ["id", "v"])


def test_staged_scans_are_released_after_the_block(spark, catalog, catalog_settings):
    """Reading touched files stages scan-task sets in the JVM; a staged_scans block releases them,
    so a long-lived process does not grow with every batch."""
    ident = f"{catalog_settings.name}.db.t"
    spark.sql(f"CREATE TABLE {ident} (id bigint NOT NULL, v string) USING iceberg {mode_properties(2, 'merge-on-read')}")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"UPDATE {ident} SET v = 'b2' WHERE id = 2")
    table, sid = current(catalog)
    before = changelog.staged_scan_count(spark)
    with changelog.staged_scans(spark):
        rows = changelog.changes(spark, catalog_settings.name, table, sid, ["id"]).rows
        assert change_types(rows.collect()) == Counter({"UPDATE_BEFORE": 1, "UPDATE_AFTER": 1})
        assert changelog.staged_scan_count(spark) > before
    assert changelog.staged_scan_count(spark) == before


def _normalized(plan) -> tuple:
    """A plan with its file lists as sets: the two readers may list files in another order."""
    return (plan.__class__(**{**plan.__dict__, "added_data_files": (), "removed_data_files": ()}),
            set(plan.added_data_files), set(plan.removed_data_files))


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
def test_jvm_data_file_changes_plan_like_pyiceberg(spark, catalog, catalog_settings, monkeypatch, mode):
    """A snapshot that rewrote a large manifest is planned from Iceberg's JVM reader (pyiceberg would
    decode every entry): forced on a small table, plans and change rows are the same as pyiceberg's."""
    ident = f"{catalog_settings.name}.db.t"
    create_table(spark, ident, 2, mode, True)
    run_workload(spark, ident, 11)
    table = catalog.load_table("db.t")
    plans = changelog.snapshots_after(table, None)

    def rows(sid: int) -> Counter:
        found = changelog.changes(spark, catalog_settings.name, table, sid, ["id"]).rows
        return Counter(tuple(r) for r in found.drop("_commit_timestamp").collect())

    expected = {p.snapshot_id: rows(p.snapshot_id) for p in plans}
    monkeypatch.setattr(plan_module, "_needs_fast_reader", lambda manifests, snapshot_id: True)
    changes_of = java_data_file_changes(spark, java_table(spark, catalog_settings.name, table))
    for plan in plans:
        assert _normalized(changelog.plan_snapshot(table, plan.snapshot_id, changes_of)) == _normalized(plan)
        assert rows(plan.snapshot_id) == expected[plan.snapshot_id]
