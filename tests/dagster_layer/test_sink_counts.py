"""Each sink materialisation's counts are what it applied (issue 31, item 2): the events of the batch
per change type, next to the sink's own outcome counts; and the source's observation carries the
table's real row count. Real sensor ticks and runs, read back from the instance's event log."""

from dagster import AssetKey, AssetRecordsFilter

from icecdc_dagster.assets.source_table import source_observations
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from tests.dagster_layer.harness import drain
from tests.helpers import write_pipeline

REPLICA = AssetKey(["replica", "db", "db_items_replica"])
INDEX = AssetKey(["opensearch", "items_opensearch"])


def _metadata(instance, key, partition):
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[partition]),
                                              limit=1).records
    assert records, f"{key.to_user_string()} [{partition}] was not materialised"
    return {k: getattr(v, "value", v) for k, v in records[0].asset_materialization.metadata.items()}


def test_sink_counts_are_the_events_applied(spark, catalog_settings, catalog, instance, tmp_path, opensearch_url):
    fq = f"{catalog_settings.name}.db.items"
    spark.sql(f"""CREATE TABLE {fq} (id BIGINT NOT NULL, qty INT) USING iceberg
                  TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read',
                                 'write.update.mode'='merge-on-read')""")
    spark.sql(f"INSERT INTO {fq} SELECT id, CAST(id AS INT) FROM range(0, 12)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.items", "identifier_columns": ["id"], "max_snapshots_per_run": 1,
        "sinks": [{"iceberg": {"table_name": "db.items_replica"}},
                  {"opensearch": {"hosts": [opensearch_url], "index": "items"}}]}]))
    defs, table = build_definitions(config), config.tables[0]
    snapshots = []
    for change in ("", f"UPDATE {fq} SET qty = -1 WHERE id < 3", f"DELETE FROM {fq} WHERE id >= 10"):
        if change:
            spark.sql(change)                                         # the export, 3 updates, 2 deletes
        snapshots.append(str(catalog.load_table("db.items").current_snapshot().snapshot_id))
        assert all(all(t.succeeded) for t in drain(defs, instance, table))
    export, update, delete = snapshots

    replica = _metadata(instance, REPLICA, export)
    assert (replica["rows"], replica["count_insert"], replica["sink_inserted"]) == (12, 12, 12)
    assert replica["dagster/partition_row_count"] == 12
    replica = _metadata(instance, REPLICA, update)
    assert (replica["rows"], replica["count_update_after"], replica["count_update_before"]) == (3, 3, 0)
    assert replica["sink_updated"] == 3
    replica = _metadata(instance, REPLICA, delete)
    assert (replica["rows"], replica["count_delete"], replica["sink_deleted"]) == (2, 2, 2)
    index = _metadata(instance, INDEX, update)
    assert (index["rows"], index["count_update_after"], index["sink_actions"]) == (3, 3, 3)
    index = _metadata(instance, INDEX, delete)
    assert (index["rows"], index["count_delete"], index["sink_actions"]) == (2, 2, 2)

    # What the sensor records for the source (its harness tick does not store sensor asset events).
    (observation,) = source_observations(table, catalog_settings.name, catalog.load_table("db.items"), [delete])
    assert observation.metadata["dagster/row_count"].value == spark.table(fq).count() == 10
