"""When the table changes under a line (real Spark, Iceberg, OpenSearch over HTTP, Dagster instance):
a rollback, an expired checkpoint snapshot and a dropped-and-recreated table are detected and named
(sensor skip reason, ``icecdc status``, the ``line_follows_table`` check) with the command that
recovers; ``icecdc resync`` re-bootstraps the line and every sink converges to the table."""

import pytest
from dagster import AssetCheckKey, AssetKey
from opensearchpy import OpenSearch

from icecdc_dagster.assets import naming
from icecdc_dagster.assets.naming import asset_keys
from icecdc_dagster.changelog.ordinals import OrdinalAnchor, sequence_number
from icecdc_dagster.cli import main
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.errors import SnapshotOrderLostError, SupersededPartitionError
from icecdc_dagster.status import table_status
from icecdc_dagster.sync import SyncContext, resync_table
from tests.dagster_layer.harness import drain, tick
from tests.helpers import BOTH_CATALOGS, write_pipeline

INDEX = "items"
CHANGELOG = AssetKey(["changelog", "db", "items_changelog"])


def _rows(spark, name):
    return sorted((r.id, r.name, r.qty) for r in spark.table(name).collect())


def _documents(url):
    client = OpenSearch(hosts=[url])
    client.indices.refresh(index=INDEX)
    hits = client.search(index=INDEX, body={"query": {"match_all": {}}, "size": 1000})["hits"]["hits"]
    return sorted((int(h["_id"]), h["_source"]["name"], h["_source"]["qty"]) for h in hits)


def _setup(spark, catalog_settings, tmp_path, sinks, rows=20, format_version=2):
    fq = f"{catalog_settings.name}.db.items"
    modes = "" if format_version == 1 else ", 'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read'"
    spark.sql(f"""CREATE TABLE {fq} (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg
                  TBLPROPERTIES ('format-version'='{format_version}'{modes})""")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('n', id), CAST(id AS INT) FROM range(0, {rows})")
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.items", "identifier_columns": ["id"], "sinks": sinks}])
    config = load_config(path)
    return fq, config, build_definitions(config), config.tables[0], str(path)


def _line_check(defs, instance, table):
    """The ``line_follows_table`` evaluation of the two line checks executed alone (the changelog's step runs
    them without materialising anything), as a user's "execute checks" does."""
    checks = {AssetCheckKey(CHANGELOG, "line_follows_table"), AssetCheckKey(CHANGELOG, "no_stuck_snapshots")}
    job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection=set(), asset_check_selection=checks)
    result = job.execute_in_process(instance=instance)
    evaluations = {e.asset_check_key.name: e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == {"line_follows_table", "no_stuck_snapshots"}
    assert not result.get_asset_materialization_events()
    return evaluations["line_follows_table"]


def _resync(config, defs, instance, path):
    from icecdc_dagster.lease.holder import Holder

    context = SyncContext(defs=defs, instance=instance, holder=Holder.current(), config_path=path)
    return resync_table(config, defs, instance, "db.items", context=context)


def test_a_format_v1_line_rolled_back_below_its_anchor_stops_named_then_resync_recovers(
        spark, catalog_settings, catalog, instance, tmp_path):
    """Format v1 has no sequence numbers: the line numbers its snapshots along parent ids from its anchor (the
    last stored batch). Rolled back below the anchor and written again, the new snapshot is linked to the
    anchor no more, so its place cannot be counted; a real sync stops the line naming the rollback and the
    command (before any snapshot is counted), and ``icecdc resync`` starts a new line that goes on with CDC."""
    fq, config, defs, table, path = _setup(spark, catalog_settings, tmp_path,
                                           [{"iceberg": {"table_name": "db.items_replica"}}], format_version=1)
    replica = f"{catalog_settings.name}.db.items_replica"
    assert all(all(t.succeeded) for t in drain(defs, instance, table))          # the export
    good = catalog.load_table("db.items").current_snapshot().snapshot_id
    spark.sql(f"UPDATE {fq} SET qty = qty + 100 WHERE id < 5")
    spark.sql(f"DELETE FROM {fq} WHERE id >= 15")
    assert all(all(t.succeeded) for t in drain(defs, instance, table))
    assert _rows(spark, replica) == _rows(spark, fq)
    anchored = catalog.load_table("db.items").current_snapshot().snapshot_id  # the line's last stored batch
    record = instance.fetch_materializations(CHANGELOG, limit=1).records[0].asset_materialization
    anchor = OrdinalAnchor(int(record.metadata["snapshot_id"].value), int(record.metadata["sequence_number"].value))
    assert anchor.snapshot_id == anchored and anchor.ordinal == 3               # export, update, delete

    spark.sql(f"CALL {catalog_settings.name}.system.rollback_to_snapshot('db.items', {good})")
    spark.sql(f"INSERT INTO {fq} VALUES (100, 'new', 1)")
    written = catalog.load_table("db.items").current_snapshot().snapshot_id
    with pytest.raises(SnapshotOrderLostError, match=f"snapshot {written} is no longer linked to it"):
        sequence_number(catalog.load_table("db.items"), written, anchor)
    command = f"icecdc resync --config {path} --table db.items"
    stopped = tick(defs, instance, table)
    assert stopped.requested == [] and "rolled back" in stopped.skip_reason and command in stopped.skip_reason
    assert str(anchored) in stopped.skip_reason
    assert _rows(spark, replica) != _rows(spark, fq)                            # nothing applied out of order

    report = _resync(config, defs, instance, path)
    assert report.sync.ok and "rolled back" in report.diagnosis, report.render()
    assert _rows(spark, replica) == _rows(spark, fq)
    spark.sql(f"DELETE FROM {fq} WHERE id = 100")                               # the new line counts on
    assert all(all(t.succeeded) for t in drain(defs, instance, table))
    assert _rows(spark, replica) == _rows(spark, fq) and (100, "new", 1) not in _rows(spark, replica)


@BOTH_CATALOGS
def test_rollback_is_named_everywhere_then_resync_converges_both_sinks(
        spark, catalog_settings, catalog, instance, tmp_path, opensearch_url):
    fq, config, defs, table, path = _setup(spark, catalog_settings, tmp_path, [
        {"opensearch": {"hosts": [opensearch_url], "index": INDEX}},
        {"iceberg": {"table_name": "db.items_replica"}}])
    assert tick(defs, instance, table).succeeded == [True]
    good = catalog.load_table("db.items").current_snapshot().snapshot_id
    spark.sql(f"UPDATE {fq} SET qty = qty + 100 WHERE id < 5")
    spark.sql(f"DELETE FROM {fq} WHERE id >= 15")
    assert all(all(t.succeeded) for t in drain(defs, instance, table))
    rolled_back = catalog.load_table("db.items").current_snapshot().snapshot_id
    assert _documents(opensearch_url) == _rows(spark, fq)

    # The table is rolled back past what the sinks applied, then written again.
    spark.sql(f"CALL {catalog_settings.name}.system.rollback_to_snapshot('db.items', {good})")
    spark.sql(f"INSERT INTO {fq} VALUES (100, 'new', 1)")
    command = f"icecdc resync --config {path} --table db.items"

    stopped = tick(defs, instance, table)          # no exception, no run: a skip reason with the fix
    assert stopped.requested == [] and stopped.added == []
    assert "rolled back" in stopped.skip_reason and str(rolled_back) in stopped.skip_reason
    assert command in stopped.skip_reason
    status = table_status(defs, instance, table, path)
    assert status.problem and "rolled back" in status.problem and command in status.problem
    assert "STOPPED: db.items was rolled back" in status.render()
    assert all(s.error and command in s.error for s in status.sinks), status.render()
    evaluation = _line_check(defs, instance, table)
    assert not evaluation.passed and evaluation.metadata["problem"].value == "rolled back"
    assert evaluation.metadata["recover"].value == command

    report = _resync(config, defs, instance, path)
    assert report.sync.ok and report.diagnosis and "rolled back" in report.diagnosis, report.render()
    current = catalog.load_table("db.items").current_snapshot().snapshot_id
    assert report.key == f"{current}@resync1" and report.superseded == 3
    expected = _rows(spark, fq)
    assert (100, "new", 1) in expected and (4, "n4", 4) in expected and (18, "n18", 18) in expected
    assert _documents(opensearch_url) == expected                      # stale documents deleted
    assert _rows(spark, f"{catalog_settings.name}.db.items_replica") == expected
    assert _line_check(defs, instance, table).passed

    # The new line continues with CDC; superseded partitions are never applied again.
    spark.sql(f"DELETE FROM {fq} WHERE id = 100")
    ticks = drain(defs, instance, table)
    assert [len(t.requested) for t in ticks if t.requested] == [1] and all(all(t.succeeded) for t in ticks)
    expected = _rows(spark, fq)
    assert _documents(opensearch_url) == expected
    assert _rows(spark, f"{catalog_settings.name}.db.items_replica") == expected
    status = table_status(defs, instance, table, path)
    assert status.problem is None and status.line == report.key and status.superseded_partitions == 3
    # The resync built a new index version behind the alias; status names it.
    assert f"opensearch/{INDEX}: checkpoint" in status.render() and "index items -> items_v2" in status.render()
    assert all(s.error is None and s.pending_snapshots == 0 for s in status.sinks), status.render()
    old = instance.get_dynamic_partitions(naming.partitions_name(table))[0]
    job = defs.resolve_implicit_global_asset_job_def()
    rerun = job.execute_in_process(instance=instance, partition_key=old, asset_selection=asset_keys(table),
                                   raise_on_error=False)
    assert not rerun.success
    assert any(SupersededPartitionError.__name__ in str(e.event_specific_data.error)
               for e in rerun.all_events if e.is_step_failure)
    assert _documents(opensearch_url) == expected


def test_expired_checkpoint_snapshot_is_named_then_resync_recovers(spark, catalog_settings, catalog, instance,
                                                                   tmp_path, capsys, monkeypatch):
    fq, config, defs, table, path = _setup(spark, catalog_settings, tmp_path, [
        {"iceberg": {"table_name": "db.items_replica"}}])
    assert tick(defs, instance, table).succeeded == [True]
    checkpoint = catalog.load_table("db.items").current_snapshot().snapshot_id
    spark.sql(f"UPDATE {fq} SET qty = -1 WHERE id = 3")        # merge-on-read: needs its parent to diff
    spark.sql(f"DELETE FROM {fq} WHERE id = 4")
    spark.sql(f"CALL {catalog_settings.name}.system.expire_snapshots(table => 'db.items', "
              f"older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)")
    stopped = tick(defs, instance, table)
    assert stopped.requested == [] and "expired" in stopped.skip_reason and str(checkpoint) in stopped.skip_reason
    assert f"icecdc resync --config {path} --table db.items" in stopped.skip_reason
    replica = next(s for s in table_status(defs, instance, table, path).sinks)
    assert replica.checkpoint_snapshot_id == checkpoint and "expired" in replica.error

    # Through the CLI, on the same Dagster instance: status names it, resync recovers (exit 0).
    home = instance.root_directory
    monkeypatch.setenv("DAGSTER_HOME", home)     # the CLI sets it; restored after the test
    capsys.readouterr()
    assert main(["status", "--config", path, "--dagster-home", home]) == 0
    assert f"STOPPED: db.items: snapshot {checkpoint}" in capsys.readouterr().out
    assert main(["resync", "--config", path, "--dagster-home", home, "--table", "db.items"]) == 0
    out = capsys.readouterr().out
    current = catalog.load_table("db.items").current_snapshot().snapshot_id
    assert f"db.items: resync: db.items: snapshot {checkpoint}" in out and "expired" in out
    assert f"new bootstrap partition {current}@resync1 at snapshot {current}" in out
    assert "db.items: 1/1 runs succeeded; ok" in out
    assert _rows(spark, f"{catalog_settings.name}.db.items_replica") == _rows(spark, fq)
    assert main(["status", "--config", path, "--dagster-home", home]) == 0
    assert f"checkpoint {current}, 0 snapshots pending" in capsys.readouterr().out


def test_recreated_table_is_named_then_resync_replaces_sink_contents(
        spark, catalog_settings, catalog, instance, tmp_path, opensearch_url):
    fq, config, defs, table, path = _setup(spark, catalog_settings, tmp_path, [
        {"opensearch": {"hosts": [opensearch_url], "index": INDEX}},
        {"iceberg": {"table_name": "db.items_replica"}}], rows=12)
    assert all(all(t.succeeded) for t in drain(defs, instance, table))
    old_uuid = str(catalog.load_table("db.items").metadata.table_uuid)

    spark.sql(f"DROP TABLE {fq}")
    spark.sql(f"CREATE TABLE {fq} (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg "
              f"TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('r', id), 7 FROM range(5, 9)")   # fewer rows, seq restarts
    stopped = tick(defs, instance, table)
    assert stopped.requested == [] and "dropped and recreated" in stopped.skip_reason
    assert old_uuid in stopped.skip_reason and "--table db.items" in stopped.skip_reason
    assert "dropped and recreated" in table_status(defs, instance, table, path).problem

    report = _resync(config, defs, instance, path)
    assert report.sync.ok, report.render()
    expected = _rows(spark, fq)
    assert expected == [(i, f"r{i}", 7) for i in range(5, 9)]
    # The new table's sequence numbers restarted at 1: the resync line still outranks old documents.
    assert _documents(opensearch_url) == expected
    assert _rows(spark, f"{catalog_settings.name}.db.items_replica") == expected
    assert _line_check(defs, instance, table).passed


def test_resync_whose_sink_step_fails_is_retried_before_the_line_goes_on(
        spark, catalog_settings, catalog, instance, tmp_path, opensearch_url, proxy, monkeypatch):
    """A requested resync whose changelog step succeeds but whose OpenSearch step fails: the next ticks
    retry the resync partition itself; they never add the plain ids of the snapshots it covers (the
    sinks' latest keys disagree on the line, so the sensor reads the whole line)."""
    fq, config, defs, table, path = _setup(spark, catalog_settings, tmp_path, [
        {"opensearch": {"hosts": [proxy.url], "index": INDEX, "max_retries": 1, "request_timeout_s": 5}},
        {"iceberg": {"table_name": "db.items_replica"}}])
    assert tick(defs, instance, table).succeeded == [True]
    spark.sql(f"UPDATE {fq} SET qty = qty + 100 WHERE id < 5")
    spark.sql(f"DELETE FROM {fq} WHERE id >= 15")
    proxy.cut()
    report = _resync(config, defs, instance, path)
    assert not report.sync.ok and report.diagnosis is None
    current = catalog.load_table("db.items").current_snapshot().snapshot_id
    assert report.key == f"{current}@resync1"
    keys_before = instance.get_dynamic_partitions(naming.partitions_name(table))

    proxy.restore()
    from icecdc_dagster.lease import retry

    monkeypatch.setattr(retry, "RETRY_BACKOFF_S", 0.0)   # the transient failure's backoff has passed
    retried = tick(defs, instance, table)
    assert retried.added == [] and retried.requested == [(report.key, report.key)], retried
    assert retried.succeeded == [True]
    assert instance.get_dynamic_partitions(naming.partitions_name(table)) == keys_before
    expected = _rows(spark, fq)
    assert _documents(opensearch_url) == expected
    assert _rows(spark, f"{catalog_settings.name}.db.items_replica") == expected
    # Then the line goes on from the resync partition as usual.
    spark.sql(f"DELETE FROM {fq} WHERE id = 1")
    ticks = drain(defs, instance, table)
    assert [len(t.requested) for t in ticks if t.requested] == [1] and all(all(t.succeeded) for t in ticks)
    assert _documents(opensearch_url) == _rows(spark, fq)


def test_expired_parent_of_the_next_merge_on_read_batch_is_named_on_the_usual_tick(
        spark, catalog_settings, catalog, instance, tmp_path):
    """The applied snapshot is expired after the line passed it (the chain after it is intact, so the
    line still follows the table), but the next batch has delete files and needs that parent's rows:
    the tick names it with the recovery command instead of requesting a run that must fail."""
    fq, config, defs, table, path = _setup(spark, catalog_settings, tmp_path, [
        {"iceberg": {"table_name": "db.items_replica"}}], rows=10)
    assert tick(defs, instance, table).succeeded == [True]
    parent = catalog.load_table("db.items").current_snapshot().snapshot_id
    spark.sql(f"UPDATE {fq} SET qty = -1 WHERE id = 3")            # merge-on-read: a delete file
    spark.sql(f"CALL {catalog_settings.name}.system.expire_snapshots(table => 'db.items', "
              f"snapshot_ids => ARRAY({parent}))")
    nxt = catalog.load_table("db.items").current_snapshot()
    assert nxt.parent_snapshot_id == parent and catalog.load_table("db.items").snapshot_by_id(parent) is None
    stopped = tick(defs, instance, table)
    assert stopped.requested == [], stopped
    assert f"snapshot {parent}, the parent of the next batch {nxt.snapshot_id}" in stopped.skip_reason
    assert f"icecdc resync --config {path} --table db.items" in stopped.skip_reason
    evaluation = _line_check(defs, instance, table)
    assert not evaluation.passed and evaluation.metadata["problem"].value == "snapshot expired"
    assert str(parent) in evaluation.metadata["message"].value
    report = _resync(config, defs, instance, path)
    assert report.sync.ok, report.render()
    assert _rows(spark, f"{catalog_settings.name}.db.items_replica") == _rows(spark, fq)
    assert _line_check(defs, instance, table).passed
