"""A replica in another catalog than its source (``catalogs:`` + ``sinks[].iceberg.catalog``), through the real
sensor and runs: a source in the REST catalog (the session's REST server) into a SQL catalog on another SQLite
file; a SQL source into a REST catalog that wants a token (its own server, behind a TCP proxy we cut); a SQL
catalog on PostgreSQL into one on SQLite. Each walks export -> batch -> rename -> batch, and after every sync
the replica (read through its own catalog) equals the source read by time travel at the checkpoint its
snapshot summary records."""

import uuid

import pytest
from dagster import AssetRecordsFilter

from icecdc_dagster.assets import naming
from icecdc_dagster.assets.maintenance import maintenance_key
from icecdc_dagster.assets.naming import asset_keys
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.runtime.catalog import CatalogSettings
from icecdc_dagster.runtime.rest_server import RestServerOptions, start_rest_server
from icecdc_dagster.runtime.spark import attach_catalog
from icecdc_dagster.sinks.iceberg import LINE_PROPERTY, SOURCE_SNAPSHOT_PROPERTY
from icecdc_dagster.sync import resync_table, sync_all
from tests.dagster_layer.harness import drain, tick
from tests.helpers import TcpProxy, catalog_block, write_pipeline

TOKEN_ENV = "ICECDC_TEST_ANALYTICS_TOKEN"
TOKEN = "analytics-token"


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    """A REST catalog server of its own that wants a bearer token on every request."""
    root = tmp_path_factory.mktemp("analytics-rest")
    server = start_rest_server(RestServerOptions(db=root / "catalog.db", warehouse=f"file://{root}/warehouse",
                                                 token=TOKEN))
    yield server
    server.close()


def _name() -> str:
    return "analytics_" + uuid.uuid4().hex[:8]


def _sqlite_replica(tmp_path) -> CatalogSettings:
    return CatalogSettings(_name(), f"sqlite:///{tmp_path}/analytics.db", f"file://{tmp_path}/analytics")


def _rows(table, snapshot_id=None):
    """Every row, by id, read by pyiceberg (``snapshot_id``: time travel)."""
    return sorted(table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist(), key=lambda row: row["id"])


def _assert_replica_equals_source(source_catalog, replica_settings) -> int:
    """The replica, read through a catalog client of its own, equals the source at the checkpoint its
    current snapshot's summary records."""
    replica = replica_settings.load_pyiceberg().load_table("mart.orders")
    checkpoint = int(replica.current_snapshot().summary[SOURCE_SNAPSHOT_PROPERTY])
    source = source_catalog.load_table("db.orders")
    assert checkpoint == source.current_snapshot().snapshot_id
    assert _rows(replica) == _rows(source, checkpoint)
    return checkpoint


def _latest(instance, key):
    record = instance.fetch_materializations(AssetRecordsFilter(asset_key=key), limit=1).records[0]
    return {k: getattr(v, "value", v) for k, v in record.asset_materialization.metadata.items()}


def _synced(defs, instance, table) -> None:
    ticks = drain(defs, instance, table)
    assert ticks[0].requested and all(all(t.succeeded) for t in ticks), ticks


def _walk(spark, source_settings, source_catalog, replica_settings, instance, tmp_path, replica_block=None,
          between=None, by_icecdc_sync=False):
    """export -> batch -> rename -> batch, the replica checked after each sync; ``between``: called after
    the first batch (the scenario's own part); ``by_icecdc_sync``: the last batch applied by what
    ``icecdc sync`` runs instead of the sensor. Returns (config, defs, table)."""
    fq = f"{source_settings.name}.db.orders"
    spark.sql(f"""CREATE TABLE {fq} (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg
                  TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read',
                                 'write.update.mode'='merge-on-read')""")
    spark.sql(f"INSERT INTO {fq} VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3), (4, 'd', 4)")
    config = load_config(write_pipeline(
        tmp_path / "pipeline.yaml", source_settings,
        [{"table_name": "db.orders", "identifier_columns": ["id"],
          "sinks": [{"iceberg": {"catalog": replica_settings.name, "table_name": "mart.orders"}}]}],
        catalogs={replica_settings.name: replica_block or catalog_block(replica_settings)}))
    defs, table = build_definitions(config), config.tables[0]
    replica_key = naming.sink_key(table.sinks[0])

    _synced(defs, instance, table)                                               # export
    _assert_replica_equals_source(source_catalog, replica_settings)
    metadata = _latest(instance, replica_key)
    assert metadata["dagster/table_name"] == f"{replica_settings.name}.mart.orders"
    assert str(metadata["dagster/uri"]) == replica_settings.load_pyiceberg().load_table("mart.orders").location()

    spark.sql(f"UPDATE {fq} SET qty = qty + 10 WHERE id = 2")                      # batch
    spark.sql(f"DELETE FROM {fq} WHERE id = 3")
    spark.sql(f"INSERT INTO {fq} VALUES (5, 'e', 5)")
    _synced(defs, instance, table)
    _assert_replica_equals_source(source_catalog, replica_settings)
    qty_id = replica_settings.load_pyiceberg().load_table("mart.orders").schema().find_field("qty").field_id
    if between is not None:
        between(defs, table, fq)

    spark.sql(f"ALTER TABLE {fq} RENAME COLUMN qty TO quantity")                  # rename, followed by field id
    spark.sql(f"UPDATE {fq} SET quantity = -1 WHERE id = 1")
    spark.sql(f"INSERT INTO {fq} VALUES (6, 'f', 6)")
    if by_icecdc_sync:
        reports = sync_all(config, defs, instance)
        assert all(r.ok for r in reports) and reports[0].runs, [r.render() for r in reports]
    else:
        _synced(defs, instance, table)
    checkpoint = _assert_replica_equals_source(source_catalog, replica_settings)
    replica = replica_settings.load_pyiceberg().load_table("mart.orders")
    assert [f.name for f in replica.schema().fields] == ["id", "name", "quantity"]
    assert replica.schema().find_field("quantity").field_id == qty_id      # renamed in place, values kept
    assert _rows(replica)[0] == {"id": 1, "name": "a", "quantity": -1}

    # The checks of the replica, evaluated with a re-run of the last batch (a no-op: already applied).
    job = defs.resolve_implicit_global_asset_job_def()
    last = instance.get_dynamic_partitions(naming.partitions_name(table))[-1]
    again = job.execute_in_process(instance=instance, partition_key=last, asset_selection=asset_keys(table),
                                   raise_on_error=False)
    assert again.success
    checks = {e.check_name: e for e in again.get_asset_check_evaluations() if e.asset_key == replica_key}
    assert checks["matches_source_at_checkpoint"].passed, checks["matches_source_at_checkpoint"].metadata
    assert checks["matches_source_at_checkpoint"].metadata["checkpoint_snapshot_id"].value == str(checkpoint)
    assert checks["matches_source_at_checkpoint"].metadata["sink_rows"].value == len(_rows(replica))
    assert checks["sink_counts_agree"].passed
    assert _latest(instance, replica_key)["skipped_already_applied"] is True
    return config, defs, table


@pytest.mark.parametrize("catalog_settings", ["rest"], indirect=True)
def test_a_rest_source_replicated_into_a_sql_catalog_on_another_sqlite_file(
        spark, catalog_settings, catalog, instance, tmp_path):
    replica_settings = _sqlite_replica(tmp_path)
    config, defs, table = _walk(spark, catalog_settings, catalog, replica_settings, instance, tmp_path,
                                by_icecdc_sync=True)
    # Maintenance compacts and expires the replica in its own catalog (the default one has no mart.orders).
    job = defs.resolve_implicit_global_asset_job_def()
    assert job.execute_in_process(instance=instance, asset_selection=[maintenance_key(table)], raise_on_error=False).success
    done = _latest(instance, maintenance_key(table))
    assert f"{replica_settings.name}.mart.orders: compacted" in done
    assert f"{replica_settings.name}.mart.orders: skipped" not in done
    assert not catalog.table_exists("mart.orders")


def test_a_sql_source_replicated_into_a_rest_catalog_that_stops_answering_and_refuses_a_wrong_token(
        spark, catalog_settings, catalog, instance, tmp_path, token_server, monkeypatch):
    from icecdc_dagster.assets.naming import table_line
    from icecdc_dagster.lease import retry
    from icecdc_dagster.lines import line as lines

    host, port = token_server.url.removeprefix("http://").split(":")
    proxy = TcpProxy(host, int(port))
    name = _name()
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    replica_settings = CatalogSettings(name, f"{proxy.url}/{name}", None, {"token": TOKEN}, type="rest")
    block = {"type": "rest", "uri": replica_settings.uri, "properties": {"token": {"env": TOKEN_ENV}}}

    def stops_answering(defs, table, fq):
        """The replica's catalog does not answer: a transient failure, the line waits, then resumes."""
        spark.sql(f"INSERT INTO {fq} VALUES (7, 'g', 7)")
        proxy.cut()
        monkeypatch.setattr(retry, "RETRY_BACKOFF_S", 600.0)
        failed = tick(defs, instance, table)
        assert failed.succeeded == [False]
        waiting = tick(defs, instance, table)
        assert waiting.requested == [] and "CatalogUnavailableError" in waiting.skip_reason, waiting.skip_reason
        assert f"catalog {name!r}" in waiting.skip_reason and "transient" in waiting.skip_reason
        proxy.restore()
        monkeypatch.setattr(retry, "RETRY_BACKOFF_S", 0.0)
        # It answers again: the line resumes by itself (a client's connection the cut left dead in its pool
        # may fail one more run, transient as well), and never spent its retries.
        resumed = [t for _ in range(3) for t in drain(defs, instance, table)]
        assert resumed[-1].requested == [] and any(all(t.succeeded) for t in resumed if t.requested), resumed
        assert lines.failures_of(instance, table_line(table), failed.requested[0][0]) == 0
        _assert_replica_equals_source(catalog, replica_settings)

    try:
        _config, defs, table = _walk(spark, catalog_settings, catalog, replica_settings, tmp_path=tmp_path,
                                     instance=instance, replica_block=block, between=stops_answering)
        # Wrong credentials: terminal, the line stops naming the catalog.
        monkeypatch.setenv(TOKEN_ENV, "not-the-token")
        spark.sql(f"INSERT INTO {catalog_settings.name}.db.orders VALUES (8, 'h', 8)")
        assert tick(defs, instance, table).succeeded == [False]
        stopped = tick(defs, instance, table)
        assert stopped.requested == [] and "AccessRefusedError" in stopped.skip_reason, stopped.skip_reason
        assert f"catalog {name!r}" in stopped.skip_reason and "stopped the line" in stopped.skip_reason
    finally:
        proxy.close()


@pytest.mark.postgres
def test_a_postgresql_sql_catalog_replicated_into_a_sqlite_sql_catalog(
        spark, postgres_catalog_settings, instance, tmp_path):
    source_catalog = postgres_catalog_settings.load_pyiceberg()
    attach_catalog(spark, postgres_catalog_settings)
    source_catalog.create_namespace("db")
    replica_settings = _sqlite_replica(tmp_path)
    config, defs, _table = _walk(spark, postgres_catalog_settings, source_catalog, replica_settings, instance,
                                 tmp_path)
    # A resync rebuilds the replica in its own catalog: one overwrite from the source's current snapshot.
    spark.sql(f"INSERT INTO {replica_settings.name}.mart.orders VALUES (99, 'stray', 0)")   # another writer
    report = resync_table(config, defs, instance, "db.orders")
    assert report.sync.ok, report.render()
    _assert_replica_equals_source(source_catalog, replica_settings)
    summary = replica_settings.load_pyiceberg().load_table("mart.orders").current_snapshot().summary
    assert summary[LINE_PROPERTY] == report.key
