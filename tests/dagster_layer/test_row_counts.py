"""``dagster/row_count`` is the table's real count or absent: never the summary's ``total-records``
minus position deletes that a compaction left dangling (issue 31, item 1). Real tables, counted by
Spark for the expected values."""

from icecdc_dagster.changelog import exact_row_count
from tests.changelog.test_tables import write_equality_delete


def _count(spark, fq):
    return spark.table(fq).count()


def test_row_count_is_exact_after_compaction_leaves_dangling_position_deletes(spark, catalog_settings, catalog):
    fq = f"{catalog_settings.name}.db.orders"
    spark.sql(f"""CREATE TABLE {fq} (id BIGINT NOT NULL, status STRING) USING iceberg
                  PARTITIONED BY (bucket(4, id))
                  TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read',
                                 'write.merge.mode'='merge-on-read')""")
    spark.sql(f"INSERT INTO {fq} SELECT id, 'NEW' FROM range(0, 200)")
    assert exact_row_count(catalog.load_table("db.orders")) == 200          # no delete files: the summary
    spark.sql(f"DELETE FROM {fq} WHERE id % 10 = 7")                        # 20 position deletes
    spark.sql(f"DELETE FROM {fq} WHERE id % 10 = 3")                        # a second file per data file
    assert exact_row_count(catalog.load_table("db.orders")) == 160 == _count(spark, fq)
    # Every snapshot of the history, as the consistency check counts a source at a sink's checkpoint:
    # equal to Spark's time-travel read of it.
    table = catalog.load_table("db.orders")
    counts = {s.snapshot_id: exact_row_count(table, s.snapshot_id) for s in table.snapshots()}
    assert sorted(counts.values()) == [160, 180, 200]
    for snapshot_id, count in counts.items():
        assert count == spark.read.option("snapshot-id", snapshot_id).table(fq).count()
    assert exact_row_count(table, 1234) is None                             # no such snapshot: not counted


def test_row_count_of_the_demo_table_after_its_compaction(spark, catalog_settings, catalog):
    """The demo's own snapshots: the compaction keeps 20 partition-scoped position deletes whose data
    files it rewrote; the summary's total-records minus them says 1,080, the table holds 1,100."""
    from icecdc_dagster.demo import workload

    workload.create_source(spark, catalog_settings.name)
    workload.initial_load(spark, catalog_settings.name)
    workload.apply_changes(spark, catalog_settings.name)
    table = catalog.load_table(workload.SOURCE_TABLE)
    summary = table.current_snapshot().summary
    assert int(summary["total-records"]) - int(summary["total-position-deletes"]) == 1080   # the old figure
    assert exact_row_count(table) == 1100 == _count(spark, f"{catalog_settings.name}.{workload.SOURCE_TABLE}")


def test_row_count_with_deletion_vectors_and_absent_with_equality_deletes(spark, catalog_settings, catalog):
    fq = f"{catalog_settings.name}.db.v3"
    spark.sql(f"""CREATE TABLE {fq} (id BIGINT NOT NULL, v STRING) USING iceberg
                  TBLPROPERTIES ('format-version'='3', 'write.delete.mode'='merge-on-read')""")
    spark.sql(f"INSERT INTO {fq} SELECT id, 'a' FROM range(0, 50)")
    spark.sql(f"DELETE FROM {fq} WHERE id < 5")
    spark.sql(f"DELETE FROM {fq} WHERE id >= 45")                           # the DV of the file is replaced
    assert exact_row_count(catalog.load_table("db.v3")) == 40 == _count(spark, fq)

    eq = f"{catalog_settings.name}.db.eq"
    spark.sql(f"CREATE TABLE {eq} (id INT NOT NULL, p INT, v STRING) USING iceberg PARTITIONED BY (p) "
              f"TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {eq} VALUES (1, 0, 'a'), (2, 0, 'b'), (3, 1, 'c')")
    write_equality_delete(spark, catalog, eq, partition_value=0, ids=[2])
    assert exact_row_count(catalog.load_table("db.eq")) is None             # only a scan would know
