"""Definitions built from a two-table pipeline file: assets, lineage, partitions, sensors, checks."""

import pyarrow as pa
import pytest
from dagster import AssetKey, DynamicPartitionsDefinition

from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.errors import ConfigError
from tests.helpers import write_pipeline

TABLES = [
    {"table_name": "db.orders", "identifier_columns": ["id"], "polling_interval": "PT5S",
     "sinks": [{"opensearch": {"index": "orders", "hosts": ["http://127.0.0.1:1"],
                               "password": {"env": "TEST_OS_PASSWORD"}, "username": "admin"}},
               {"iceberg": {"table_name": "replica.orders"}}]},
    {"table_name": "db.customers", "identifier_columns": ["id"],
     "sinks": [{"iceberg": {"table_name": "replica.customers"}}]},
]


@pytest.fixture
def two_table_config(tmp_path, catalog_settings):
    catalog = catalog_settings.load_pyiceberg()
    catalog.create_namespace("db")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())])
    catalog.create_table("db.orders", schema=schema)
    catalog.create_table("db.customers", schema=schema)
    return write_pipeline(tmp_path / "pipeline.yaml", catalog_settings, TABLES)


def test_two_tables_give_source_changelog_and_sink_assets_with_lineage(two_table_config, monkeypatch):
    monkeypatch.setenv("TEST_OS_PASSWORD", "s3cret")
    defs = build_definitions(load_config(two_table_config))
    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert {"iceberg/db/orders", "changelog/db/orders_changelog", "opensearch/orders_opensearch", "replica/replica/replica_orders",
            "iceberg/db/customers", "changelog/db/customers_changelog", "replica/replica/replica_customers"} <= keys
    changelog = graph.get(AssetKey(["changelog", "db", "orders_changelog"]))
    assert AssetKey(["iceberg", "db", "orders"]) in changelog.parent_keys
    assert AssetKey(["changelog", "db", "orders_changelog"]) in graph.get(AssetKey(["opensearch", "orders_opensearch"])).parent_keys
    partitions = changelog.partitions_def
    assert isinstance(partitions, DynamicPartitionsDefinition) and partitions.name == "snapshots__db_orders"
    assert graph.get(AssetKey(["opensearch", "orders_opensearch"])).partitions_def == partitions
    assert changelog.group_name == "db_orders"
    sensors = {s.name: s for s in defs.sensors}
    assert set(sensors) == {"snapshots__db_orders", "snapshots__db_customers"}
    # PT5S: ticks every 5 s; the minimum interval is 4 s so the daemon's 5 s loop never skips one.
    assert sensors["snapshots__db_orders"].minimum_interval_seconds == 4
    check_keys = {(c.asset_key.to_user_string(), c.name) for c in graph.asset_check_keys}
    assert ("changelog/db/orders_changelog", "no_stuck_snapshots") in check_keys
    assert ("changelog/db/orders_changelog", "line_follows_table") in check_keys
    # The two batch checks of a table are evaluated in the changelog's own step (no step of their own per run),
    # which can also run them alone (subsettable).
    changelog_def = graph.assets_def_for_key(AssetKey(["changelog", "db", "orders_changelog"]))
    assert {key.name for key in changelog_def.check_keys} == {"no_stuck_snapshots", "line_follows_table"}
    assert changelog_def.can_subset and changelog_def.node_def.name == "changelog__db__orders_changelog"
    assert not [c for c in defs.asset_checks or [] if AssetKey(["changelog", "db", "orders_changelog"])
                in {key.asset_key for key in c.check_keys}]
    # Maintenance: one scheduled asset per table group, downstream of the line's assets.
    maintenance = graph.get(AssetKey(["maintenance", "db", "orders_maintenance"]))
    assert maintenance.group_name == "db_orders" and maintenance.partitions_def is None
    assert AssetKey(["replica", "replica", "replica_orders"]) in maintenance.parent_keys
    schedules = {s.name: s for s in defs.schedules}
    assert schedules["maintenance__db_orders"].cron_schedule == "0 3 * * *"
    # Definition metadata from the tables loaded for the load checks: the source's columns and name.
    source = graph.get(AssetKey(["iceberg", "db", "orders"]))
    columns = source.metadata["dagster/column_schema"].columns
    assert [(c.name, c.type, c.constraints.nullable) for c in columns] == [("id", "long", False),
                                                                           ("name", "string", True)]
    assert source.metadata["dagster/table_name"] == f"{load_config(two_table_config).catalog.name}.db.orders"
    # The OpenSearch password is an EnvVar, resolved only at run time.
    resource = defs.resources["icecdc_opensearch__orders"]
    assert "s3cret" not in repr(resource)
    # Outside a run it is usable only as Dagster initialises it; the raw one refuses to connect.
    from icecdc_dagster.errors import UnresolvedResourceError
    from icecdc_dagster.resources.resolved import resolved_resource

    assert resolved_resource(defs, "icecdc_opensearch__orders").cluster()[2] == "s3cret"
    with pytest.raises(UnresolvedResourceError, match="password still names? environment"):
        resource.cluster()


def test_missing_table_fails_at_load_naming_it(tmp_path, catalog_settings):
    catalog_settings.load_pyiceberg().create_namespace("db")
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [{"table_name": "db.nope"}])
    with pytest.raises(ConfigError, match=r"p.yaml: tables: table 'db.nope' does not exist"):
        build_definitions(load_config(path))


def test_keyless_table_with_opensearch_sink_needs_append_only(tmp_path, catalog_settings):
    catalog = catalog_settings.load_pyiceberg()
    catalog.create_namespace("db")
    catalog.create_table("db.logs", schema=pa.schema([("line", pa.string())]))
    sink = {"opensearch": {"index": "logs", "hosts": ["http://127.0.0.1:1"]}}
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [{"table_name": "db.logs", "sinks": [sink]}])
    with pytest.raises(ConfigError, match=r"'db.logs' has an OpenSearch sink but no identifier columns.*append_only"):
        build_definitions(load_config(path))
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings,
                          [{"table_name": "db.logs", "append_only": True, "sinks": [sink]}])
    assert build_definitions(load_config(path)).resolve_asset_graph().has(AssetKey(["opensearch", "logs_opensearch"]))


def test_keyless_v2_table_with_replica_sink_is_refused_unless_append_only(tmp_path, catalog_settings):
    catalog = catalog_settings.load_pyiceberg()
    catalog.create_namespace("db")
    catalog.create_table("db.logs", schema=pa.schema([("line", pa.string())]), properties={"format-version": "2"})
    sink = {"iceberg": {"table_name": "replica.logs"}}
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [{"table_name": "db.logs", "sinks": [sink]}])
    with pytest.raises(ConfigError, match=r"p.yaml: tables: 'db.logs' has an Iceberg replica sink \(replica.logs\) "
                                          r"but no identifier columns .* no v3 row lineage \(format version 2\).*"
                                          r"append_only: true"):
        build_definitions(load_config(path))
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings,
                          [{"table_name": "db.logs", "append_only": True, "sinks": [sink]}])
    assert build_definitions(load_config(path)).resolve_asset_graph().has(AssetKey(["replica", "replica", "replica_logs"]))


def test_keyless_v3_table_with_replica_sink_is_accepted(spark, catalog, catalog_settings, tmp_path):
    spark.sql(f"CREATE TABLE {catalog_settings.name}.db.logs (line string) USING iceberg "
              "TBLPROPERTIES ('format-version'='3')")
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings,
                          [{"table_name": "db.logs", "sinks": [{"iceberg": {"table_name": "replica.logs"}}]}])
    graph = build_definitions(load_config(path)).resolve_asset_graph()
    # The replica's schema at load, derived from the source's: its key is the source's _row_id, kept
    # as the required identifier column _source_row_id after the source's columns.
    columns = graph.get(AssetKey(["replica", "replica", "replica_logs"])).metadata["dagster/column_schema"].columns
    assert [(c.name, c.type, c.constraints.nullable, c.constraints.other) for c in columns] == [
        ("line", "string", True, []), ("_source_row_id", "long", False, ["identifier column"])]


def test_format_v1_table_loads_and_is_refused_only_when_set_to_merge_on_read(tmp_path, catalog_settings):
    """A v1 table is followed (its line orders snapshots by ancestry); set to merge-on-read, which a v1
    table cannot hold, it is refused at load with the two ways out."""
    catalog = catalog_settings.load_pyiceberg()
    catalog.create_namespace("db")
    catalog.create_table("db.old", schema=pa.schema([pa.field("id", pa.int64(), nullable=False)]),
                         properties={"format-version": "1"})
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings,
                          [{"table_name": "db.old", "identifier_columns": ["id"],
                            "sinks": [{"iceberg": {"table_name": "replica.old"}}]}])
    assert build_definitions(load_config(path)).resolve_asset_graph() is not None
    with catalog.load_table("db.old").transaction() as tx:
        tx.set_properties({"write.update.mode": "merge-on-read"})
    with pytest.raises(ConfigError, match=r"p.yaml: tables: 'db.old': table db.old is Iceberg format v1 with "
                                          r"write.update.mode=merge-on-read: .*set the mode\(s\) to copy-on-write.*"
                                          r"or upgrade the table to format v2"):
        build_definitions(load_config(path))


def test_batch_runs_carry_the_line_checks_and_maintenance_carries_the_consistency_checks(two_table_config):
    """A batch costs what the batch holds: the consistency check counts and samples the whole source
    and sink, so it runs with the group's maintenance schedule (and on demand), not with each batch.
    Each sink's counts check reads nothing (its step evaluates it), so it runs with each batch."""
    from dagster import AssetCheckKey

    from icecdc_dagster.assets.naming import table_line
    from icecdc_dagster.lines import line as lines
    from icecdc_dagster.steps.ordering import NextRun

    config = load_config(two_table_config)
    defs = build_definitions(config)
    orders = config.table("db.orders")
    changelog = AssetKey(["changelog", "db", "orders_changelog"])
    request = lines.run_request(table_line(orders), NextRun("1", "1", ("1",), 0))
    assert set(request.asset_check_keys) == {
        AssetCheckKey(changelog, "no_stuck_snapshots"), AssetCheckKey(changelog, "line_follows_table"),
        AssetCheckKey(AssetKey(["opensearch", "orders_opensearch"]), "sink_counts_agree"),
        AssetCheckKey(AssetKey(["replica", "replica", "replica_orders"]), "sink_counts_agree")}
    schedule = defs.resolve_schedule_def("maintenance__db_orders")
    steps = set(defs.resolve_job_def(schedule.job_name).graph.node_dict)
    assert steps == {"maintenance__db__orders_maintenance", "opensearch__orders_opensearch_matches_source_at_checkpoint",
                     "replica__replica__replica_orders_matches_source_at_checkpoint"}
    # No code-location-wide executor (merged into a user's project it would become theirs): our sensors'
    # and schedules' jobs carry the line executor themselves; our own code location keeps it as default.
    from icecdc_dagster.lease.executor import line_executor

    assert defs.executor is None
    assert defs.resolve_job_def(schedule.job_name).executor_def is line_executor
    sensor_job = defs.resolve_sensor_def("snapshots__db_orders").job_name
    assert sensor_job == "icecdc__snapshots__db_orders"
    assert defs.resolve_job_def(sensor_job).executor_def is line_executor


def test_remembered_table_metadata_is_rewritten_only_when_the_table_changed(tmp_path, catalog_settings, monkeypatch):
    """The load-time cache: a corrupt file reads as empty (and is replaced), an unchanged table is not
    rewritten, a schema evolution is."""
    from pyiceberg.types import StringType

    from icecdc_dagster.assets import metadata_cache
    from icecdc_dagster.assets.table_metadata import table_metadata

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    catalog = catalog_settings.load_pyiceberg()
    catalog.create_namespace("db")
    catalog.create_table("db.t", schema=pa.schema([pa.field("id", pa.int64(), nullable=False)]))
    path = metadata_cache.cache_path()
    assert path == tmp_path / "home" / "icecdc" / "table_metadata.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert metadata_cache.load() == {}

    name = f"{catalog_settings.name}.db.t"
    assert metadata_cache.remember(table_metadata(catalog_settings.name, catalog.load_table("db.t"))) is True
    assert metadata_cache.remember(table_metadata(catalog_settings.name, catalog.load_table("db.t"))) is False
    before = metadata_cache.load()[name]
    assert [c.name for c in before["dagster/column_schema"].columns] == ["id"]
    assert before["dagster/uri"].value == catalog.load_table("db.t").location()

    with catalog.load_table("db.t").update_schema() as update:
        update.add_column("note", StringType(), doc="free text")
    assert metadata_cache.remember(table_metadata(catalog_settings.name, catalog.load_table("db.t"))) is True
    after = metadata_cache.load()[name]
    assert [(c.name, c.description) for c in after["dagster/column_schema"].columns] == [("id", None),
                                                                                       ("note", "free text")]
    assert after["schema_id"] == before["schema_id"] + 1


def test_our_definitions_load_without_dagster_beta_or_preview_warnings(tmp_path):
    """``dagster dev`` and every run worker load these: Dagster's beta/preview notices about APIs we chose
    (backfill_policy, observable_source_asset, partitioned checks) are noise to our users."""
    import warnings

    from dagster import BetaWarning, PreviewWarning

    from icecdc_dagster.demo.run import write_config

    config = load_config(write_config(tmp_path, "http://127.0.0.1:9200"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        defs = build_definitions(config, check_tables=False)
        defs.get_repository_def().load_all_definitions()
    noisy = [w for w in caught if issubclass(w.category, (BetaWarning, PreviewWarning))]
    assert noisy == [], [str(w.message) for w in noisy]
    assert len(list(defs.assets or [])) >= 8                            # the demo's graph was built


def test_asset_keys_chosen_in_the_pipeline_file_are_used_and_a_key_given_twice_fails_naming_both():
    """``asset_key`` of a source table and of a sink (a list or 'a/b'): the keys a dbt project's sources
    expect. Two assets with one key fail at load, naming both declarations."""
    from icecdc_dagster.assets import naming
    from icecdc_dagster.config import parse_config

    config = parse_config({"tables": [{"table_name": "db.orders", "asset_key": "raw/orders", "sinks": [
        {"iceberg": {"table_name": "replica.orders", "asset_key": ["demo_replica", "orders"]}},
        {"opensearch": {"index": "orders"}}]}]}, "p.yaml")
    orders = config.tables[0]
    assert naming.source_key(orders) == AssetKey(["raw", "orders"])
    assert [naming.sink_key(s) for s in orders.sinks] == [AssetKey(["demo_replica", "orders"]),
                                                           AssetKey(["opensearch", "orders_opensearch"])]
    assert naming.table_line(orders).asset_keys[1] == AssetKey(["demo_replica", "orders"])
    clash = parse_config({"tables": [
        {"table_name": "db.orders", "sinks": [{"iceberg": {"table_name": "replica.orders", "asset_key": "x/y"}}]},
        {"table_name": "db.users", "asset_key": ["x", "y"]}]}, "p.yaml")
    with pytest.raises(ConfigError, match=r"p.yaml: asset key 'x/y' is given to both tables\[0\] \(db.orders\)"
                                          r".sinks\[0\] \(replica/replica.orders\) and tables\[1\] \(db.users\)$"):
        build_definitions(clash, check_tables=False)
