"""Both sinks behind the real sensor and real runs: an OpenSearch index (over HTTP, through a
TCP proxy we can cut) and an Iceberg replica. A failed batch blocks the line until it is
retried, an applied partition re-run changes nothing, and the asset checks run and pass."""

from dagster import AssetCheckKey, AssetKey, AssetRecordsFilter
from opensearchpy import OpenSearch

from icecdc_dagster.assets import naming
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.sensors.snapshots import asset_keys
from tests.dagster_layer.harness import drain, tick
from tests.helpers import write_pipeline

INDEX = "items"
CHANGELOG = AssetKey(["changelog", "db", "items"])
OPENSEARCH = AssetKey(["opensearch", INDEX])
REPLICA = AssetKey(["replica", "db", "items_replica"])


def _latest(instance, key, partition):
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[partition]),
                                              limit=1).records
    assert records, f"{key.to_user_string()} [{partition}] was not materialised"
    return {k: getattr(v, "value", v) for k, v in records[0].asset_materialization.metadata.items()}


def _materialisation_count(instance, key, partition):
    return len(instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=100).records)


def _source_rows(spark, fq):
    return sorted((r.id, r.name, r.qty) for r in spark.table(fq).collect())


def _documents(opensearch_url):
    client = OpenSearch(hosts=[opensearch_url])
    client.indices.refresh(index=INDEX)
    hits = client.search(index=INDEX, body={"query": {"match_all": {}}, "size": 1000})["hits"]["hits"]
    return sorted((int(h["_id"]), h["_source"]["name"], h["_source"]["qty"]) for h in hits)


def test_failed_batch_blocks_the_line_until_retried_and_reruns_change_nothing(
        spark, catalog_settings, catalog, instance, tmp_path, opensearch_url, proxy):
    fq = f"{catalog_settings.name}.db.items"
    spark.sql(f"""CREATE TABLE {fq} (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg
                  TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read',
                                 'write.update.mode'='merge-on-read')""")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('n', id), CAST(id AS INT) FROM range(0, 30)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.items", "identifier_columns": ["id"], "max_snapshots_per_run": 1, "max_retries": 1,
        "sinks": [{"opensearch": {"hosts": [proxy.url], "index": INDEX, "max_retries": 1,
                                  "request_timeout_s": 5, "parallelism": 1}},
                  {"iceberg": {"table_name": "db.items_replica"}}]}]))
    defs = build_definitions(config)
    table = config.tables[0]

    bootstrap = tick(defs, instance, table)
    assert bootstrap.succeeded == [True]
    assert _documents(opensearch_url) == _source_rows(spark, fq)

    spark.sql(f"UPDATE {fq} SET qty = qty + 1000 WHERE id < 10")       # batch k   (MoR update)
    spark.sql(f"DELETE FROM {fq} WHERE id >= 25")                       # batch k+1 (MoR delete)
    batch_k, batch_k1 = [str(s.snapshot_id) for s in catalog.load_table("db.items").snapshots()][1:]

    proxy.cut()
    failed = tick(defs, instance, table)                              # k fails in the OpenSearch sink
    assert failed.requested == [(batch_k, batch_k)] and failed.succeeded == [False]
    retried = tick(defs, instance, table)                             # automatic retry (max_retries: 1) fails
    assert retried.requested == [(batch_k, batch_k)] and retried.succeeded == [False]
    blocked = tick(defs, instance, table)                             # retries used up: the line waits
    assert blocked.requested == [] and batch_k in blocked.skip_reason and "failed" in blocked.skip_reason
    assert batch_k1 in instance.get_dynamic_partitions(naming.partitions_name(table))   # known, not run
    assert _materialisation_count(instance, OPENSEARCH, batch_k1) == 0
    assert _materialisation_count(instance, CHANGELOG, batch_k1) == 0
    # The replica applied k in the first failed run; its checkpoint never passed k.
    assert _latest(instance, REPLICA, batch_k)["checkpoint_snapshot_id"] == batch_k

    proxy.restore()
    job = defs.resolve_implicit_global_asset_job_def()
    manual = job.execute_in_process(instance=instance, partition_key=batch_k, asset_selection=asset_keys(table),
                                    raise_on_error=False)                # the operator re-executes k
    assert manual.success
    assert _latest(instance, REPLICA, batch_k)["skipped_already_applied"] is True
    assert _latest(instance, OPENSEARCH, batch_k)["skipped_already_applied"] is False

    rest = drain(defs, instance, table)
    assert [t.requested for t in rest if t.requested] == [[(batch_k1, batch_k1)]]
    assert all(all(t.succeeded) for t in rest)
    expected = _source_rows(spark, fq)
    assert _documents(opensearch_url) == expected
    replica = sorted((r.id, r.name, r.qty) for r in spark.table(f"{catalog_settings.name}.db.items_replica").collect())
    assert replica == expected

    # Re-running an applied partition (k, now behind both checkpoints) changes nothing.
    replica_snapshot = catalog.load_table("db.items_replica").current_snapshot().snapshot_id
    again = job.execute_in_process(instance=instance, partition_key=batch_k, asset_selection=asset_keys(table),
                                   raise_on_error=False)
    assert again.success
    assert _latest(instance, OPENSEARCH, batch_k)["skipped_already_applied"] is True
    assert _latest(instance, REPLICA, batch_k)["skipped_already_applied"] is True
    assert catalog.load_table("db.items_replica").current_snapshot().snapshot_id == replica_snapshot
    assert _documents(opensearch_url) == expected

    # The asset checks ran with that run and agree: both sinks match the source at their checkpoint.
    evaluations = {(e.asset_key, e.check_name): e for e in again.get_asset_check_evaluations()}
    for key in (OPENSEARCH, REPLICA):
        evaluation = evaluations[(key, "matches_source_at_checkpoint")]
        assert evaluation.passed, evaluation.metadata
        assert evaluation.metadata["checkpoint_snapshot_id"].value == batch_k1
        assert evaluation.metadata["sink_rows"].value == len(expected)
    assert evaluations[(CHANGELOG, "no_stuck_snapshots")].passed
    assert AssetCheckKey(OPENSEARCH, "matches_source_at_checkpoint") in defs.resolve_asset_graph().asset_check_keys


def test_consistency_check_fails_when_the_replica_drifts(spark, catalog_settings, catalog, instance, tmp_path):
    fq = f"{catalog_settings.name}.db.items"
    spark.sql(f"CREATE TABLE {fq} (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('n', id), CAST(id AS INT) FROM range(0, 12)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.items", "identifier_columns": ["id"],
        "sinks": [{"iceberg": {"table_name": "db.items_replica"}}]}]))
    defs = build_definitions(config)
    table = config.tables[0]
    assert tick(defs, instance, table).succeeded == [True]
    spark.sql(f"UPDATE {catalog_settings.name}.db.items_replica SET name = 'drifted' WHERE id = 3")
    bootstrap = instance.get_dynamic_partitions(naming.partitions_name(table))[0]
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance, partition_key=bootstrap, asset_selection=asset_keys(table),
                                    raise_on_error=False)
    check = next(e for e in result.get_asset_check_evaluations()
                 if e.asset_key == REPLICA and e.check_name == "matches_source_at_checkpoint")
    # Sampling 12 rows of 12 always includes the drifted one.
    assert not check.passed
    assert "drifted" not in check.metadata["first_mismatch"].value and "'id': 3" in check.metadata["first_mismatch"].value

