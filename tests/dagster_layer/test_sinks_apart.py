"""Sinks of one line at different snapshots inside a range (a run killed between their commits, driven
here by running the steps of one sink only): the next plain run applies the range to the lower sink and
only the range's tail to the sink already inside it, and both equal the source, exactly."""

from dagster import AssetRecordsFilter
from opensearchpy import OpenSearch

from icecdc_dagster.assets.naming import asset_keys
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from tests.dagster_layer.harness import drain, tick
from tests.dagster_layer.test_sink_runs import INDEX, OPENSEARCH, REPLICA, _documents, _source_rows
from tests.helpers import write_pipeline


def _metadata(instance, key, partition) -> dict:
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[partition]),
                                              limit=1).records
    assert records, f"{key.to_user_string()} [{partition}] was not materialised"
    return {k: getattr(v, "value", v) for k, v in records[0].asset_materialization.metadata.items()}


def test_a_sink_inside_the_range_takes_only_its_tail_and_both_sinks_equal_the_source(
        spark, catalog_settings, catalog, instance, tmp_path, opensearch_url):
    fq = f"{catalog_settings.name}.db.items"
    spark.sql(f"""CREATE TABLE {fq} (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg
                  TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read',
                                 'write.update.mode'='merge-on-read')""")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('n', id), CAST(id AS INT) FROM range(0, 20)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.items", "identifier_columns": ["id"], "max_snapshots_per_run": 10,
        "sinks": [{"opensearch": {"hosts": [opensearch_url], "index": INDEX, "parallelism": 1}},
                  {"iceberg": {"table_name": "db.items_replica"}}]}]))
    defs = build_definitions(config)
    table = config.tables[0]
    assert tick(defs, instance, table).succeeded == [True]            # the export, both sinks

    spark.sql(f"UPDATE {fq} SET qty = qty + 100 WHERE id IN (1, 2)")   # s1: 1 and 2 changed before the index's
    spark.sql(f"INSERT INTO {fq} VALUES (100, 'new', 100)")            # s2: checkpoint (s2) ...
    spark.sql(f"UPDATE {fq} SET name = 'x' WHERE id = 3")
    planned = tick(defs, instance, table, run=False)                   # s1..s3 as one range
    s1, s3 = planned.requested[0]
    request = planned.run_requests[0]
    job = defs.resolve_implicit_global_asset_job_def()
    without_replica = [k for k in asset_keys(table) if k != REPLICA]   # the run dies before the replica commits
    assert job.execute_in_process(instance=instance, partition_key=request.partition_key, tags=request.tags,
                                  asset_selection=without_replica).success

    spark.sql(f"UPDATE {fq} SET qty = qty + 1000 WHERE id = 1")        # ... and 1 again after it
    spark.sql(f"DELETE FROM {fq} WHERE id IN (100, 5)")                # inserted inside the range, then deleted
    spark.sql(f"UPDATE {fq} SET name = 'n3' WHERE id = 3")             # back to its image before the range
    spark.sql(f"UPDATE {fq} SET qty = -qty WHERE id = 2")
    ids = [s.snapshot_id for s in catalog.load_table("db.items").snapshots()]

    ticks = drain(defs, instance, table)                               # one plain run: s1..s7 for both sinks
    assert [t.requested for t in ticks if t.requested] == [[(s1, str(ids[-1]))]]
    assert all(all(t.succeeded) for t in ticks)
    expected = _source_rows(spark, fq)
    assert (100, "new", 100) not in expected and (3, "n3", 3) in expected
    assert _documents(opensearch_url) == expected
    replica = sorted((r.id, r.name, r.qty) for r in spark.table(f"{catalog_settings.name}.db.items_replica").collect())
    assert replica == expected

    index = _metadata(instance, OPENSEARCH, str(ids[-1]))
    assert s3 == str(ids[3]) and index["resumed_after_snapshot_id"] == s3
    assert index["first_snapshot_id"] == str(ids[4])                    # the snapshot after the index's checkpoint
    assert index["count_delete"] == 2 and index["count_update_after"] == 3   # 100 and 5; 1, 2 and 3
    assert "resumed_after_snapshot_id" not in _metadata(instance, REPLICA, str(ids[-1]))
    # External versions follow the source: a key changed after the checkpoint carries its last change's
    # sequence number; one changed only before it keeps the version the first run gave it.
    client = OpenSearch(hosts=[opensearch_url])
    table_now = catalog.load_table("db.items")
    assert client.get(index=INDEX, id="1")["_version"] == table_now.snapshot_by_id(ids[-4]).sequence_number
    assert client.get(index=INDEX, id="2")["_version"] == table_now.snapshot_by_id(ids[-1]).sequence_number
    assert client.get(index=INDEX, id="0")["_version"] == table_now.snapshot_by_id(ids[0]).sequence_number


def test_a_half_written_attempt_is_finished_before_the_longer_range_that_replaced_it(
        spark, catalog_settings, catalog, instance, tmp_path, opensearch_url, proxy, monkeypatch):
    """An OpenSearch bulk that stopped midway (the attempt failed; one document it wrote is put back here,
    as the bulk left it) and a commit after it: the next run's range nets the key away (inserted in the
    attempt's snapshot, deleted after), so the index finishes the attempt's batch first, then the rest; the
    replica, which applied the attempt's snapshot, is inside the range and takes the rest only."""
    from icecdc_dagster.lease import retry

    fq = f"{catalog_settings.name}.db.items"
    spark.sql(f"""CREATE TABLE {fq} (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg
                  TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read',
                                 'write.update.mode'='merge-on-read')""")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('n', id), CAST(id AS INT) FROM range(0, 10)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.items", "identifier_columns": ["id"], "max_snapshots_per_run": 10, "max_retries": 3,
        "sinks": [{"opensearch": {"hosts": [proxy.url], "index": INDEX, "max_retries": 1, "request_timeout_s": 5,
                                  "parallelism": 1}},
                  {"iceberg": {"table_name": "db.items_replica"}}]}]))
    defs = build_definitions(config)
    table = config.tables[0]
    assert tick(defs, instance, table).succeeded == [True]

    spark.sql(f"INSERT INTO {fq} VALUES (100, 'new', 100), (101, 'kept', 101)")   # s1
    s1 = catalog.load_table("db.items").current_snapshot()
    proxy.cut()
    monkeypatch.setattr(retry, "RETRY_BACKOFF_S", 0.0)
    failed = tick(defs, instance, table)
    assert failed.requested == [(str(s1.snapshot_id), str(s1.snapshot_id))] and failed.succeeded == [False]
    client = OpenSearch(hosts=[opensearch_url])
    client.index(index=INDEX, id="100", body={"id": 100, "name": "new", "qty": 100},   # what the bulk wrote
                 params={"version": s1.sequence_number, "version_type": "external"})
    proxy.restore()

    spark.sql(f"DELETE FROM {fq} WHERE id = 100")                                 # s2: nets 100 away
    spark.sql(f"UPDATE {fq} SET qty = 7 WHERE id = 1")                            # s3
    s3 = catalog.load_table("db.items").current_snapshot().snapshot_id
    ticks = drain(defs, instance, table)
    assert [t.requested for t in ticks if t.requested] == [[(str(s1.snapshot_id), str(s3))]]
    assert all(all(t.succeeded) for t in ticks)
    expected = _source_rows(spark, fq)
    assert _documents(opensearch_url) == expected
    replica = sorted((r.id, r.name, r.qty) for r in spark.table(f"{catalog_settings.name}.db.items_replica").collect())
    assert replica == expected
    index = _metadata(instance, OPENSEARCH, str(s3))
    assert index["applied_in_batches"].startswith(f"{s1.snapshot_id}..{s1.snapshot_id}, ")
    assert _metadata(instance, REPLICA, str(s3))["resumed_after_snapshot_id"] == str(s1.snapshot_id)
