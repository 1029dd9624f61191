"""The user's report through ``sync_all`` (what ``icecdc sync`` runs): a source column renamed, then 20
updates and 30 inserts. The replica must follow the rename in place (same field id, no stale column) and
equal the source on every column, with no duplicate key."""

from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.sync import sync_all
from tests.helpers import write_pipeline


def _assert_equal(spark, cat):
    source, target = spark.table(f"{cat}.db.src"), spark.table(f"{cat}.db.src_copy")
    assert target.columns == source.columns
    assert target.count() == target.select("id").distinct().count() == source.count()
    assert source.exceptAll(target).count() == 0 and target.exceptAll(source).count() == 0


def test_renamed_column_is_followed_through_sync(spark, catalog_settings, catalog, tmp_path, instance):
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.src (id BIGINT NOT NULL, name STRING, city STRING) USING iceberg")
    spark.sql(f"INSERT INTO {cat}.db.src SELECT id, concat('n', id), concat('c', id % 7) FROM range(89)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.src", "identifier_columns": ["id"],
         "sinks": [{"iceberg": {"table_name": "db.src_copy"}}]}]))
    defs = build_definitions(config)
    [report] = sync_all(config, defs, instance)
    assert report.ok
    name_id = catalog.load_table("db.src_copy").schema().find_field("name").field_id

    spark.sql(f"ALTER TABLE {cat}.db.src RENAME COLUMN name TO full_name")
    spark.sql(f"UPDATE {cat}.db.src SET full_name = concat('u', id), city = 'moved' WHERE id < 20")
    spark.sql(f"INSERT INTO {cat}.db.src SELECT id, concat('i', id), 'new' FROM range(100, 130)")
    [report] = sync_all(config, defs, instance)
    assert report.ok, report.render()
    _assert_equal(spark, cat)
    replica = catalog.load_table("db.src_copy").schema()
    assert replica.find_field("full_name").field_id == name_id
    assert [f.name for f in replica.fields] == ["id", "full_name", "city"]
    assert "name" not in spark.table(f"{cat}.db.src__changelog").columns
