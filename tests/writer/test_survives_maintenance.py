"""Checkpoints and ledgers survive maintenance of their own tables: ``rewrite_data_files`` +
``expire_snapshots`` (Iceberg's Spark procedures) between two batches remove every snapshot summary
that recorded them, yet the replica's checkpoint and the ingest ledger are still known (table
properties written in the publish commit), so nothing is refused and nothing is applied twice."""

import json

from icecdc_dagster.batch import BatchInfo
from icecdc_dagster.ingest import IngestSettings, ingest_files, pending_files
from icecdc_dagster.sinks.iceberg import SOURCE_SNAPSHOT_PROPERTY, IcebergReplicaSink
from icecdc_dagster.writer.exactly_once import BATCH_ID_PROPERTY, committed_summaries
from tests.helpers import BOTH_CATALOGS
from tests.sinks.test_iceberg_replica import _events


def _compact_and_expire(spark, cat, table):
    spark.sql(f"CALL {cat}.system.rewrite_data_files(table => '{table}', "
              f"options => map('min-input-files', '1', 'rewrite-all', 'true'))")
    spark.sql(f"CALL {cat}.system.expire_snapshots(table => '{table}', "
              f"older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)")
    summaries = [s for _, _, s in committed_summaries(spark, f"{cat}.{table}")]
    assert len(summaries) == 1 and summaries[0].get("replace-partitions") is None  # only the compaction is left
    return summaries[0]


def _batch(snapshot_id, seq, preds, export=False):
    return BatchInfo("db.src", snapshot_id, seq, snapshot_id, tuple(preds), "overwrite", 0, is_export=export,
                     identifier_columns=("id",))


@BOTH_CATALOGS
def test_replica_checkpoint_survives_compaction_and_expiry(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.src (id bigint NOT NULL, name string, day date) USING iceberg "
              f"TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read', "
              f"'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')")
    sink = IcebergReplicaSink(spark, cat, catalog, "db.dst", catalog.load_table("db.src"), ("id",))
    sink.apply(_batch(100, 1, [], export=True), _events(spark, [("INSERT", i, f"n{i}") for i in range(6)], 100, 1))
    first = [("UPDATE_AFTER", 1, "x1"), ("DELETE", 2, "n2")]
    sink.apply(_batch(101, 2, [100]), _events(spark, first, 101, 2))

    left = _compact_and_expire(spark, cat, "db.dst")
    assert SOURCE_SNAPSHOT_PROPERTY not in left          # the summaries that held the checkpoint are gone
    assert sink.read_checkpoint().snapshot_id == 101
    rerun = sink.apply(_batch(101, 2, [100]), _events(spark, first, 101, 2))
    assert rerun.skipped                                  # not applied twice
    result = sink.apply(_batch(102, 3, [101]), _events(spark, [("INSERT", 9, "n9"), ("DELETE", 0, "n0")], 102, 3))
    assert not result.skipped and result.counts == {"inserted": 1, "updated": 0, "deleted": 1, "delete_missing": 0}
    assert {r.id: r.name for r in spark.table(f"{cat}.db.dst").collect()} == {
        1: "x1", 3: "n3", 4: "n4", 5: "n5", 9: "n9"}
    assert sink.read_checkpoint().snapshot_id == 102


def _event(op, key, name=None):
    image = {"id": key, "name": name}
    return json.dumps({"payload": {"op": op, "before": image if op == "d" else None,
                                   "after": None if op == "d" else image}})


def test_ingest_ledger_survives_compaction_and_expiry(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "001.json").write_text("\n".join([_event("c", 1, "a"), _event("c", 2, "b"), _event("c", 3, "c"),
                                                 "not json"]) + "\n")
    settings = IngestSettings(landing=str(landing), target="db.customers", identifier_columns=("id",),
                              auto_create=True)
    first = pending_files(spark, cat, settings)
    ingest_files(spark, cat, catalog, settings, first)
    spark.sql(f"ALTER TABLE {cat}.db.customers SET TBLPROPERTIES ('write.delete.mode'='merge-on-read', "
              f"'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')")
    (landing / "002.json").write_text("\n".join([_event("u", 1, "a2"), _event("d", 2)]) + "\n")
    ingest_files(spark, cat, catalog, settings, pending_files(spark, cat, settings))
    # a re-delivery of the first file's insert of 2 must not resurrect it: the batch is known
    for table in ("db.customers", "db.customers__dead_letters"):
        left = _compact_and_expire(spark, cat, table)
        assert BATCH_ID_PROPERTY not in left                # the summaries that held the batch ids are gone

    assert pending_files(spark, cat, settings) == []        # nothing is re-listed as pending
    again = ingest_files(spark, cat, catalog, settings, first)
    assert again.skipped                                     # a re-executed partition writes nothing
    (landing / "003.json").write_text(_event("c", 4, "d") + "\n")
    assert [p.rsplit("/", 1)[-1] for p in pending_files(spark, cat, settings)] == ["003.json"]
    ingest_files(spark, cat, catalog, settings, pending_files(spark, cat, settings))
    assert {r.id: r.name for r in spark.table(f"{cat}.db.customers").collect()} == {1: "a2", 3: "c", 4: "d"}
    assert spark.table(f"{cat}.db.customers__dead_letters").count() == 1
