"""Each sink materialisation's counts are what it applied (issue 31, item 2): the events of the batch
per change type, next to the sink's own outcome counts; and the source's observation carries the
table's real row count. The sink's counts agree with the events, else the batch says so
(``sink_disagreements``, a warning, the failing check ``sink_counts_agree``). Real sensor ticks and runs,
read back from the instance's event log."""

import logging

from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetRecordsFilter,
)

from icecdc_dagster.assets.naming import COUNTS_CHECK
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


def _counts_check(instance, key):
    """The latest evaluation of the sink's ``sink_counts_agree`` check."""
    record = instance.get_latest_asset_check_evaluation_record(AssetCheckKey(key, COUNTS_CHECK))
    assert record is not None and record.event is not None, f"{key.to_user_string()}: the check never ran"
    return record.event.dagster_event.event_specific_data


def _warnings(instance, key, partition):
    """The warnings of the run that materialised ``key [partition]``."""
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[partition]),
                                              limit=1).records
    return [e.user_message for e in instance.all_logs(records[0].run_id) if e.level == logging.WARNING]


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
        ticks = drain(defs, instance, table)
        assert all(all(t.succeeded) for t in ticks)
        # Every batch run executes the sinks' counts checks (the line's check selection).
        assert {AssetCheckKey(REPLICA, COUNTS_CHECK), AssetCheckKey(INDEX, COUNTS_CHECK)} <= set(
            ticks[0].run_requests[0].asset_check_keys)
        for key in (REPLICA, INDEX):
            evaluation = _counts_check(instance, key)
            assert evaluation.passed, evaluation.metadata
            assert evaluation.metadata["snapshot_id"].value == snapshots[-1]
            assert "sink_disagreements" not in _metadata(instance, key, snapshots[-1])
            assert not [w for w in _warnings(instance, key, snapshots[-1]) if "sink_disagreements" in w]
    export, update, delete = snapshots

    replica = _metadata(instance, REPLICA, export)
    assert (replica["rows"], replica["count_insert"], replica["sink_inserted"]) == (12, 12, 12)
    assert replica["dagster/partition_row_count"] == 12
    replica = _metadata(instance, REPLICA, update)
    assert (replica["rows"], replica["count_update_after"], replica["count_update_before"]) == (3, 3, 0)
    assert replica["sink_updated"] == 3
    assert (replica["sink_inserted"], replica["sink_deleted"], replica["sink_delete_missing"]) == (0, 0, 0)  # shown
    replica = _metadata(instance, REPLICA, delete)
    assert (replica["rows"], replica["count_delete"], replica["sink_deleted"]) == (2, 2, 2)
    index = _metadata(instance, INDEX, update)
    assert (index["rows"], index["count_update_after"], index["sink_actions"]) == (3, 3, 3)
    index = _metadata(instance, INDEX, delete)
    assert (index["rows"], index["count_delete"], index["sink_actions"]) == (2, 2, 2)

    # What the sensor records for the source (its harness tick does not store sensor asset events).
    observation, filled = source_observations(table, catalog_settings.name, catalog.load_table("db.items"), [delete])
    assert isinstance(observation, AssetObservation) and isinstance(filled, AssetMaterialization)
    assert filled.metadata["dagster/row_count"].value == spark.table(fq).count() == 10


def test_inserts_of_keys_the_source_already_holds_are_a_disagreement(spark, catalog_settings, catalog, instance,
                                                                     tmp_path):
    """Rows appended with keys the source already has: each key has one INSERT in its snapshot, so the
    engine has nothing to refuse, and the replica upserts them. The batch applies (its commit holds the
    checkpoint), shows the true counts and what disagrees, warns, and fails the check, which stays failed
    on later batches that agree (the replica has not equalled the source since) until a resync."""
    from icecdc_dagster.lease.holder import Holder
    from icecdc_dagster.status import table_status
    from icecdc_dagster.sync import SyncContext, resync_table

    fq = f"{catalog_settings.name}.db.items"
    spark.sql(f"""CREATE TABLE {fq} (id BIGINT NOT NULL, qty INT) USING iceberg
                  TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read',
                                 'write.update.mode'='merge-on-read')""")
    spark.sql(f"INSERT INTO {fq} SELECT id, CAST(id AS INT) FROM range(0, 12)")
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.items", "identifier_columns": ["id"], "max_snapshots_per_run": 1,
        "sinks": [{"iceberg": {"table_name": "db.items_replica"}}]}])
    config = load_config(path)
    defs, table = build_definitions(config), config.tables[0]
    assert all(all(t.succeeded) for t in drain(defs, instance, table))               # the export

    # 5 keys the table holds (0..4) and 2 new ones (20, 21), as one plain append.
    spark.sql(f"INSERT INTO {fq} SELECT id, -1 FROM range(0, 5) UNION ALL SELECT id, -1 FROM range(20, 22)")
    appended = str(catalog.load_table("db.items").current_snapshot().snapshot_id)
    assert all(all(t.succeeded) for t in drain(defs, instance, table))               # applied, not failed

    replica = _metadata(instance, REPLICA, appended)
    assert (replica["count_insert"], replica["sink_inserted"], replica["sink_updated"]) == (7, 2, 5)
    assert replica["checkpoint_snapshot_id"] == replica["diverged_at_snapshot_id"] == appended
    assert [(d["count"], d["found"], d["events"], d["expected"], d["difference"])
            for d in replica["sink_disagreements"]] == [("sink_inserted", 2, "count_insert", 7, -5),
                                                         ("sink_updated", 5, "count_update_after", 0, 5)]
    assert "the source holds those keys twice" in replica["sink_disagreements"][0]["cause"]
    # The counts shown are the true ones: the replica gained 2 rows, the source 7.
    assert (spark.table(fq).count(), spark.table(f"{catalog_settings.name}.db.items_replica").count()) == (19, 14)
    (warning,) = [w for w in _warnings(instance, REPLICA, appended) if "sink_disagreements" in w]
    assert "sink_inserted 2 but count_insert 7 (-5)" in warning
    assert f"icecdc resync --config {config.source} --table db.items" in warning      # the real file, as status says
    evaluation = _counts_check(instance, REPLICA)
    assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.ERROR
    assert evaluation.metadata["diverged_at_snapshot_id"].value == appended
    assert [d["count"] for d in evaluation.metadata["sink_disagreements"].value] == ["sink_inserted", "sink_updated"]

    # A later batch that agrees (a key appended once) still fails the check, naming where it diverged.
    spark.sql(f"INSERT INTO {fq} VALUES (30, 30)")
    later = str(catalog.load_table("db.items").current_snapshot().snapshot_id)
    assert all(all(t.succeeded) for t in drain(defs, instance, table))
    replica = _metadata(instance, REPLICA, later)
    assert (replica["count_insert"], replica["sink_inserted"]) == (1, 1) and "sink_disagreements" not in replica
    assert replica["diverged_at_snapshot_id"] == appended
    evaluation = _counts_check(instance, REPLICA)
    assert not evaluation.passed and evaluation.metadata["snapshot_id"].value == later
    assert evaluation.metadata["diverged_at_snapshot_id"].value == appended
    assert evaluation.metadata["recover"].value == f"icecdc resync --config {config.source} --table db.items"
    # `icecdc status` says it too, for those who do not read the UI.
    (diverged,) = [w for w in table_status(defs, instance, table, str(path)).warnings if "diverged" in w]
    assert f"at snapshot {appended}" in diverged and f"icecdc resync --config {path} --table db.items" in diverged

    # The source's copies deleted: the batch agrees (5 deletes), but the replica lost keys 0..4 with them.
    spark.sql(f"DELETE FROM {fq} WHERE qty = -1 AND id < 5")
    assert all(all(t.succeeded) for t in drain(defs, instance, table))
    evaluation = _counts_check(instance, REPLICA)
    assert not evaluation.passed and evaluation.metadata["diverged_at_snapshot_id"].value == appended
    assert spark.table(f"{catalog_settings.name}.db.items_replica").count() == spark.table(fq).count() - 5

    # The resync's export replaces the replica: the new line agrees.
    context = SyncContext(defs=defs, instance=instance, holder=Holder.current(), config_path=path)
    assert resync_table(config, defs, instance, "db.items", context=context).sync.ok
    evaluation = _counts_check(instance, REPLICA)
    assert evaluation.passed and "diverged_at_snapshot_id" not in evaluation.metadata, evaluation.metadata
    assert not [w for w in table_status(defs, instance, table, str(path)).warnings if "diverged" in w]
    assert spark.table(f"{catalog_settings.name}.db.items_replica").count() == spark.table(fq).count() == 15


def test_the_redo_of_a_batch_whose_replica_write_died_before_publishing_agrees(spark, catalog_settings, catalog,
                                                                                instance, tmp_path):
    """A crash between the replica's write and its checkpoint: the batch's rows are on the staging branch,
    main (and the checkpoint with it) is not. The redo MERGEs into main's snapshot again, not onto the
    leftover, so it inserts what the events insert: no false alarm."""
    from icecdc_dagster.writer.exactly_once import STAGING_BRANCH

    fq = f"{catalog_settings.name}.db.items"
    replica = f"{catalog_settings.name}.db.items_replica"
    spark.sql(f"CREATE TABLE {fq} (id BIGINT NOT NULL, qty INT) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {fq} SELECT id, CAST(id AS INT) FROM range(0, 6)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.items", "identifier_columns": ["id"],
        "sinks": [{"iceberg": {"table_name": "db.items_replica"}}]}]))
    defs, table = build_definitions(config), config.tables[0]
    assert all(all(t.succeeded) for t in drain(defs, instance, table))               # the export

    spark.sql(f"INSERT INTO {fq} SELECT id, 7 FROM range(10, 14)")
    batch = str(catalog.load_table("db.items").current_snapshot().snapshot_id)
    spark.sql(f"INSERT INTO {replica}.branch_{STAGING_BRANCH} SELECT id, 7 FROM range(10, 14)")   # the dead write
    assert spark.table(replica).count() == 6
    assert all(all(t.succeeded) for t in drain(defs, instance, table))

    metadata = _metadata(instance, REPLICA, batch)
    assert (metadata["count_insert"], metadata["sink_inserted"], metadata.get("sink_updated", 0)) == (4, 4, 0)
    assert "sink_disagreements" not in metadata and "diverged_at_snapshot_id" not in metadata
    assert _counts_check(instance, REPLICA).passed
    assert spark.table(replica).count() == spark.table(fq).count() == 10


def test_sync_names_the_failed_check_and_exits_3(spark, catalog_settings, catalog, tmp_path, monkeypatch, capsys,
                                                 opensearch_url):
    """``icecdc sync`` over the duplicate-key batch: every batch applied, but the summary is not ``ok``:
    it names the failed checks (asset, check, snapshot) and exits 3 (neither 0, 1 nor 75), so cron and CI
    notice; the checks stay failed (and the exit 3) on the next sync until ``icecdc resync``. The replica
    and the OpenSearch index both report it (the index from its bulk answers: created vs updated)."""
    from dagster import DagsterInstance

    from icecdc_dagster.cli import EXIT_BLOCKED, EXIT_CHECK_FAILED, main

    fq = f"{catalog_settings.name}.db.items"
    spark.sql(f"CREATE TABLE {fq} (id BIGINT NOT NULL, qty INT) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {fq} SELECT id, CAST(id AS INT) FROM range(0, 6)")
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.items", "identifier_columns": ["id"], "max_snapshots_per_run": 1,
        "sinks": [{"iceberg": {"table_name": "db.items_replica"}},
                  {"opensearch": {"hosts": [opensearch_url], "index": "items"}}]}])
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    sync = ["sync", "--config", str(path)]
    assert main(sync) == 0 and "db.items: 1/1 runs succeeded; ok" in capsys.readouterr().out   # the export

    spark.sql(f"INSERT INTO {fq} SELECT id, -1 FROM range(0, 2)")                   # keys 0, 1 appended twice
    appended = str(catalog.load_table("db.items").current_snapshot().snapshot_id)
    assert main(sync) == EXIT_CHECK_FAILED == 3
    out = capsys.readouterr().out
    assert "db.items: 1/1 runs succeeded; CHECKS FAILED: " in out and "; ok" not in out, out
    for sink in (REPLICA, INDEX):
        assert f"{sink.to_user_string()} {COUNTS_CHECK} at snapshot {appended}" in out, out
    with DagsterInstance.get() as instance:                                         # the sync's ($DAGSTER_HOME)
        index = _metadata(instance, INDEX, appended)
    assert (index["count_insert"], index["sink_created"], index["sink_updated"]) == (2, 0, 2)
    assert [d["count"] for d in index["sink_disagreements"]] == ["sink_created", "sink_updated"]

    spark.sql(f"INSERT INTO {fq} VALUES (30, 30)")                                  # agrees, but diverged before
    later = str(catalog.load_table("db.items").current_snapshot().snapshot_id)
    assert main(sync) == 3
    out = capsys.readouterr().out
    for sink in (REPLICA, INDEX):
        assert f"{sink.to_user_string()} {COUNTS_CHECK} at snapshot {later}" in out, out

    spark.sql(f"DELETE FROM {fq} WHERE qty = -1")                                   # the cause removed
    assert main(["resync", "--config", str(path), "--table", "db.items"]) == 0
    assert "db.items: 1/1 runs succeeded; ok" in capsys.readouterr().out

    # A key twice in one snapshot is refused, not counted: the store's write carries the key check, so the
    # batch stops there (nothing stored, no sink reached) and the line is blocked with the check's own words.
    spark.sql(f"INSERT INTO {fq} VALUES (40, 1), (40, 2)")
    twice = catalog.load_table("db.items").current_snapshot().snapshot_id
    assert main(sync) == EXIT_BLOCKED
    out = capsys.readouterr().out
    assert "DuplicateKeyChangeError" in out and f"snapshot {twice}: key {{'id': 40}} has 2 INSERT" in out, out
    assert spark.sql(f"SELECT * FROM {fq}__changelog WHERE _batch_snapshot_id = {twice}").count() == 0
    assert spark.table(f"{catalog_settings.name}.db.items_replica").where("id = 40").count() == 0
