"""Spark and pyiceberg see one catalog: each engine reads and appends the other's tables."""

import pyarrow as pa
import pytest

from icecdc_dagster.runtime.spark import attach_catalog


def _roundtrip(spark, settings, pyiceberg_catalog):
    name = settings.name
    # Spark creates and writes; pyiceberg reads and appends.
    spark.sql(f"CREATE TABLE {name}.db.from_spark (id BIGINT, name STRING) USING iceberg")
    spark.sql(f"INSERT INTO {name}.db.from_spark VALUES (1, 'a'), (2, 'b')")
    table = pyiceberg_catalog.load_table("db.from_spark")
    assert sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    table.append(pa.table({"id": pa.array([3], pa.int64()), "name": ["c"]}))
    assert [r.id for r in spark.sql(f"SELECT id FROM {name}.db.from_spark ORDER BY id").collect()] == [1, 2, 3]

    # pyiceberg creates and writes; Spark reads and appends.
    created = pyiceberg_catalog.create_table(
        "db.from_pyiceberg", schema=pa.schema([("id", pa.int64()), ("name", pa.string())]))
    created.append(pa.table({"id": pa.array([10], pa.int64()), "name": ["x"]}))
    spark.sql(f"INSERT INTO {name}.db.from_pyiceberg VALUES (11, 'y')")
    reloaded = pyiceberg_catalog.load_table("db.from_pyiceberg")
    assert sorted(r["id"] for r in reloaded.scan().to_arrow().to_pylist()) == [10, 11]
    assert len(reloaded.snapshots()) == 2


def test_spark_and_pyiceberg_share_sqlite_catalog(spark, catalog_settings, catalog):
    _roundtrip(spark, catalog_settings, catalog)


@pytest.mark.postgres
def test_spark_and_pyiceberg_share_postgres_catalog(spark, postgres_catalog_settings):
    pyiceberg_catalog = postgres_catalog_settings.load_pyiceberg()
    attach_catalog(spark, postgres_catalog_settings)
    pyiceberg_catalog.create_namespace("db")
    _roundtrip(spark, postgres_catalog_settings, pyiceberg_catalog)
