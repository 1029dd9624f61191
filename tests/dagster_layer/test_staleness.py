"""The UI's stale / up-to-date marks agree with ``icecdc status``, read as the UI reads them (Dagster's
GraphQL, against a code server loading our definitions): after a sync every partition of the
changelog and of each sink is FRESH and status has nothing pending; after new snapshots are
observed (by the sensor, as the daemon runs it) the new partitions are MISSING, exactly as many as
status's pending snapshots, and the applied ones stay FRESH; a sync (``icecdc sync``'s path, one
catch-up run for two snapshots) makes everything FRESH again. The source's partitions carry their
snapshot ids as data versions, and every one of them is filled (a snapshot of the line exists)."""

from dagster import AssetKey

from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.status import table_status
from icecdc_dagster.sync import sync_table
from tests.dagster_layer.harness import tick
from tests.helpers import write_pipeline

SOURCE = AssetKey(["iceberg", "db", "shelf"])
CHANGELOG = AssetKey(["changelog", "db", "shelf_changelog"])
REPLICA = AssetKey(["replica", "db", "db_shelf_copy"])
INDEX = AssetKey(["opensearch", "shelf_opensearch"])
SINKS = {"replica/db.shelf_copy": REPLICA, "opensearch/shelf": INDEX}

QUERY = """
query Stale($path: [String!]!) {
  assetNodeOrError(assetKey: {path: $path}) {
    ... on AssetNode {
      partitionKeys
      staleStatusByPartition
      dataVersionByPartition
      partitionStats { numMaterialized numPartitions numFailed }
    }
  }
}
"""


def _ui(code, instance):
    from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

    nodes = {}
    with define_out_of_process_context(str(code), "defs", instance) as context:
        for key in (SOURCE, CHANGELOG, REPLICA, INDEX):
            result = execute_dagster_graphql(context, QUERY, {"path": list(key.path)})
            assert not result.errors, result.errors
            nodes[key] = result.data["assetNodeOrError"]
    return nodes


def _marks(node):
    return dict(zip(node["partitionKeys"], node["staleStatusByPartition"], strict=True))


def _assert_agree(ui, status):
    """Per asset: partitions not FRESH == status's pending snapshots; none STALE; none failed."""
    assert status.problem is None and {sink.name for sink in status.sinks} == set(SINKS)
    assert all(sink.error is None for sink in status.sinks)
    for key, pending in ((CHANGELOG, status.unapplied_partitions),
                         *((SINKS[sink.name], sink.pending_snapshots) for sink in status.sinks)):
        marks = _marks(ui[key])
        assert "STALE" not in marks.values(), (key, marks)
        assert sum(mark != "FRESH" for mark in marks.values()) == pending, (key, marks, status.render())
        stats = ui[key]["partitionStats"]
        assert stats["numPartitions"] - stats["numMaterialized"] == pending and stats["numFailed"] == 0
    source = dict(zip(ui[SOURCE]["partitionKeys"], ui[SOURCE]["dataVersionByPartition"], strict=True))
    assert source == {key: key for key in source}                       # data version = the snapshot id
    stats = ui[SOURCE]["partitionStats"]                                # every snapshot of the line is there:
    assert stats["numMaterialized"] == stats["numPartitions"] == len(source)   # "100% filled", none missing


def test_ui_stale_marks_agree_with_status(spark, catalog_settings, catalog, instance, tmp_path, monkeypatch,
                                          opensearch_url):
    fq = f"{catalog_settings.name}.db.shelf"
    spark.sql(f"CREATE TABLE {fq} (id BIGINT NOT NULL, title STRING) USING iceberg "
              f"TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('t', id) FROM range(0, 5)")
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [{
        "table_name": "db.shelf", "identifier_columns": ["id"], "sinks": [{"iceberg": {"table_name": "db.shelf_copy"}},
                  {"opensearch": {"hosts": [opensearch_url], "index": "shelf"}}]}])
    config = load_config(path)
    table = config.tables[0]
    code = tmp_path / "code.py"
    code.write_text("from icecdc_dagster.definitions import defs  # noqa: F401\n")
    monkeypatch.setenv("ICECDC_CONFIG", str(path))
    defs = build_definitions(config)

    assert tick(defs, instance, table).succeeded == [True]      # the export
    spark.sql(f"INSERT INTO {fq} VALUES (7, 'x')")
    assert tick(defs, instance, table).succeeded == [True]
    status = table_status(defs, instance, table)
    assert status.unapplied_partitions == 0 and [s.pending_snapshots for s in status.sinks] == [0, 0]
    ui = _ui(code, instance)
    assert list(_marks(ui[REPLICA]).values()) == ["FRESH", "FRESH"]
    _assert_agree(ui, status)

    spark.sql(f"INSERT INTO {fq} VALUES (8, 'y')")                      # the sensor sees it, no run yet
    assert tick(defs, instance, table, run=False).added
    status = table_status(defs, instance, table)
    assert [s.pending_snapshots for s in status.sinks] == [1, 1]
    ui = _ui(code, instance)
    assert list(_marks(ui[REPLICA]).values()) == list(_marks(ui[INDEX]).values()) == ["FRESH", "FRESH", "MISSING"]
    _assert_agree(ui, status)

    spark.sql(f"INSERT INTO {fq} VALUES (9, 'z')")                      # seen by icecdc sync itself
    report = sync_table(defs, instance, table)
    assert report.ok and report.runs                                    # catch-up: both snapshots applied
    status = table_status(defs, instance, table)
    assert [s.pending_snapshots for s in status.sinks] == [0, 0]
    ui = _ui(code, instance)
    assert set(_marks(ui[INDEX]).values()) == {"FRESH"} and len(_marks(ui[INDEX])) == 4
    _assert_agree(ui, status)
