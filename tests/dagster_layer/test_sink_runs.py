"""Both sinks behind the real sensor and real runs: an OpenSearch index (over HTTP, through a
TCP proxy we can cut) and an Iceberg replica. A failed batch blocks the line until it is
retried, an applied partition re-run changes nothing, and the asset checks run and pass."""

from dagster import AssetCheckKey, AssetKey, AssetRecordsFilter
from opensearchpy import OpenSearch

from icecdc_dagster.assets import naming
from icecdc_dagster.assets.naming import asset_keys
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from tests.dagster_layer.harness import drain, tick
from tests.helpers import write_pipeline

INDEX = "items"
CHANGELOG = AssetKey(["changelog", "db", "items_changelog"])
OPENSEARCH = AssetKey(["opensearch", f"{INDEX}_opensearch"])
REPLICA = AssetKey(["replica", "db", "db_items_replica"])


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
        spark, catalog_settings, catalog, instance, tmp_path, opensearch_url, proxy, monkeypatch):
    from icecdc_dagster.assets.naming import table_line
    from icecdc_dagster.lease import retry
    from icecdc_dagster.lines import line as lines

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
    monkeypatch.setattr(retry, "RETRY_BACKOFF_S", 0.0)
    failed = tick(defs, instance, table)                              # k fails in the OpenSearch sink
    assert failed.requested == [(batch_k, batch_k)] and failed.succeeded == [False]
    retried = tick(defs, instance, table)                             # transient (no answer): retried
    assert retried.requested == [(batch_k, batch_k)] and retried.succeeded == [False]
    monkeypatch.setattr(retry, "RETRY_BACKOFF_S", 600.0)
    blocked = tick(defs, instance, table)                             # inside the backoff: the line waits
    assert blocked.requested == [] and batch_k in blocked.skip_reason and "transient" in blocked.skip_reason
    assert lines.failures_of(instance, table_line(table), batch_k) == 0   # max_retries (1) not spent
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


def test_consistency_checks_fail_when_a_sink_drifts(spark, catalog_settings, catalog, instance, tmp_path,
                                                    opensearch_url):
    fq = f"{catalog_settings.name}.db.items"
    spark.sql(f"CREATE TABLE {fq} (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('n', id), CAST(id AS INT) FROM range(0, 12)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.items", "identifier_columns": ["id"],
        "sinks": [{"iceberg": {"table_name": "db.items_replica"}},
                  {"opensearch": {"hosts": [opensearch_url], "index": INDEX}}]}]))
    defs = build_definitions(config)
    table = config.tables[0]
    assert tick(defs, instance, table).succeeded == [True]
    spark.sql(f"UPDATE {catalog_settings.name}.db.items_replica SET name = 'drifted' WHERE id = 3")
    client = OpenSearch(hosts=[opensearch_url])
    client.index(index=INDEX, id="5", body={"id": 5, "name": "drifted", "qty": 5}, refresh=True)
    bootstrap = instance.get_dynamic_partitions(naming.partitions_name(table))[0]
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance, partition_key=bootstrap, asset_selection=asset_keys(table),
                                    raise_on_error=False)
    checks = {e.asset_key: e for e in result.get_asset_check_evaluations()
              if e.check_name == "matches_source_at_checkpoint"}
    # Sampling 12 rows of 12 always includes the drifted one; the counts still agree (from metadata).
    replica, index = checks[REPLICA], checks[OPENSEARCH]
    assert not replica.passed and replica.metadata["sink_rows"].value == replica.metadata["source_rows"].value == 12
    assert "drifted" not in replica.metadata["first_mismatch"].value
    assert "'id': 3" in replica.metadata["first_mismatch"].value
    assert not index.passed and index.metadata["sink_rows"].value == 12
    assert index.metadata["first_mismatch"].value.startswith("document 5 differs")



def _check_evaluations(defs, instance, table, partition):
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance, partition_key=partition, asset_selection=asset_keys(table),
                                    raise_on_error=False)
    assert result.success
    return {(e.asset_key, e.check_name): e for e in result.get_asset_check_evaluations()}


def test_dotted_and_spaced_column_names_sync_into_opensearch_and_replica(
        spark, catalog_settings, catalog, instance, tmp_path, opensearch_url):
    fq = f"{catalog_settings.name}.db.odd"
    spark.sql(f"""CREATE TABLE {fq} (`the.id` BIGINT NOT NULL, `the id` STRING NOT NULL, `the.data` STRING,
                  `a b` INT) USING iceberg
                  TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read',
                                 'write.update.mode'='merge-on-read', 'write.merge.mode'='copy-on-write')""")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('k|', id % 2), concat('d', id), CAST(id AS INT) FROM range(0, 8)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.odd", "identifier_columns": ["the.id", "the id"],
        "sinks": [{"opensearch": {"hosts": [opensearch_url], "index": "odd"}},
                  {"iceberg": {"table_name": "db.odd_replica"}}]}]))
    defs = build_definitions(config)
    table = config.tables[0]
    assert all(all(t.succeeded) for t in drain(defs, instance, table))
    spark.sql(f"UPDATE {fq} SET `the.data` = 'changed', `a b` = -`a b` WHERE `the.id` < 3")
    spark.sql(f"DELETE FROM {fq} WHERE `the.id` = 5")
    spark.sql(f"MERGE INTO {fq} t USING (SELECT 6 AS i, 'k|0' AS k UNION ALL SELECT 9 AS i, 'k|1' AS k) s "
              "ON t.`the.id` = s.i AND t.`the id` = s.k WHEN MATCHED THEN UPDATE SET `a b` = 600 "
              "WHEN NOT MATCHED THEN INSERT (`the.id`, `the id`, `the.data`, `a b`) VALUES (s.i, s.k, 'new', 9)")
    ticks = drain(defs, instance, table)
    # One catch-up run: the net changes of the three snapshots.
    assert [len(t.added) for t in ticks if t.requested] == [3] and all(all(t.succeeded) for t in ticks)

    expected = sorted(tuple(r) for r in spark.table(fq).collect())
    assert len(expected) == 8 and (9, "k|1", "new", 9) in expected and (6, "k|0", "d6", 600) in expected
    client = OpenSearch(hosts=[opensearch_url])
    client.indices.refresh(index="odd")
    hits = client.search(index="odd", body={"query": {"match_all": {}}, "size": 100})["hits"]["hits"]
    # Composite ids: `|` inside a part is escaped.
    assert sorted((h["_id"], tuple(h["_source"][c] for c in ("the.id", "the id", "the.data", "a b"))) for h in hits) \
        == sorted((f"{r[0]}|{r[1].replace('|', chr(92) + '|')}", r) for r in expected)
    replica = sorted(tuple(r) for r in spark.table(f"{catalog_settings.name}.db.odd_replica").collect())
    assert replica == expected

    last = str(catalog.load_table("db.odd").current_snapshot().snapshot_id)
    evaluations = _check_evaluations(defs, instance, table, last)
    for key in (AssetKey(["opensearch", "odd_opensearch"]), AssetKey(["replica", "db", "db_odd_replica"])):
        evaluation = evaluations[(key, "matches_source_at_checkpoint")]
        assert evaluation.passed, evaluation.metadata
        assert evaluation.metadata["sink_rows"].value == 8 and evaluation.metadata["sampled_rows"].value == 8


def test_keyless_v3_table_syncs_into_replica_keyed_by_source_row_id_and_into_opensearch(
        spark, catalog_settings, catalog, instance, tmp_path, opensearch_url):
    fq = f"{catalog_settings.name}.db.logs"
    spark.sql(f"""CREATE TABLE {fq} (line STRING, level INT) USING iceberg
                  TBLPROPERTIES ('format-version'='3', 'write.delete.mode'='merge-on-read',
                                 'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')""")
    spark.sql(f"INSERT INTO {fq} SELECT concat('l', id), CAST(id % 3 AS INT) FROM range(0, 9)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.logs", "max_snapshots_per_run": 1,
        "sinks": [{"opensearch": {"hosts": [opensearch_url], "index": "logs"}},
                                           {"iceberg": {"table_name": "db.logs_replica"}}]}]))
    defs = build_definitions(config)
    table = config.tables[0]
    assert all(all(t.succeeded) for t in drain(defs, instance, table))
    spark.sql(f"UPDATE {fq} SET level = level + 10 WHERE level = 1")              # UPDATE: no duplicate rows
    spark.sql(f"UPDATE {fq} SET line = concat(line, '!') WHERE level = 11")       # the same rows again
    spark.sql(f"DELETE FROM {fq} WHERE line = 'l0'")
    spark.sql(f"INSERT INTO {fq} VALUES ('l0', 0)")                               # same values, a new row id
    ticks = drain(defs, instance, table)
    assert len([t for t in ticks if t.requested]) == 4 and all(all(t.succeeded) for t in ticks)

    source = sorted(tuple(r) for r in spark.sql(f"SELECT _row_id, line, level FROM {fq}").collect())
    assert len(source) == 9 and ("l1!", 11) in [r[1:] for r in source]
    replica_table = f"{catalog_settings.name}.db.logs_replica"
    replica = sorted(tuple(r) for r in spark.sql(f"SELECT _source_row_id, line, level FROM {replica_table}").collect())
    assert replica == source
    replica_meta = catalog.load_table("db.logs_replica")
    assert replica_meta.format_version == 3
    assert replica_meta.schema().identifier_field_names() == {"_source_row_id"}
    # The replica has its own row lineage (its _row_id is not the copied source id column).
    assert spark.sql(f"SELECT count(*) FROM {replica_table} WHERE _row_id IS NULL").first()[0] == 0
    client = OpenSearch(hosts=[opensearch_url])
    client.indices.refresh(index="logs")
    hits = client.search(index="logs", body={"query": {"match_all": {}}, "size": 100})["hits"]["hits"]
    assert sorted((int(h["_id"]), h["_source"]["line"], h["_source"]["level"]) for h in hits) == source

    last = str(catalog.load_table("db.logs").current_snapshot().snapshot_id)
    evaluations = _check_evaluations(defs, instance, table, last)
    for key in (AssetKey(["opensearch", "logs_opensearch"]), AssetKey(["replica", "db", "db_logs_replica"])):
        assert evaluations[(key, "matches_source_at_checkpoint")].passed
