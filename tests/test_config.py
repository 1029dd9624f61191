"""The pipeline file: valid files load, and every mistake names the file and the key."""

from pathlib import Path

import pytest

from icecdc_dagster.config import EnvRef, OpenSearchSinkConfig, load_config, parse_config, parse_duration
from icecdc_dagster.errors import ConfigError
from icecdc_dagster.resources.keys import CATALOG_KEY

EXAMPLE = Path(__file__).parent.parent / "examples" / "two_tables.yaml"


def test_example_config_loads_with_env_secrets_and_relative_paths():
    config = load_config(EXAMPLE)
    orders = config.table("shop.orders")
    assert orders.identifier_columns == ("order_id",)
    assert orders.polling_interval_s == 5
    sink = orders.sinks[0]
    assert isinstance(sink, OpenSearchSinkConfig) and sink.password == EnvRef("OPENSEARCH_PASSWORD")
    assert config.catalog.uri == "sqlite:///" + str((EXAMPLE.parent / "../lake/catalog.db").resolve())
    assert config.catalog.warehouse.startswith("file:///")
    assert config.catalog.settings().jdbc_url().startswith("jdbc:sqlite:/")


def test_empty_config_is_valid(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty).tables == ()


@pytest.mark.parametrize("data, fragment", [
    ({"tables": [{"table_name": "db.t", "identfier_columns": ["id"]}]}, "tables[0] (db.t).identfier_columns: unknown key"),
    ({"tables": [{"identifier_columns": ["id"]}]}, "tables[0].table_name: missing required key"),
    ({"tables": [{"table_name": "db.t", "sinks": [{"kafka": {"topic": "x"}}]}]}, "sinks[0].kafka: unknown sink type"),
    ({"tables": [{"table_name": "db.t", "sinks": [{"opensearch": {"index": "x", "password": "hunter2"}}]}]},
     "opensearch.password: secrets must come from the environment"),
    ({"tables": [{"table_name": "db.t", "polling_interval": "30s"}]}, "polling_interval: '30s' is not an ISO-8601"),
    ({"tables": [{"table_name": "t"}]}, "table_name: expected <namespace>.<table>"),
    ({"tables": [{"table_name": "db.t"}, {"table_name": "db.t"}]}, "'db.t' is declared twice"),
    ({"tabels": []}, "tabels: unknown key"),
    ({"catalog": {"uri": "mysql://x/y"}}, "unsupported catalog database"),
    ({"tables": [{"table_name": "db.t", "disable_export": "yes"}]}, "disable_export: expected true or false"),
])
def test_invalid_config_names_file_and_key(data, fragment):
    with pytest.raises(ConfigError) as error:
        parse_config(data, source="pipeline.yaml")
    assert "pipeline.yaml" in str(error.value) and fragment in str(error.value)


def test_missing_file_and_bad_yaml_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tables: [\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(bad)


@pytest.mark.parametrize("text, seconds", [("PT30S", 30), ("PT5M", 300), ("PT1H30M", 5400), ("P1D", 86400),
                                           ("PT0.5S", 0.5)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30s", "PT", "P", "PT5X", ""])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


# --- one model: every engine setting reachable, every cross-key mistake caught at load -------------

def _sink(**settings):
    return {"tables": [{"table_name": "db.t", "sinks": [{"opensearch": {"index": "orders", **settings}}]}]}


def test_every_opensearch_engine_setting_is_reachable_from_yaml(monkeypatch):
    from dataclasses import fields

    from icecdc_dagster.sinks.opensearch.settings import OpenSearchSinkSettings

    monkeypatch.setenv("OS_PASS", "pw")
    values = {"hosts": ["http://a:9200", "http://b:9200"], "username": "ops", "password": {"env": "OS_PASS"},
              "verify_certs": False, "ca_certs": "/ca.pem", "chunk_size": 7, "max_chunk_bytes": 1024,
              "parallelism": 3, "max_retries": 0, "initial_backoff_s": 0.1, "max_backoff_s": 2,
              "refresh": "wait_for", "request_timeout_s": 5, "template_name": "tpl",
              "index_settings": {"number_of_shards": 2}, "evolve_mapping": False,
              "include_iceberg_metadata": True, "max_reported_failures": 9}
    config = parse_config(_sink(**values), source="p.yaml")
    settings = config.tables[0].sinks[0].settings()
    assert {f.name for f in fields(OpenSearchSinkSettings)} - {"mapping"} <= set(values) | {"index"}
    expected = {**values, "hosts": ("http://a:9200", "http://b:9200"), "password": "pw"}
    assert {k: getattr(settings, k) for k in values} == expected


def test_every_ingest_engine_setting_is_reachable_from_yaml(tmp_path):
    from dataclasses import fields

    from icecdc_dagster.ingest import IngestSettings
    from icecdc_dagster.steps.ingest_entry import ingest_settings

    entry = {"name": "cdc", "landing": "landing", "target": "db.{source.table}", "auto_create": True,
             "identifier_columns": {"orders": ["id"], "db.items": ["order_id", "line"]},
             "schema_evolution": True, "files_per_batch": 4, "max_file_age": "P2D", "take_expired_files": True,
             "write_mode": {"orders": "equality_deletes"}, "snapshot_deletes": False}
    config = parse_config({"ingest": [entry]}, source="p.yaml", base_dir=tmp_path)
    settings = ingest_settings(config.ingest[0])
    assert {f.name for f in fields(IngestSettings)} <= set(entry) | {"schema", "max_file_age_s"}
    assert (settings.max_file_age_s, settings.take_expired_files) == (2 * 86400, True)
    assert settings.keys_for("db.orders") == ("id",) and settings.keys_for("db.items") == ("order_id", "line")
    assert settings.landing == "file://" + str((tmp_path / "landing").resolve())
    assert (settings.files_per_batch, settings.auto_create, settings.schema_evolution) == (4, True, True)
    assert (settings.mode_for("db.orders"), settings.mode_for("db.items")) == ("equality_deletes", "merge")
    assert settings.snapshot_deletes is False


@pytest.mark.parametrize("mode, fragment", [
    ("upsert", "write_mode"),
    ({"orders": "equality_deletes"}, "write_mode per target only applies to a routing template"),
])
def test_write_mode_is_checked_at_load(tmp_path, mode, fragment):
    entry = {"name": "cdc", "landing": "landing", "target": "db.orders", "write_mode": mode}
    with pytest.raises(ConfigError) as error:
        parse_config({"ingest": [entry]}, source="p.yaml", base_dir=tmp_path)
    assert fragment in str(error.value), str(error.value)


@pytest.mark.parametrize("data, fragment", [
    (_sink(index="Orders Index"), "sinks[0].opensearch: not a valid index name"),
    (_sink(mapping={"properties": {}}, template_name="t"), "set either 'mapping' or 'template_name'"),
    (_sink(refresh="sometimes"), "opensearch.refresh: expected true or false"),
    (_sink(chunk_size="500"), "opensearch.chunk_size: expected a valid integer"),
    (_sink(chunk_sise=5), "opensearch.chunk_sise: unknown key (expected one of: asset_key, ca_certs, chunk_size"),
    ({"tables": [{"table_name": "db.t", "sinks": [{"opensearch": {"index": "a"}, "iceberg": {"table_name": "a.b"}}]}]},
     "sinks[0]: a sink is one of iceberg, opensearch"),
    ({"tables": [{"table_name": "db.t", "sinks": [{"iceberg": {"table_name": "nodot"}}]}]},
     "sinks[0].iceberg.table_name: expected <namespace>.<table>"),
    ({"ingest": [{"name": "e", "landing": "l", "target": "{source.table}"}]},
     "ingest[0] (e).target: target '{source.table}': the namespace part must be a fixed name"),
    ({"ingest": [{"name": "e", "landing": "l", "target": "db.{source.table}", "schema": {"columns": []}}]},
     "ingest[0] (e): a declared schema describes one table"),
    ({"ingest": [{"name": "e", "landing": "l", "target": "db.t", "identifier_columns": {"t": ["id"]}}]},
     "identifier_columns per target only applies to a routing template"),
    ({"ingest": [{"name": "e", "landing": "l", "target": "t"}]}, "ingest[0] (e).target: expected <namespace>"),
    # YAML's flow style splits {name: balance, type: decimal(10,2)} at the comma
    ({"ingest": [{"name": "e", "landing": "l", "target": "db.t", "auto_create": True,
                  "schema": {"columns": [{"name": "id", "type": "long"}, {"name": "balance", "type": "decimal(10"}]}}]},
     "ingest[0] (e): table db.t column balance: unknown Iceberg type 'decimal(10'"),
    ({"ingest": [{"name": "e", "landing": "l", "target": "db.t", "identifier_columns": ["key"],
                  "schema": {"columns": {"id": "long"}}}]},
     "ingest[0] (e): table db.t: identifier columns ['key'] are not in the schema"),
    ({"ingest": [{"name": "e", "landing": "l", "target": "db.t",
                  "schema": {"columns": {"id": "long"}, "partition_spec": ["day(ts)"]}}]},
     "ingest[0] (e): table db.t: schema.partition_spec[0] 'day(ts)' is not a transform"),
    ({"ingest": [{"name": "e", "landing": "l", "target": "db.t", "schema": {"columns": [{"name": "id"}]}}]},
     "ingest[0] (e): table db.t: schema.columns[0] needs 'name' and 'type'"),
    ({"catalog": {"type": "nessie"}}, "catalog.type: expected 'sql', 'rest', 'hive' or 'glue'"),
    ({"tables": [{"table_name": "db.t", "sinks": [{"opensearch": {"index": "x"}}]},
                 {"table_name": "db.u", "sinks": [{"opensearch": {"index": "x"}}]}]},
     "sinks: 'opensearch:x' is declared twice"),
])
def test_mistakes_that_used_to_fail_at_run_time_fail_at_load(data, fragment):
    with pytest.raises(ConfigError) as error:
        parse_config(data, source="pipeline.yaml")
    assert str(error.value).startswith("pipeline.yaml: ") and fragment in str(error.value), str(error.value)


def test_a_single_identifier_column_may_be_written_alone():
    config = parse_config({"tables": [{"table_name": "db.t", "identifier_columns": "id"}]})
    assert config.tables[0].identifier_columns == ("id",)


def test_rest_catalog_properties_reach_both_engines_and_secrets_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("REST_TOKEN", "s3cr3t")
    config = parse_config({"catalog": {"type": "rest", "name": "cat", "uri": "http://rest:8181",
                                       "warehouse": "quickstart_catalog", "properties": {
                                           "token": {"env": "REST_TOKEN"}, "scope": "PRINCIPAL_ROLE:ALL",
                                           "prefix": "p1", "header.X-Iceberg-Access-Delegation": "vended-credentials",
                                           "rest.sigv4-enabled": False}}}, base_dir=tmp_path)
    settings = config.catalog.settings()
    # a REST warehouse is a name the catalog knows, never a path relative to the file
    assert settings.pyiceberg_properties() == {
        "type": "rest", "uri": "http://rest:8181", "warehouse": "quickstart_catalog", "token": "s3cr3t",
        "scope": "PRINCIPAL_ROLE:ALL", "prefix": "p1", "header.X-Iceberg-Access-Delegation": "vended-credentials",
        "rest.sigv4-enabled": "false"}
    conf = settings.spark_conf()
    assert conf["spark.sql.catalog.cat.type"] == "rest" and conf["spark.sql.catalog.cat.uri"] == "http://rest:8181"
    assert conf["spark.sql.catalog.cat.token"] == "s3cr3t" and conf["spark.sql.catalog.cat.prefix"] == "p1"
    assert conf["spark.sql.catalog.cat.header.X-Iceberg-Access-Delegation"] == "vended-credentials"
    assert conf["spark.sql.catalog.cat.warehouse"] == "quickstart_catalog" and settings.backend is None
    assert "s3cr3t" not in repr(settings)
    # the Dagster resource carries the variable's name, never its value
    from dagster import EnvVar

    from icecdc_dagster.definitions import build_resources

    resource = build_resources(config)[CATALOG_KEY]
    assert resource.properties["token"] == EnvVar("REST_TOKEN") and resource.warehouse == "quickstart_catalog"
    # outside a run the one usable resource is the initialised one; the raw one refuses to connect
    from icecdc_dagster.errors import UnresolvedResourceError
    from icecdc_dagster.resources.resolved import initialized

    assert initialized(resource).settings().properties["token"] == "s3cr3t"
    assert initialized(resource) is initialized(resource)  # once per resource object
    with pytest.raises(UnresolvedResourceError, match=r"catalog 'cat': properties.token still name") as raw:
        resource.settings()
    assert "s3cr3t" not in str(raw.value)
    monkeypatch.delenv("REST_TOKEN")
    with pytest.raises(ConfigError, match="resource 'icecdc_catalog': environment variable REST_TOKEN is not set"):
        initialized(build_resources(config)[CATALOG_KEY], CATALOG_KEY)
    with pytest.raises(ConfigError, match="catalog.properties.token: environment variable REST_TOKEN is not set"):
        config.catalog.settings()


def test_a_rest_catalog_without_a_warehouse_sends_none_and_a_sql_one_gets_the_default(tmp_path):
    rest = parse_config({"catalog": {"type": "rest", "uri": "https://cat.example/api/catalog"}}, base_dir=tmp_path)
    assert "warehouse" not in rest.catalog.settings().pyiceberg_properties()
    assert not any(k.endswith(".warehouse") for k in rest.catalog.settings().spark_conf())
    sql = parse_config({"catalog": {"name": "lake"}}, base_dir=tmp_path)
    assert sql.catalog.settings().warehouse == "file://" + str((tmp_path / "lake" / "warehouse").resolve())


@pytest.mark.parametrize("data, fragment", [
    ({"catalog": {"type": "rest"}}, "a rest catalog's uri is its base URL"),
    ({"catalog": {"type": "rest", "uri": "http://r", "properties": {"credential": "id:secret"}}},
     "'credential' holds a secret: write credential: {env: VARIABLE_NAME}"),
    ({"catalog": {"type": "rest", "uri": "http://r", "properties": {"s3.secret-access-key": "k"}}},
     "'s3.secret-access-key' holds a secret"),
    ({"catalog": {"type": "rest", "uri": "http://r", "properties": {"header.Authorization": "Bearer x"}}},
     "'header.Authorization' holds a secret"),
    ({"catalog": {"type": "rest", "uri": "http://r", "properties": {"scope": ["a"]}}},
     "expected a string, number, boolean or {env: VARIABLE}"),
])
def test_rest_catalog_mistakes_fail_at_load(data, fragment):
    with pytest.raises(ConfigError) as error:
        parse_config(data, source="pipeline.yaml")
    assert fragment in str(error.value), str(error.value)


def test_generated_reference_is_current_and_schema_accepts_the_example():
    import jsonschema
    import yaml

    from icecdc_dagster.config import config_schema
    from icecdc_dagster.config.reference import markdown_reference

    committed = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    assert committed.strip() == markdown_reference().strip(), "regenerate: icecdc config-schema --markdown"
    schema = config_schema()
    jsonschema.validate(yaml.safe_load(EXAMPLE.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tables": [{"table_name": "db.t", "sinks": [{"kafka": {}}]}]}, schema)


def test_definitions_module_reads_no_config_at_import_and_cli_config_wins(tmp_path):
    """``--config B`` is what the CLI loads even when ``$ICECDC_CONFIG`` names another (broken) file."""
    import os
    import subprocess
    import sys

    broken = tmp_path / "a.yaml"
    broken.write_text("tabels: []\n")
    good = tmp_path / "b.yaml"
    good.write_text("catalog: {uri: 'sqlite:///cat.db', warehouse: wh}\n")
    env = {**os.environ, "ICECDC_CONFIG": str(broken)}
    imported = subprocess.run([sys.executable, "-c", "import icecdc_dagster.definitions"], env=env,
                              capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    cli = Path(sys.executable).parent / "icecdc"
    validated = subprocess.run([str(cli), "validate", "--config", str(good)], env=env, capture_output=True,
                               text=True)
    assert validated.returncode == 0 and f"{good}: ok (0 tables" in validated.stdout, validated.stderr
    refused = subprocess.run([str(cli), "validate"], env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "a.yaml: tabels: unknown key" in refused.stderr


TWO_CATALOGS = {
    "catalog": {"name": "lake", "uri": "sqlite:///lake.db", "warehouse": "lake"},
    "catalogs": {"analytics": {"type": "rest", "uri": "http://analytics:8181",
                               "properties": {"token": {"env": "ANALYTICS_TOKEN"}}},
                 "archive": {"uri": "sqlite:///archive.db", "warehouse": "archive"}},
    "tables": [{"table_name": "db.orders", "identifier_columns": ["id"],
                "sinks": [{"iceberg": {"catalog": "analytics", "table_name": "mart.orders"}},
                          {"iceberg": {"catalog": "lake", "table_name": "db.orders_copy"}}]}],
}


def test_named_catalogs_each_keep_their_settings_and_secrets_and_reach_both_engines(tmp_path, monkeypatch):
    from dagster import EnvVar

    from icecdc_dagster.definitions import build_resources

    monkeypatch.setenv("ANALYTICS_TOKEN", "t0k3n")
    config = parse_config(TWO_CATALOGS, base_dir=tmp_path)
    # the key names the catalog; a sink naming the default catalog by its name names none
    assert [s.target_catalog for s in config.tables[0].sinks] == ["analytics", None]
    assert config.catalog_settings("analytics").pyiceberg_properties() == {
        "type": "rest", "uri": "http://analytics:8181", "token": "t0k3n"}
    archive = config.catalog_settings("archive").spark_conf()
    assert archive["spark.sql.catalog.archive.uri"] == f"jdbc:sqlite:{(tmp_path / 'archive.db').resolve()}"
    assert config.catalog_settings(None).name == config.catalog_settings("lake").name == "lake"
    resources = build_resources(config)
    assert {"icecdc_catalog", "icecdc_catalog__analytics", "icecdc_catalog__archive"} <= set(resources)
    assert resources["icecdc_catalog__analytics"].properties["token"] == EnvVar("ANALYTICS_TOKEN")
    # the session starts with what every catalog needs (the REST client, the SQLite driver)
    spark = resources["icecdc_spark"].settings()
    assert spark.rest_catalog and spark.jdbc_drivers == ("sqlite",)
    monkeypatch.delenv("ANALYTICS_TOKEN")
    with pytest.raises(ConfigError, match="catalogs.analytics.properties.token: environment variable "
                                          "ANALYTICS_TOKEN is not set"):
        config.catalog_settings("analytics")


@pytest.mark.parametrize(("change", "message"), [
    ({"tables": [{"table_name": "db.orders", "sinks": [{"iceberg": {"catalog": "analytcs", "table_name": "m.o"}}]}]},
     "p.yaml: tables[0] (db.orders).sinks[0].iceberg.catalog: unknown catalog 'analytcs' (the pipeline's catalogs: "
     "analytics, archive, lake)"),
    ({"catalogs": {"archive": {"uri": "sqlite:///a.db"}}}, "p.yaml: catalogs.archive: a named catalog gives warehouse"),
    ({"catalogs": {"archive": {"name": "x", "uri": "sqlite:///a.db", "warehouse": "w"}}},
     "p.yaml: catalogs.archive.name: a named catalog's name is its key"),
    ({"catalogs": {"lake": {"uri": "sqlite:///a.db", "warehouse": "w"}}},
     "p.yaml: catalogs.lake: 'lake' is the default catalog's name"),
    ({"catalogs": {"archive": {"type": "rest", "uri": "http://a", "tokn": "x"}}},
     "p.yaml: catalogs.archive.tokn: unknown key (expected one of: name, password, properties, type, uri, warehouse)"),
])
def test_a_catalog_mistake_names_its_key(tmp_path, change, message):
    with pytest.raises(ConfigError) as raised:
        parse_config({**TWO_CATALOGS, **change}, "p.yaml", base_dir=tmp_path)
    assert str(raised.value).startswith(message), str(raised.value)


@pytest.mark.parametrize(("tables", "setting", "layout"), [
    (1, "auto", "per_table"), (9, "auto", "per_table"), (10, "auto", "one"), (50, "auto", "one"),
    (50, "per_table", "per_table"), (1, "one", "one")])
def test_auto_sensor_layout_follows_the_table_count(tables, setting, layout):
    """``snapshot_sensors: auto`` (the default) is a sensor per table below ``ONE_SENSOR_FROM_TABLES``
    tables and one sensor from there on; a layout the file names is kept whatever the count."""
    data = {"catalog": {"uri": "sqlite:///cat.db", "warehouse": "wh"},
            "tables": [{"table_name": f"db.t{i}", "identifier_columns": ["id"]} for i in range(tables)]}
    if setting != "auto":
        data["snapshot_sensors"] = setting
    assert parse_config(data).sensor_layout == layout


def test_the_definitions_follow_the_resolved_sensor_layout(tmp_path):
    """Ten tables on the defaults: one sensor ticks them all; nine: a sensor each (named per table)."""
    from icecdc_dagster.assets import naming
    from icecdc_dagster.config.model import ONE_SENSOR_FROM_TABLES
    from icecdc_dagster.definitions import build_definitions
    from icecdc_dagster.sensors.snapshots import ALL_TABLES_SENSOR

    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    lake = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    lake.create_namespace("db")
    for i in range(ONE_SENSOR_FROM_TABLES):
        lake.create_table(f"db.t{i}", Schema(NestedField(1, "id", LongType(), required=True), identifier_field_ids=[1]))

    def sensors(count: int) -> list[str]:
        data = {"catalog": {"uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": f"file://{tmp_path}/wh"},
                "tables": [{"table_name": f"db.t{i}", "identifier_columns": ["id"]} for i in range(count)]}
        return [s.name for s in build_definitions(parse_config(data)).sensors
                if not s.name.startswith("ingest")]

    below = ONE_SENSOR_FROM_TABLES - 1
    config = parse_config({"catalog": {"uri": "sqlite:///c.db", "warehouse": "w"},
                           "tables": [{"table_name": f"db.t{i}", "identifier_columns": ["id"]} for i in range(below)]})
    assert sensors(below) == [naming.sensor_name(t) for t in config.tables]
    assert sensors(ONE_SENSOR_FROM_TABLES) == [ALL_TABLES_SENSOR]
