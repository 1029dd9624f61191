"""The equality_deletes write mode: data files + equality deletes in one row delta, no read of the target
(issue 30 #2). Equal to a MERGE target on the same batches; Spark and pyiceberg agree once compacted."""

import pytest
from pyspark.sql import functions as F

from icecdc_dagster import changelog
from icecdc_dagster.batch import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from icecdc_dagster.errors import EqualityDeleteTargetError
from icecdc_dagster.steps import table_maintenance as maintenance
from icecdc_dagster.writer.equality_deletes import write_equality_delta
from icecdc_dagster.writer.exactly_once import BATCH_ID_PROPERTY, java_table
from icecdc_dagster.writer.merge import OP_COLUMN, OP_DELETE, OP_INSERT, OP_UPSERT, ORDER_COLUMN, write_batch

SCHEMA = f"id bigint, v string, {OP_COLUMN} string, {ORDER_COLUMN} bigint"


def _batch(spark, rows, schema=SCHEMA):
    return spark.createDataFrame(rows, schema)


def _create(spark, name, extra="", columns="id bigint NOT NULL, v string"):
    spark.sql(f"CREATE TABLE {name} ({columns}) USING iceberg {extra} TBLPROPERTIES ('format-version'='2')")


def _rows(spark, name):
    return {r.id: r.v for r in spark.table(name).collect()}


def test_one_row_delta_whose_new_rows_survive_its_own_deletes(spark, catalog, catalog_settings):
    t = f"{catalog_settings.name}.db.t"
    _create(spark, t)
    first = write_equality_delta(spark, t, _batch(spark, [(1, "a", OP_INSERT, 1), (2, "b", OP_INSERT, 2)]),
                                 ("id",), "b1", ledger=True)
    assert first.counts == {"upserted": 2, "delete_keys": 0}
    batch = [(1, "a2", OP_UPSERT, 1), (2, None, OP_DELETE, 2), (3, "c", OP_INSERT, 3), (3, "c2", OP_UPSERT, 4),
             (4, "d", OP_INSERT, 5), (4, None, OP_DELETE, 6)]
    second = write_equality_delta(spark, t, _batch(spark, batch), ("id",), "b2", ledger=True)
    assert _rows(spark, t) == {1: "a2", 3: "c2"}
    assert second.counts == {"upserted": 2, "delete_keys": 2}
    jtable = java_table(spark, t)
    snap = jtable.currentSnapshot()
    summary = dict(snap.summary())
    # one commit: the batch's data files and equality deletes share its sequence number
    assert snap.operation() == "overwrite" and summary[BATCH_ID_PROPERTY] == "b2"
    assert summary["added-equality-delete-files"] != "0" and summary["added-data-files"] != "0"
    files = spark.sql(f"SELECT content, count(*) AS n FROM {t}.all_files GROUP BY content").collect()
    assert {r.content: r.n for r in files}[2] >= 1  # equality deletes (content 2) are live
    again = write_equality_delta(spark, t, _batch(spark, [(9, "x", OP_INSERT, 1)]), ("id",), "b2", ledger=True)
    assert again.skipped and _rows(spark, t) == {1: "a2", 3: "c2"}


def test_partitioned_by_identity_bucket_and_day_of_key_columns(spark, catalog, catalog_settings):
    t = f"{catalog_settings.name}.db.p"
    _create(spark, t, "PARTITIONED BY (region, bucket(4, id), days(day))",
            "region string NOT NULL, id bigint NOT NULL, day date NOT NULL, v string")
    schema = f"region string, id bigint, day date, v string, {OP_COLUMN} string, {ORDER_COLUMN} bigint"
    keys = ("region", "id", "day")
    first = [("eu", i, f"2024-01-0{1 + i % 3}", f"v{i}", OP_INSERT, i) for i in range(12)]
    schema = schema.replace("day date", "day string")
    second = [("eu", 1, "2024-01-02", "new", OP_UPSERT, 1), ("eu", 2, "2024-01-03", None, OP_DELETE, 2),
              ("us", 1, "2024-01-02", "us1", OP_INSERT, 3), ("eu", 5, "2024-01-03", "five", OP_UPSERT, 4)]
    for bid, batch in (("b1", first), ("b2", second)):
        frame = spark.createDataFrame(batch, schema).withColumn("day", F.col("day").cast("date"))
        write_equality_delta(spark, t, frame, keys, bid, ledger=True)
    got = {(r.region, r.id): r.v for r in spark.table(t).collect()}
    expected = {("eu", i): f"v{i}" for i in range(12)}
    expected.update({("eu", 1): "new", ("eu", 5): "five", ("us", 1): "us1"})
    del expected[("eu", 2)]
    assert got == expected
    sid = java_table(spark, t).currentSnapshot().snapshotId()
    added = spark.sql(f"SELECT data_file.content, data_file.partition FROM {t}.entries "
                      f"WHERE snapshot_id = {sid} AND status = 1").collect()
    deletes = [str(r.partition) for r in added if r.content == 2]
    data = {str(r.partition) for r in added if r.content == 0}
    # partition-scoped: one equality-delete file per partition the batch touches, the data rows' among them
    assert len(deletes) == len(set(deletes)) >= 3 and data <= set(deletes) and len(data) >= 2


def test_refused_targets_name_table_and_field(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    _create(spark, f"{cat}.db.nokey", "PARTITIONED BY (days(ts))", "id bigint NOT NULL, ts timestamp, v string")
    frame = spark.createDataFrame([(1, None, "a", OP_INSERT, 1)],
                                  f"id bigint, ts timestamp, v string, {OP_COLUMN} string, {ORDER_COLUMN} bigint")
    with pytest.raises(EqualityDeleteTargetError, match=r"db.nokey: partition field ts_day = day\(ts\) is not over "
                                                        r"an identifier column \(id\)"):
        write_equality_delta(spark, f"{cat}.db.nokey", frame, ("id",), "b1")
    spark.sql(f"CREATE TABLE {cat}.db.v1 (id bigint NOT NULL, v string) USING iceberg "
              "TBLPROPERTIES ('format-version'='1')")
    with pytest.raises(EqualityDeleteTargetError, match="db.v1: write_mode equality_deletes needs format-version 2"):
        write_equality_delta(spark, f"{cat}.db.v1", _batch(spark, [(1, "a", OP_INSERT, 1)]), ("id",), "b1")


def test_equal_to_merge_and_to_pyiceberg_once_compacted(spark, catalog, catalog_settings):
    """Same batches into a MERGE target and an equality-delete target: same rows (Spark applies the
    equality deletes); pyiceberg 0.12 refuses them until compaction, then reads the same rows."""
    cat = catalog_settings.name
    for name in ("m", "e"):
        _create(spark, f"{cat}.db.{name}")
    batches = [[(i, f"a{i}", OP_INSERT, i) for i in range(20)],
               [(i, f"b{i}", OP_UPSERT, i) for i in range(0, 20, 3)] + [(i, None, OP_DELETE, 100 + i)
                                                                      for i in range(1, 20, 4)],
               [(1, "back", OP_INSERT, 1), (30, "new", OP_INSERT, 2), (3, None, OP_DELETE, 3), (3, "x", OP_UPSERT, 4)]]
    for n, rows in enumerate(batches):
        write_batch(spark, f"{cat}.db.m", _batch(spark, rows), ("id",), f"b{n}", ledger=True)
        write_equality_delta(spark, f"{cat}.db.e", _batch(spark, rows), ("id",), f"b{n}", ledger=True)
    merged = _rows(spark, f"{cat}.db.m")
    assert _rows(spark, f"{cat}.db.e") == merged and merged[1] == "back" and merged[3] == "x" and 5 not in merged
    with pytest.raises(ValueError, match="equality deletes"):
        catalog.load_table("db.e").scan().to_arrow()
    done = maintenance.compact(spark, cat, "db.e", threshold=0)
    assert done.compacted
    assert spark.sql(f"SELECT count(*) FROM {cat}.db.e.delete_files").first()[0] == 0
    read = catalog.load_table("db.e").scan().to_arrow().to_pylist()
    assert {r["id"]: r["v"] for r in read} == merged == _rows(spark, f"{cat}.db.e")


def test_changelog_engine_reads_an_equality_delete_target_as_a_source(spark, catalog, catalog_settings):
    t = f"{catalog_settings.name}.db.src"
    _create(spark, t)
    write_equality_delta(spark, t, _batch(spark, [(1, "a", OP_INSERT, 1), (2, "b", OP_INSERT, 2)]), ("id",), "b1")
    batch = [(1, "a2", OP_UPSERT, 1), (2, None, OP_DELETE, 2), (3, "c", OP_INSERT, 3), (4, "d", OP_INSERT, 4),
             (4, None, OP_DELETE, 5), (5, None, OP_DELETE, 6)]
    write_equality_delta(spark, t, _batch(spark, batch), ("id",), "b2")
    table = catalog.load_table("db.src")
    sid = table.metadata.current_snapshot().snapshot_id
    rows = changelog.changes(spark, catalog_settings.name, table, sid, ["id"]).rows.collect()
    assert sorted((r["id"], r["_change_type"], r["v"]) for r in rows) == [
        (1, UPDATE_AFTER, "a2"), (1, UPDATE_BEFORE, "a"), (2, DELETE, "b"), (3, INSERT, "c")]
