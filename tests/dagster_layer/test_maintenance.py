"""The maintenance asset of a table group against real tables and a real Dagster instance: it compacts
a merge-on-read replica past the delete-file threshold and expires applied changelog batches, while
a sync of the same line runs (it waits for the line lock: no commit is lost, nothing applied twice)."""

import threading

import pytest
from dagster import AssetKey, AssetRecordsFilter

from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.line_lock import LineLock
from icecdc_dagster.sinks.iceberg import IcebergReplicaSink
from icecdc_dagster.steps.table_maintenance import max_delete_files_per_partition
from icecdc_dagster.sync import SyncContext, sync_table
from tests.dagster_layer.harness import drain
from tests.helpers import write_pipeline

MAINTENANCE = AssetKey(["maintenance", "db", "items_maintenance"])


def _rows(spark, name):
    return sorted((r.id, r.name, r.qty) for r in spark.table(name).collect())


# The default run takes the SQL catalog; the same scenario over REST is the slow variant (~7 runs each).
@pytest.mark.parametrize("catalog_settings", ["sql", pytest.param("rest", marks=pytest.mark.slow)], indirect=True)
def test_maintenance_compacts_and_expires_while_a_sync_runs(spark, catalog_settings, catalog, instance, tmp_path):
    cat = catalog_settings.name
    fq, replica = f"{cat}.db.items", f"{cat}.db.items_replica"
    spark.sql(f"""CREATE TABLE {fq} (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg
                  TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read',
                                 'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')""")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('n', id), CAST(id AS INT) FROM range(0, 20)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.items", "identifier_columns": ["id"], "max_snapshots_per_run": 1,
        "compact_delete_files": 2, "changelog_retention": "PT0S",
        "sinks": [{"iceberg": {"table_name": "db.items_replica"}}]}]))
    defs = build_definitions(config)
    table = config.tables[0]
    assert all(all(t.succeeded) for t in drain(defs, instance, table))       # the export
    # Two batches of inserts give the replica new data files; one update then deletes a row in each of
    # three data files: three (file-scoped) delete files in its one partition, above the threshold of 2.
    spark.sql(f"INSERT INTO {fq} VALUES (100, 'a', 1)")
    spark.sql(f"INSERT INTO {fq} VALUES (200, 'b', 2)")
    spark.sql(f"UPDATE {fq} SET qty = qty + 1 WHERE id IN (0, 100, 200)")
    assert all(all(t.succeeded) for t in drain(defs, instance, table))
    assert max_delete_files_per_partition(spark, replica) > 2
    stored_batches = spark.table(f"{fq}__changelog").select("_batch_snapshot_id").distinct().count()
    assert stored_batches == 4

    spark.sql(f"UPDATE {fq} SET qty = -1 WHERE id = 7")        # a batch the sync applies while maintenance runs
    lock = LineLock.for_instance(instance, "db.items")
    context = SyncContext(defs=defs, instance=instance, holder=Holder.current(role="icecdc sync"))
    reports = []
    sync = threading.Thread(target=lambda: reports.append(sync_table(defs, instance, table, context=context)))
    sync.start()
    while sync.is_alive() and not lock.is_busy():         # the sync holds the line ...
        sync.join(0.05)
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance, asset_selection=[MAINTENANCE], raise_on_error=False)
    sync.join()                                           # ... and maintenance waited for it
    assert result.success and reports and reports[0].ok, reports[0].render() if reports else "no sync report"

    assert _rows(spark, replica) == _rows(spark, fq)       # no lost commit, nothing applied twice
    current = catalog.load_table("db.items").current_snapshot().snapshot_id
    sink = IcebergReplicaSink(spark, cat, catalog, "db.items_replica", catalog.load_table("db.items"), ("id",))
    assert sink.read_checkpoint().snapshot_id == current   # survives the replica's compaction + expiry
    assert max_delete_files_per_partition(spark, replica) <= 2
    metadata = instance.fetch_materializations(AssetRecordsFilter(asset_key=MAINTENANCE), limit=1).records[0]
    values = {k: getattr(v, "value", v) for k, v in metadata.asset_materialization.metadata.items()}
    assert values["db.items_replica: compacted"] is True
    assert values["db.items__changelog: deleted batches"] == 5   # every batch is applied and past PT0S
    # The run's totals over its tables (MaintenanceMetadata: what the Plots tab draws), 0 included.
    assert values["tables_maintained"] == 2 and values["tables_compacted"] >= 1 and values["deleted_batches"] == 5
    assert values["expired_snapshots"] == sum(v for k, v in values.items() if k.endswith(": expired snapshots"))
    assert spark.table(f"{fq}__changelog").count() == 0
    assert len(catalog.load_table("db.items_replica").snapshots()) == 1
    # The line goes on after maintenance: a new batch applies on the compacted, expired replica.
    spark.sql(f"DELETE FROM {fq} WHERE id = 8")
    assert all(all(t.succeeded) for t in drain(defs, instance, table))
    assert _rows(spark, replica) == _rows(spark, fq)
