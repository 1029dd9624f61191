"""The writer merges the LAST image of every key, whatever op opened the key's run in the batch (issue 10 #3)."""

from icecdc_dagster.writer.merge import OP_COLUMN, OP_DELETE, OP_INSERT, OP_UPSERT, ORDER_COLUMN, write_batch


def _batch(spark, rows):
    return spark.createDataFrame(rows, f"id bigint, v string, {OP_COLUMN} string, {ORDER_COLUMN} bigint")


def test_redelivered_insert_then_delete_removes_an_existing_key(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.t (id bigint NOT NULL, v string) USING iceberg "
              "TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='merge-on-read')")
    write_batch(spark, f"{cat}.db.t", _batch(spark, [(110, "a", OP_INSERT, 1), (111, "b", OP_INSERT, 2)]),
                ("id",), "b1")
    # at-least-once: c 111 and u 110 are re-deliveries of events already applied, then u 111, d 111;
    # key 112 is new in this batch and deleted again in it
    batch = [(111, "b", OP_INSERT, 1), (110, "a2", OP_UPSERT, 2), (111, "b2", OP_UPSERT, 3), (111, None, OP_DELETE, 4),
             (112, "c", OP_INSERT, 5), (112, None, OP_DELETE, 6)]
    outcome = write_batch(spark, f"{cat}.db.t", _batch(spark, batch), ("id",), "b2")
    assert {r.id: r.v for r in spark.table(f"{cat}.db.t").collect()} == {110: "a2"}
    assert outcome.counts == {"updated": 1, "deleted": 1, "delete_missing": 1}


def test_last_image_wins_over_earlier_delete(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.t (id bigint NOT NULL, v string) USING iceberg "
              "TBLPROPERTIES ('format-version'='2')")
    write_batch(spark, f"{cat}.db.t", _batch(spark, [(1, "a", OP_INSERT, 1)]), ("id",), "b1")
    batch = [(1, None, OP_DELETE, 1), (1, "again", OP_INSERT, 2), (2, None, OP_DELETE, 3), (2, "new", OP_INSERT, 4)]
    outcome = write_batch(spark, f"{cat}.db.t", _batch(spark, batch), ("id",), "b2")
    assert {r.id: r.v for r in spark.table(f"{cat}.db.t").collect()} == {1: "again", 2: "new"}
    assert outcome.counts == {"updated": 1, "inserted": 1}
