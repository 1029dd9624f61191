"""A generated Debezium stream (schema blocks + bare payloads, two tables routed by template) end to end."""

import os
import subprocess
import sys
import textwrap

import pytest
from pyspark.sql import functions as F

from icecdc_dagster.ingest import IngestSettings, ingest_files, pending_files
from tests.helpers import TEST_SPARK_CONF, fault_env
from tests.ingest.stream import Stream

TEMPLATE = "db.{source.schema}_{source.table}"
KEYS = {"db.inventory_customers": ("id",), "db.inventory_orders": ("order_id",)}


def _write_files(tmp_path, stream):
    landing = tmp_path / "landing"
    landing.mkdir()
    for i, text in enumerate(stream.files()):
        (landing / f"events-{i:03d}.json").write_text(text)
    return str(landing)


def _settings(landing):
    return IngestSettings(landing=landing, target=TEMPLATE, identifier_columns=KEYS, auto_create=True,
                          schema_evolution=True)


def _rows(spark, table, key):
    return {r[key]: r.asDict(recursive=True) for r in spark.table(table).collect()}


def _dead(spark, table):
    return sorted(r.raw for r in spark.table(table).collect())


def _check_final_state(spark, cat, stream):
    customers = _rows(spark, f"{cat}.db.inventory_customers", "id")
    expected = {k: {**v, "email": v.get("email")} for k, v in stream.customers.items()}
    assert customers.keys() == expected.keys()
    for key, row in expected.items():
        assert customers[key] == row, key
    orders = _rows(spark, f"{cat}.db.inventory_orders", "order_id")
    assert orders == stream.orders
    assert _dead(spark, f"{cat}.db.inventory_customers__dead_letters") == sorted(stream.bad_customers)
    assert _dead(spark, f"{cat}.db.inventory_orders__dead_letters") == sorted(stream.bad_orders)
    assert _dead(spark, f"{cat}.db.unrouted__dead_letters") == sorted(stream.bad_unrouted)


def test_generated_stream_end_to_end(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    stream = Stream()
    settings = _settings(_write_files(tmp_path, stream))
    files = pending_files(spark, cat, settings)
    assert [os.path.basename(f) for f in files] == ["events-000.json", "events-001.json", "events-002.json"]
    results = [ingest_files(spark, cat, catalog, settings, [f]) for f in files]
    assert pending_files(spark, cat, settings) == []
    _check_final_state(spark, cat, stream)

    first = results[0].targets
    assert first["db.inventory_customers"].counts["delete_missing"] == 1  # insert+delete of key 9: last op wins
    assert first["db.inventory_customers"].counts["inserted"] == 6
    assert results[0].tombstones == 1
    second = results[1].targets
    assert "email" in second["db.inventory_customers"].added_columns
    assert second["db.inventory_customers"].counts["dead_lettered"] == 2
    assert second["db.inventory_orders"].counts["dead_lettered"] == 2   # bad key + wrong optional type
    assert second["db.inventory_orders"].counts["deleted"] == 1
    assert second["db.inventory_customers"].counts["updated"] == 2

    # types came from the schema block, not from guessing
    types = {f.name: f.dataType.simpleString() for f in spark.table(f"{cat}.db.inventory_customers").schema.fields}
    assert types["balance"] == "decimal(10,2)" and types["birth"] == "date" and types["id"] == "int"
    assert types["created"] == "timestamp_ntz" and types["updated"] == "timestamp" and types["blob"] == "binary"
    order_types = {f.name: f.dataType.simpleString() for f in spark.table(f"{cat}.db.inventory_orders").schema.fields}
    assert order_types["amount"] == "double" and order_types["order_id"] == "bigint"

    # re-ingesting a committed file is a no-op: no new snapshots anywhere
    before = {t: len(catalog.load_table(t).snapshots()) for t in KEYS}
    again = ingest_files(spark, cat, catalog, settings, [files[1]])
    assert again.skipped
    assert {t: len(catalog.load_table(t).snapshots()) for t in KEYS} == before

    # pyiceberg reads the merge-on-read results (positional deletes only)
    for table, key in (("db.inventory_customers", "id"), ("db.inventory_orders", "order_id")):
        loaded = catalog.load_table(table)
        summary = loaded.current_snapshot().summary
        assert summary["total-equality-deletes"] == "0"
        assert int(summary["total-delete-files"]) > 0
        arrow = loaded.scan().to_arrow()
        assert sorted(arrow.column(key).to_pylist()) == sorted(
            r[key] for r in spark.table(f"{cat}.{table}").select(key).collect())


@pytest.mark.long
def test_kill_between_write_and_commit_then_rerun(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    stream = Stream()
    settings = _settings(_write_files(tmp_path, stream))
    files = pending_files(spark, cat, settings)
    ingest_files(spark, cat, catalog, settings, [files[0]])
    customers = f"{cat}.db.inventory_customers"
    columns = spark.table(customers).columns
    before = sorted(map(tuple, spark.table(customers).collect()))
    script = textwrap.dedent(f"""
        import os
        from icecdc_dagster.runtime.catalog import CatalogSettings
        from icecdc_dagster.runtime.spark import SparkSettings, attach_catalog, build_spark_session
        from icecdc_dagster.ingest import IngestSettings, ingest_files
        cs = CatalogSettings(name={cat!r}, uri={catalog_settings.uri!r}, warehouse={catalog_settings.warehouse!r})
        spark = build_spark_session(SparkSettings(master="local[1]", app_name="fault",
                                    conf={TEST_SPARK_CONF!r},
                                    jdbc_drivers=("sqlite",)))
        pc = cs.load_pyiceberg(); attach_catalog(spark, cs)
        ingest_files(spark, {cat!r}, pc, IngestSettings(landing={settings.landing!r}, target={TEMPLATE!r},
                     identifier_columns={KEYS!r}, auto_create=True, schema_evolution=True), [{files[1]!r}])
        print("NOT KILLED")
        """)
    env = fault_env("kill-after-write-before-commit", table="inventory_customers")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == -9, proc.stdout[-2000:] + proc.stderr[-3000:]
    # main still shows the rows as before the batch (the added optional column is a schema commit, all null);
    # the batch's files were written on the staging branch only
    assert sorted(map(tuple, spark.table(customers).select(*columns).collect())) == before
    assert spark.table(customers).where("email IS NOT NULL").count() == 0
    refs = catalog.load_table("db.inventory_customers").refs()
    assert "icecdc_stage" in refs and refs["icecdc_stage"].snapshot_id != refs["main"].snapshot_id
    assert [os.path.basename(f) for f in pending_files(spark, cat, settings)] == ["events-001.json", "events-002.json"]
    for f in pending_files(spark, cat, settings):
        ingest_files(spark, cat, catalog, settings, [f])
    _check_final_state(spark, cat, stream)
    refs = catalog.load_table("db.inventory_customers").refs()   # the staging branch stays, at main's snapshot
    assert refs["icecdc_stage"].snapshot_id == refs["main"].snapshot_id
    dl = spark.table(f"{cat}.db.inventory_customers__dead_letters")
    assert dl.groupBy("raw").count().where(F.col("count") > 1).count() == 0
