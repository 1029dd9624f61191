"""write_mode equality_deletes through the whole ingest path (issue 30 #2): landing files and both stream
inputs give the same target as write_mode merge; a batch committed but not acknowledged is skipped by the
ledger on re-delivery (the row delta carries the batch id like a MERGE)."""

import uuid

from hypothesis import HealthCheck, given, settings

from icecdc_dagster.ingest import IngestSettings, ingest_files
from icecdc_dagster.steps import table_maintenance as maintenance
from tests.ingest.brokers import jetstream_subject, publish_nats, publish_redis, redis_stream
from tests.ingest.test_ingest_properties import _line, _model, deliveries
from tests.ingest.test_stream_inputs import (
    CUSTOMER_ROWS,
    CUSTOMERS,
    PG_TYPES,
    _batch_ids,
    _commit_without_ack,
    _drain,
    _nats_entry,
    _redis_entry,
    _rows,
)


def _ingest(spark, catalog, cat, landing, paths, target, mode, evolve):
    settings_ = IngestSettings(landing=str(landing), target=target, identifier_columns=("id",), auto_create=True,
                               schema_evolution=evolve, write_mode=mode)
    for path in paths:
        ingest_files(spark, cat, catalog, settings_, [path])
    assert ingest_files(spark, cat, catalog, settings_, [paths[-1]]).skipped   # a re-executed batch: no-op


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=deliveries())
def test_equality_delete_target_equals_merge_target(spark, catalog, catalog_settings, tmp_path, case):
    """Random keyed streams, re-delivered runs, copied files, type-limit values, schema evolution: the
    equality-delete target reads back (Spark) as the MERGE target and the model; once compacted,
    pyiceberg reads the same rows."""
    stream, _, files, evolve = case
    cat = catalog_settings.name
    name = "p" + uuid.uuid4().hex[:8]
    landing = tmp_path / name
    landing.mkdir()
    paths = []
    for k, indices in enumerate(files):
        path = landing / f"{k:03d}.json"
        path.write_text("\n".join(_line(*stream[i]) for i in indices) + "\n")
        paths.append(str(path))
    _ingest(spark, catalog, cat, landing, paths, f"db.{name}_m", "merge", evolve)
    _ingest(spark, catalog, cat, landing, paths, f"db.{name}_e", "equality_deletes", evolve)
    if not catalog.table_exists(f"db.{name}_e"):
        assert not catalog.table_exists(f"db.{name}_m")
        return

    def read(table):
        return {r.id: (r.n, r.small, r.amount, r.label) for r in spark.table(f"{cat}.{table}").collect()}
    assert read(f"db.{name}_e") == read(f"db.{name}_m") == _model(stream, evolve)
    maintenance.compact(spark, cat, f"db.{name}_e", threshold=0)
    arrow = catalog.load_table(f"db.{name}_e").scan().to_arrow().to_pylist()
    assert {r["id"]: (r["n"], r["small"], r["amount"], r["label"]) for r in arrow} == read(f"db.{name}_e")


def test_nats_into_an_equality_delete_target_after_a_lost_ack(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    with jetstream_subject() as (stream, subject):
        publish_nats(subject, CUSTOMERS[:4])
        entry = _nats_entry(stream, subject, fetch_wait="PT0.2S", max_messages=4).model_copy(
            update={"write_mode": "equality_deletes"})
        _commit_without_ack(spark, cat, entry)
        publish_nats(subject, CUSTOMERS[4:])
        runs = _drain(spark, cat, entry)
        assert runs[0].redelivered_skipped == 4
        assert _rows(spark, cat, "db.customers") == CUSTOMER_ROWS
        assert len(_batch_ids(spark, cat, entry)) == 2
        assert spark.sql(f"SELECT sum(cast(summary['added-equality-delete-files'] AS int)) "
                         f"FROM {cat}.db.customers.snapshots").first()[0] >= 2


def test_redis_into_an_equality_delete_target_equals_merge(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    with redis_stream() as key:
        publish_redis(key, PG_TYPES)
        _drain(spark, cat, _redis_entry(key, "db.merged", block="PT0.1S"))
    with redis_stream() as key:
        publish_redis(key, PG_TYPES)
        entry = _redis_entry(key, "db.eqdel", block="PT0.1S").model_copy(update={"write_mode": "equality_deletes"})
        runs = _drain(spark, cat, entry)
        assert set(runs[0].result.targets["db.eqdel"].counts) >= {"upserted", "delete_keys"}
    assert _rows(spark, cat, "db.eqdel") == _rows(spark, cat, "db.merged")
