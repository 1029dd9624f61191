"""Debezium ingestion as Dagster assets, with the real landing sensor, runs, Spark and Iceberg:
landing files are ingested in name order, exactly once, bad events go to dead letters, a failed
batch blocks the next one, and the ingested table syncs onward (one lineage graph)."""

import json

import pytest
from dagster import AssetKey, AssetRecordsFilter

from icecdc_dagster.config import IngestConfig, load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.errors import ConfigError, IngestError
from icecdc_dagster.status import ingest_status
from icecdc_dagster.steps.ingest_entry import Batch, batches_for
from tests.dagster_layer.harness import drain, drain_sensor, tick_sensor
from tests.helpers import write_pipeline

INGEST = AssetKey(["ingest", "orders_cdc"])
SENSOR = "landing__orders_cdc"


def _envelope(op, before=None, after=None):
    return json.dumps({"payload": {"op": op, "before": before, "after": after, "ts_ms": 1,
                                   "source": {"schema": "shop", "table": "orders"}}})


def _land(landing, name, lines):
    landing.mkdir(exist_ok=True)
    (landing / name).write_text("\n".join(lines) + "\n")


def _metadata(instance, key, partition):
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[partition]),
                                              limit=1).records
    assert records, f"{key.to_user_string()} [{partition}] was not materialised"
    return {k: getattr(v, "value", v) for k, v in records[0].asset_materialization.metadata.items()}


def _rows(spark, table):
    return {r.id: r.status for r in spark.table(table).collect()}


def test_landing_files_ingest_in_order_exactly_once_then_sync_onward(spark, catalog_settings, catalog, instance,
                                                                      tmp_path):
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    _land(landing, "001.json", [_envelope("c", after={"id": i, "status": "new"}) for i in range(1, 5)])
    _land(landing, "002.json", [_envelope("u", before={"id": 2, "status": "new"}, after={"id": 2, "status": "paid"}),
                                _envelope("d", before={"id": 3, "status": "new"}),
                                "{not json",
                                "null"])
    _land(landing, "003.json", [_envelope("c", after={"id": 5, "status": "new", "note": "gift"}),
                                _envelope("x", after={"id": 6, "status": "?"})])
    config = load_config(write_pipeline(
        tmp_path / "p.yaml", catalog_settings,
        [{"table_name": "db.orders", "sinks": [{"iceberg": {"table_name": "db.orders_replica"}}]}],
        ingest=[{"name": "orders_cdc", "landing": str(landing), "target": "db.orders", "identifier_columns": ["id"],
                 "auto_create": True, "schema_evolution": True, "polling_interval": "PT5S"}]))
    defs = build_definitions(config)   # db.orders does not exist yet: ingestion creates it
    dead_letters = AssetKey(["dead_letters", "db", "orders_dead_letters"])
    declared = defs.resolve_asset_graph().get(dead_letters)
    assert declared.parent_keys == {INGEST}

    graph = defs.resolve_asset_graph()
    source = AssetKey(["iceberg", "db", "orders"])
    assert INGEST in graph.get(source).parent_keys                       # landing -> table -> changelog -> sink
    assert source in graph.get(AssetKey(["changelog", "db", "orders_changelog"])).parent_keys
    assert drain(defs, instance, config.tables[0])[0].skip_reason == "table db.orders does not exist yet"

    ticks = drain_sensor(defs, instance, SENSOR, [INGEST])
    assert ticks[0].added == ["001.json", "002.json", "003.json"]
    assert [t.requested for t in ticks if t.requested] == [[(k, k)] for k in ("001.json", "002.json", "003.json")]
    assert all(all(t.succeeded) for t in ticks) and "ingested" in ticks[-1].skip_reason

    assert _rows(spark, f"{cat}.db.orders") == {1: "new", 2: "paid", 4: "new", 5: "new"}
    assert spark.table(f"{cat}.db.orders").where("id = 5").first().note == "gift"   # schema evolution
    dead = spark.table(f"{cat}.db.orders__dead_letters").collect()
    assert len(dead) == 2 and any("x" in r.raw and "op" in r.reason for r in dead)
    second, third = _metadata(instance, INGEST, "002.json"), _metadata(instance, INGEST, "003.json")
    assert second["dead_lettered"] == 1 and second["tombstones"] == 1 and second["skipped_already_committed"] is False
    assert second["events_read"] == 4 and second["updated"] == 1 and second["deleted"] == 1
    # targets: a table per table written, people read it (markdown): its snapshot, counts, columns added.
    (row,) = [r for r in second["targets"].splitlines() if r.startswith("| `db.orders` |")]
    assert int(row.split(" | ")[1]) in {s.snapshot_id for s in catalog.load_table("db.orders").snapshots()}
    (row,) = [r for r in third["targets"].splitlines() if r.startswith("| `db.orders` |")]
    assert third["dead_lettered"] == 1 and row.split(" | ")[-2] == "note"
    # The target is a configured table with an asset of its own: its metadata is shown there, not twice;
    # the batch that added a column refreshed what that asset shows at the next load.
    assert "dagster/table_name" not in third
    from icecdc_dagster.assets.metadata_cache import load as remembered

    stored = remembered()[f"{cat}.db.orders"]["dagster/column_schema"]
    assert [c.name for c in stored.columns] == [f.name for f in catalog.load_table("db.orders").schema().fields]
    assert "note" in [c.name for c in stored.columns]
    # The dead-letter table: its schema known at load (exactly the table the engine created), its rows
    # reported by each run that finds it.
    from icecdc_dagster.assets.table_metadata import DEAD_LETTER_DOCS, table_metadata

    written = table_metadata(cat, catalog.load_table("db.orders__dead_letters"), docs=DEAD_LETTER_DOCS)
    assert all(c.description for c in written["dagster/column_schema"].columns)
    assert declared.metadata["dagster/column_schema"] == written["dagster/column_schema"]
    assert declared.metadata["dagster/table_name"] == written["dagster/table_name"]
    (reported,) = instance.fetch_observations(AssetRecordsFilter(asset_key=dead_letters), limit=1).records
    assert reported.asset_observation.metadata["dagster/row_count"].value == len(dead) == 2
    assert reported.asset_observation.metadata["dagster/partition_row_count"].value == 1   # 003.json's

    # Re-executing an ingested file changes nothing.
    snapshot = catalog.load_table("db.orders").current_snapshot().snapshot_id
    job = defs.resolve_implicit_global_asset_job_def()
    assert job.execute_in_process(instance=instance, partition_key="002.json", asset_selection=[INGEST]).success
    assert _metadata(instance, INGEST, "002.json")["skipped_already_committed"] is True
    assert catalog.load_table("db.orders").current_snapshot().snapshot_id == snapshot

    # The ingested table is itself a CDC source: its snapshots flow on to the replica.
    synced = drain(defs, instance, config.tables[0])
    assert all(all(t.succeeded) for t in synced) and synced[0].requested
    assert _rows(spark, f"{cat}.db.orders_replica") == _rows(spark, f"{cat}.db.orders")


def test_failed_landing_batch_blocks_the_next_until_re_executed(spark, catalog_settings, catalog, instance, tmp_path):
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    _land(landing, "a.json", [_envelope("c", after={"id": 1, "status": "new"})])
    _land(landing, "b.json", [_envelope("u", after={"id": 1, "status": "paid"})])
    config = load_config(write_pipeline(
        tmp_path / "p.yaml", catalog_settings, [],
        ingest=[{"name": "orders_cdc", "landing": str(landing), "target": "db.orders", "identifier_columns": ["id"],
                 "auto_create": True, "max_retries": 0}]))
    defs = build_definitions(config)
    moved = tmp_path / "a.json.moved"
    first = tick_sensor(defs, instance, SENSOR, [INGEST], run=False)      # both files known
    assert first.added == ["a.json", "b.json"]
    (landing / "a.json").rename(moved)                                   # the file vanishes before its run
    failed = tick_sensor(defs, instance, SENSOR, [INGEST])
    assert failed.requested == [("a.json", "a.json")] and failed.succeeded == [False]
    blocked = tick_sensor(defs, instance, SENSOR, [INGEST])
    assert blocked.requested == [] and "a.json failed 1 times" in blocked.skip_reason
    status = ingest_status(instance, config.ingest[0])
    assert (status.files, status.not_ingested, status.failed) == (1, ["a.json", "b.json"], ["a.json"])
    assert not catalog.table_exists("db.orders")                          # b.json was never applied alone

    moved.rename(landing / "a.json")
    job = defs.resolve_implicit_global_asset_job_def()
    assert job.execute_in_process(instance=instance, partition_key="a.json", asset_selection=[INGEST]).success
    rest = drain_sensor(defs, instance, SENSOR, [INGEST])
    assert [t.requested for t in rest if t.requested] == [[("b.json", "b.json")]]
    assert ingest_status(instance, config.ingest[0]).render().endswith("2 landing files, 0 not yet ingested")
    assert _rows(spark, f"{cat}.db.orders") == {1: "paid"}


def test_missing_ingest_target_without_auto_create_fails_at_load(tmp_path, catalog_settings, catalog):
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [],
                          ingest=[{"name": "e", "landing": str(tmp_path), "target": "db.absent"}])
    with pytest.raises(ConfigError, match=r"ingest\[0\] \(e\)\.target: table 'db.absent' does not exist"):
        build_definitions(load_config(path))


def test_re_executing_one_file_of_a_multi_file_batch_changes_nothing(spark, catalog_settings, catalog, instance,
                                                                     tmp_path):
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    _land(landing, "a.json", [_envelope("c", after={"id": 1, "status": "new"})])
    _land(landing, "b.json", [_envelope("u", after={"id": 1, "status": "paid"})])
    _land(landing, "c.json", [_envelope("c", after={"id": 2, "status": "new"})])
    config = load_config(write_pipeline(
        tmp_path / "p.yaml", catalog_settings, [],
        ingest=[{"name": "orders_cdc", "landing": str(landing), "target": "db.orders", "identifier_columns": ["id"],
                 "auto_create": True, "files_per_batch": 2}]))
    defs = build_definitions(config)
    ticks = drain_sensor(defs, instance, SENSOR, [INGEST])
    assert [t.requested for t in ticks if t.requested] == [[("a.json", "b.json")], [("c.json", "c.json")]]
    assert _rows(spark, f"{cat}.db.orders") == {1: "paid", 2: "new"}
    snapshot = catalog.load_table("db.orders").current_snapshot().snapshot_id
    # No table asset of its own: the ingest asset stands for its target, in each batch and at load.
    assert _metadata(instance, INGEST, "c.json")["dagster/table_name"] == f"{cat}.db.orders"
    defined = build_definitions(config).resolve_asset_graph().get(INGEST).metadata
    assert [c.name for c in defined["dagster/column_schema"].columns] == ["id", "status"]
    assert defined["dagster/uri"].value == catalog.load_table("db.orders").location()

    # "a.json" was committed as part of the batch a+b: alone, it is that batch again, already committed.
    job = defs.resolve_implicit_global_asset_job_def()
    assert job.execute_in_process(instance=instance, partition_key="a.json", asset_selection=[INGEST]).success
    rerun = _metadata(instance, INGEST, "a.json")
    assert rerun["skipped_already_committed"] is True and rerun["files"] == ["a.json", "b.json"]
    assert catalog.load_table("db.orders").current_snapshot().snapshot_id == snapshot
    assert _rows(spark, f"{cat}.db.orders") == {1: "paid", 2: "new"}


def test_run_batches_follow_the_recorded_ledger(tmp_path):
    landing = tmp_path / "landing"
    for name in ("a.json", "b.json", "c.json", "d.json"):
        _land(landing, name, [_envelope("c", after={"id": 1})])
    uri = {p.name: str(p) for p in landing.iterdir()}
    part = {n: f"{u}#0-{(landing / n).stat().st_size}" for n, u in uri.items()}
    entry = IngestConfig(name="e", landing=str(landing), target="db.t")
    partial = f"{part['a.json']};{part['b.json']}"        # committed to some of its tables only
    recorded = {partial: False, part["c.json"]: True}
    assert batches_for(entry, ["a.json"], recorded) == [Batch((uri["a.json"], uri["b.json"]), partial, False)]
    assert batches_for(entry, ["b.json", "c.json", "d.json"], recorded) == [
        Batch((uri["a.json"], uri["b.json"]), partial, False), Batch((uri["c.json"],), part["c.json"], True),
        Batch((uri["d.json"],))]
    (landing / "c.json").unlink()                          # an ingested file cleaned up: still a no-op
    assert batches_for(entry, ["c.json"], recorded) == [Batch((uri["c.json"],), part["c.json"], True)]
    (landing / "d.json").unlink()                          # never ingested and gone: an error
    with pytest.raises(IngestError, match=r"\['d.json'\] are no longer"):
        batches_for(entry, ["d.json"], recorded)


def test_an_expired_landing_file_is_counted_by_its_run_and_by_status(spark, catalog_settings, catalog, instance,
                                                                     tmp_path):
    """A landing file older than max_file_age (against the newest file) that was never ingested: its partition's
    run succeeds without writing it, with ``expired_files`` in the metadata, and ``icecdc status`` counts it."""
    import os
    import time

    landing = tmp_path / "landing"
    _land(landing, "001.json", [_envelope("c", after={"id": 1, "status": "old"})])
    _land(landing, "002.json", [_envelope("c", after={"id": 2, "status": "new"})])
    old = time.time() - 3 * 86400
    os.utime(landing / "001.json", (old, old))
    config = load_config(write_pipeline(
        tmp_path / "p.yaml", catalog_settings, [],
        ingest=[{"name": "orders_cdc", "landing": str(landing), "target": "db.orders", "identifier_columns": ["id"],
                 "auto_create": True, "max_file_age": "P1D"}]))
    defs = build_definitions(config)
    ticks = drain_sensor(defs, instance, SENSOR, [INGEST])
    assert all(all(t.succeeded) for t in ticks)
    first, second = _metadata(instance, INGEST, "001.json"), _metadata(instance, INGEST, "002.json")
    assert first["expired_files"] == 1 and first["expired"] == ["001.json"]
    assert second["expired_files"] == 0 and second["inserted"] == 1
    assert _rows(spark, f"{catalog_settings.name}.db.orders") == {2: "new"}
    status = ingest_status(instance, config.ingest[0], defs)
    assert status.expired_files == 1 and status.not_ingested == [] and status.error is None
    assert "1 expired (older than max_file_age, never ingested)" in status.render()
