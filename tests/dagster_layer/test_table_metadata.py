"""What an analyst sees on the asset pages after a real sync: Dagster's own table metadata (name,
location, column schema, exact row count from snapshot summaries), column lineage to the source,
the batch's row count, and the source snapshot as data version."""

from dagster import AssetKey, AssetRecordsFilter, TableColumnDep

from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from tests.dagster_layer.harness import tick
from tests.helpers import write_pipeline

SOURCE = AssetKey(["iceberg", "db", "shelf"])
CHANGELOG = AssetKey(["changelog", "db", "shelf_changelog"])
REPLICA = AssetKey(["replica", "db", "db_shelf_copy"])
INDEX = AssetKey(["opensearch", "shelf_opensearch"])


def _latest(instance, key):
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key), limit=1).records
    assert records, f"{key.to_user_string()} was not materialised"
    return records[0].asset_materialization


def test_sink_and_changelog_materialisations_carry_table_metadata_and_column_lineage(
        spark, catalog_settings, catalog, instance, tmp_path, opensearch_url):
    fq = f"{catalog_settings.name}.db.shelf"
    spark.sql(f"""CREATE TABLE {fq} (id BIGINT NOT NULL COMMENT 'book id', title STRING,
                  tags ARRAY<STRING>, dims STRUCT<w: INT, h: INT>) USING iceberg
                  TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read')""")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('t', id), array('a'), named_struct('w', 1, 'h', 2) "
              f"FROM range(0, 12)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.shelf", "identifier_columns": ["id"],
        "sinks": [{"iceberg": {"table_name": "db.shelf_copy"}},
                  {"opensearch": {"hosts": [opensearch_url], "index": "shelf"}}]}]))
    defs = build_definitions(config)
    table = config.tables[0]
    assert tick(defs, instance, table).succeeded == [True]
    spark.sql(f"DELETE FROM {fq} WHERE id < 3")                     # a position-delete snapshot
    assert tick(defs, instance, table).succeeded == [True]
    deleted_at = str(catalog.load_table("db.shelf").current_snapshot().snapshot_id)

    replica = _latest(instance, REPLICA)
    metadata = replica.metadata
    assert metadata["dagster/table_name"].value == f"{catalog_settings.name}.db.shelf_copy"
    assert metadata["dagster/uri"].value == catalog.load_table("db.shelf_copy").location()
    columns = {c.name: c for c in metadata["dagster/column_schema"].value.columns}
    assert list(columns) == ["id", "title", "tags", "dims"]
    assert columns["id"].type == "long" and not columns["id"].constraints.nullable
    assert columns["id"].description == "book id" and columns["id"].constraints.other == ["identifier column"]
    assert columns["dims"].type.startswith("struct<") and "w: optional int" in columns["dims"].type
    assert columns["tags"].type.startswith("list<")
    replica_rows = spark.table(f"{catalog_settings.name}.db.shelf_copy").count()
    assert replica_rows == 9 and metadata["dagster/row_count"].value == replica_rows
    assert metadata["dagster/partition_row_count"].value == 3           # the batch deleted three rows
    deps = metadata["dagster/column_lineage"].value.deps_by_column
    assert deps["title"] == [TableColumnDep(asset_key=SOURCE, column_name="title")]
    assert replica.tags["dagster/data_version"] == deleted_at          # the source snapshot it holds

    index = _latest(instance, INDEX).metadata
    assert [d.column_name for d in index["dagster/column_lineage"].value.deps_by_column["_id"]] == ["id"]
    assert "dagster/column_schema" not in index                        # an index is not a table

    store = _latest(instance, CHANGELOG).metadata
    assert store["dagster/table_name"].value == f"{catalog_settings.name}.db.shelf__changelog"
    assert store["dagster/partition_row_count"].value == 3
    stored = spark.table(f"{catalog_settings.name}.db.shelf__changelog").count()
    assert store["dagster/row_count"].value == stored == 12 + 3       # export, then three deletes


ASSET_QUERY = """
query Asset($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) {
    ... on Asset {
      assetMaterializations(limit: 1) {
        metadataEntries {
          label
          ... on TableSchemaMetadataEntry { schema { columns { name type constraints { nullable } } } }
          ... on IntMetadataEntry { intValue }
          ... on TableColumnLineageMetadataEntry {
            lineage { columnName columnDeps { assetKey { path } columnName } }
          }
        }
      }
    }
  }
}
"""


def test_the_ui_reads_column_schema_lineage_and_row_counts_through_graphql(
        spark, catalog_settings, catalog, instance, tmp_path, monkeypatch):
    """What the asset page shows comes from Dagster's GraphQL API: query it as the UI does, against a
    code server that loads our definitions from the pipeline file."""
    from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

    fq = f"{catalog_settings.name}.db.shelf"
    spark.sql(f"CREATE TABLE {fq} (id BIGINT NOT NULL, title STRING) USING iceberg "
              f"TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('t', id) FROM range(0, 7)")
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.shelf", "identifier_columns": ["id"], "sinks": [{"iceberg": {"table_name": "db.shelf_copy"}}]}])
    config = load_config(path)
    assert tick(build_definitions(config), instance, config.tables[0]).succeeded == [True]

    code = tmp_path / "code.py"
    code.write_text("from icecdc_dagster.definitions import defs  # noqa: F401\n")
    monkeypatch.setenv("ICECDC_CONFIG", str(path))
    with define_out_of_process_context(str(code), "defs", instance) as context:
        result = execute_dagster_graphql(context, ASSET_QUERY, {"path": list(REPLICA.path)})
    assert not result.errors, result.errors
    (materialization,) = result.data["assetOrError"]["assetMaterializations"]
    entries = {e["label"]: e for e in materialization["metadataEntries"]}
    columns = entries["dagster/column_schema"]["schema"]["columns"]
    assert [(c["name"], c["type"], c["constraints"]["nullable"]) for c in columns] == [
        ("id", "long", False), ("title", "string", True)]
    assert entries["dagster/row_count"]["intValue"] == 7 == entries["dagster/partition_row_count"]["intValue"]
    lineage = {c["columnName"]: c["columnDeps"] for c in entries["dagster/column_lineage"]["lineage"]}
    assert lineage["title"] == [{"assetKey": {"path": list(SOURCE.path)}, "columnName": "title"}]


class CatalogCalls:
    """The tables the catalog database is asked about, seen by SQLAlchemy's own statement events
    (nothing of the catalog is replaced: every statement runs as it would)."""

    def __init__(self, catalog_name: str):
        self.catalog_name = catalog_name
        self.names: list[str] = []

    def _record(self, conn, cursor, statement, parameters, context, executemany):
        if "iceberg_tables" in statement and statement.lstrip().upper().startswith("SELECT"):
            values = list(parameters.values()) if isinstance(parameters, dict) else list(parameters or ())
            # (catalog, namespace, table[, record type]): the namespace and table name the lookup asks for
            parts = [v for v in values
                     if isinstance(v, str) and v != self.catalog_name and v not in ("TABLE", "VIEW")]
            if parts:
                self.names.append(".".join(parts))

    def during(self, build):
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        self.names.clear()
        event.listen(Engine, "before_cursor_execute", self._record)
        try:
            result = build()
        finally:
            event.remove(Engine, "before_cursor_execute", self._record)
        return result, sorted(set(self.names))


def _value(metadata_value):
    """Definition metadata holds values as given (a str, a ``TableSchema``) or wrapped (``MetadataValue.path``)."""
    from dagster import MetadataValue

    return metadata_value.value if isinstance(metadata_value, MetadataValue) else metadata_value


def _definition(defs, key):
    return defs.resolve_asset_graph().get(key).metadata


def test_definitions_carry_store_and_replica_table_metadata_without_a_catalog_call_per_asset(
        spark, catalog_settings, catalog, instance, tmp_path, monkeypatch):
    """At load: the replica's column schema derived from the source the load checks read anyway, the
    changelog store's (and the replica's location) remembered from the last batch that wrote them;
    the only catalog call is the source's, before and after batches. A schema evolution reaches the
    replica's definition at once and the store's with the batch that writes it."""
    from icecdc_dagster.assets import metadata_cache

    fq = f"{catalog_settings.name}.db.shelf"
    spark.sql(f"""CREATE TABLE {fq} (id BIGINT NOT NULL COMMENT 'book id', title STRING,
                  dims STRUCT<w: INT, h: INT>) USING iceberg TBLPROPERTIES ('format-version'='2')""")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('t', id), named_struct('w', 1, 'h', 2) FROM range(0, 5)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.shelf", "identifier_columns": ["id"],
        "sinks": [{"iceberg": {"table_name": "db.shelf_copy"}}]}]))
    calls = CatalogCalls(catalog_settings.name)

    defs, loaded = calls.during(lambda: build_definitions(config))
    assert loaded == ["db.shelf"]                                    # the source, for the load checks
    replica = _definition(defs, REPLICA)
    assert replica["dagster/table_name"] == f"{catalog_settings.name}.db.shelf_copy"
    columns = {c.name: c for c in replica["dagster/column_schema"].columns}
    assert list(columns) == ["id", "title", "dims"] and columns["id"].description == "book id"
    assert columns["dims"].type == "struct<w: optional int, h: optional int>"
    assert "dagster/uri" not in replica                               # not known before the first batch
    assert "dagster/column_schema" not in _definition(defs, CHANGELOG)  # nor is the store's schema

    assert tick(defs, instance, config.tables[0]).succeeded == [True]
    cache = metadata_cache.cache_path()
    written, written_bytes = cache.stat().st_ino, cache.read_bytes()
    defs, loaded = calls.during(lambda: build_definitions(config))
    assert loaded == ["db.shelf"]
    for key in (REPLICA, CHANGELOG):                                 # load-time == what the batch saw
        materialised = _latest(instance, key).metadata
        defined = _definition(defs, key)
        for label in ("dagster/table_name", "dagster/uri", "dagster/column_schema", "schema_id"):
            assert _value(defined[label]) == materialised[label].value, (key, label)
    store_columns = [c.name for c in _definition(defs, CHANGELOG)["dagster/column_schema"].columns]
    assert store_columns[:3] == ["id", "title", "dims"] and "_change_type" in store_columns

    spark.sql(f"INSERT INTO {fq} VALUES (9, 't9', named_struct('w', 3, 'h', 4))")   # no schema change
    assert tick(defs, instance, config.tables[0]).succeeded == [True]
    assert cache.stat().st_ino == written                            # nothing changed: file not rewritten

    spark.sql(f"ALTER TABLE {fq} ADD COLUMN pages INT COMMENT 'page count'")
    spark.sql(f"INSERT INTO {fq} VALUES (10, 't10', named_struct('w', 3, 'h', 4), 321)")
    defs, loaded = calls.during(lambda: build_definitions(config))
    assert loaded == ["db.shelf"]
    replica = _definition(defs, REPLICA)
    assert [c.name for c in replica["dagster/column_schema"].columns] == ["id", "title", "dims", "pages"]
    assert "schema_id" not in replica                                 # the replica has not followed yet
    assert "pages" not in [c.name for c in _definition(defs, CHANGELOG)["dagster/column_schema"].columns]
    old_store_schema = _definition(defs, CHANGELOG)["schema_id"]

    assert tick(defs, instance, config.tables[0]).succeeded == [True]
    assert cache.read_bytes() != written_bytes                       # a new schema id: refreshed (an inode
    # number alone can be reused by the rewrite's new file)
    defs = build_definitions(config)
    for key in (REPLICA, CHANGELOG):
        materialised = _latest(instance, key).metadata
        defined = _definition(defs, key)
        assert "pages" in [c.name for c in defined["dagster/column_schema"].columns]
        for label in ("dagster/uri", "dagster/column_schema", "schema_id"):
            assert _value(defined[label]) == materialised[label].value, (key, label)
    assert _definition(defs, CHANGELOG)["schema_id"] != old_store_schema


LINEAGE_QUERY = """
query Lineage($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) {
    ... on Asset {
      assetMaterializations(limit: 1) {
        metadataEntries { label __typename ... on MarkdownMetadataEntry { mdStr } }
      }
    }
  }
}
"""


def _lineage_rows(context, key) -> set[tuple[str, ...]]:  # noqa: ANN001
    """The rows of the latest materialisation's ``column_lineage_table`` as the UI receives it (a
    markdown entry, which open-source Dagster renders; ``dagster/column_lineage`` only in Dagster+)."""
    from dagster_graphql.test.utils import execute_dagster_graphql

    result = execute_dagster_graphql(context, LINEAGE_QUERY, {"path": list(key.path)})
    assert not result.errors, result.errors
    (materialization,) = result.data["assetOrError"]["assetMaterializations"]
    entries = {e["label"]: e for e in materialization["metadataEntries"]}
    assert entries["dagster/column_lineage"]["__typename"] == "TableColumnLineageMetadataEntry"  # kept
    table = entries["column_lineage_table"]
    assert table["__typename"] == "MarkdownMetadataEntry"
    header, rule, *rows = table["mdStr"].strip().splitlines()
    assert header == "| column | from | from column |" and rule == "|---|---|---|"
    return {tuple(cell.strip().strip("`") for cell in row.strip("|").split("|")) for row in rows}


def test_column_lineage_is_a_markdown_table_the_open_source_ui_renders(
        spark, catalog_settings, catalog, instance, tmp_path, monkeypatch, opensearch_url):
    """Replica, index and changelog each name their columns and the source columns they come from;
    after a source column is renamed, the next batch's table names the new column."""
    from dagster_graphql.test.utils import define_out_of_process_context

    fq = f"{catalog_settings.name}.db.shelf"
    spark.sql(f"CREATE TABLE {fq} (id BIGINT NOT NULL, title STRING) USING iceberg "
              f"TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('t', id) FROM range(0, 5)")
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.shelf", "identifier_columns": ["id"],
        "sinks": [{"iceberg": {"table_name": "db.shelf_copy"}},
                  {"opensearch": {"hosts": [opensearch_url], "index": "shelf"}}]}])
    config = load_config(path)
    assert tick(build_definitions(config), instance, config.tables[0]).succeeded == [True]

    code = tmp_path / "code.py"
    code.write_text("from icecdc_dagster.definitions import defs  # noqa: F401\n")
    monkeypatch.setenv("ICECDC_CONFIG", str(path))
    source = "iceberg/db/shelf"
    with define_out_of_process_context(str(code), "defs", instance) as context:
        assert _lineage_rows(context, REPLICA) == {("id", source, "id"), ("title", source, "title")}
        assert _lineage_rows(context, INDEX) == {("id", source, "id"), ("title", source, "title"),
                                                 ("_id", source, "id")}    # the document id <- the key
        assert _lineage_rows(context, CHANGELOG) == {("id", source, "id"), ("title", source, "title")}

    spark.sql(f"ALTER TABLE {fq} RENAME COLUMN title TO label")
    spark.sql(f"INSERT INTO {fq} VALUES (9, 't9')")
    assert tick(build_definitions(config), instance, config.tables[0]).succeeded == [True]
    assert [f.name for f in catalog.load_table("db.shelf_copy").schema().fields] == ["id", "label"]
    with define_out_of_process_context(str(code), "defs", instance) as context:
        assert _lineage_rows(context, REPLICA) == {("id", source, "id"), ("label", source, "label")}
        assert ("label", source, "label") in _lineage_rows(context, INDEX)
