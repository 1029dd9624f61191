"""What the UI shows, read through Dagster's GraphQL API from a code server that loads our definitions
(issue 31, items 6-8): an ingest target has materialisations; no two nodes of a group share a title;
every asset and every column has a description; ``dagster/uri`` is text the Storage panel renders."""

import json
import re
from pathlib import Path

from dagster import AssetKey

from icecdc_dagster import run_tags
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from tests.dagster_layer.harness import drain, drain_sensor
from tests.helpers import write_pipeline

TARGET = AssetKey(["iceberg", "db", "customers"])
INGEST = AssetKey(["ingest", "customers_cdc"])
REPLICA = AssetKey(["replica", "replica", "replica_customers"])
DEAD = AssetKey(["dead_letters", "db", "customers_dead_letters"])
CHANGELOG = AssetKey(["changelog", "db", "customers_changelog"])
DOCUMENTED = set(re.findall(r"`([a-z_/]+)`", (Path(__file__).parents[2] / "docs" / "dagster-ui.md").read_text()))

QUERY = """
query Graph($path: [String!]!, $ingest: [String!]!, $replica: [String!]!, $dead: [String!]!,
           $changelog: [String!]!) {
  assetNodes {
    assetKey { path }
    groupName
    description
    isPartitioned
    assetChecksOrError { ... on AssetChecks { checks { name description } } }
    metadataEntries {
      label
      __typename
      ... on TableSchemaMetadataEntry { schema { columns { name description } } }
    }
  }
  assetOrError(assetKey: {path: $path}) {
    ... on Asset {
      assetMaterializations(limit: 100) {
        partition
        metadataEntries {
          label __typename
          ... on IntMetadataEntry { intValue } ... on TextMetadataEntry { text } ... on MarkdownMetadataEntry { mdStr }
        }
      }
      definition { partitionKeys partitionStats { numMaterialized numPartitions } }
    }
  }
  replica: assetOrError(assetKey: {path: $replica}) {
    ... on Asset {
      assetMaterializations(limit: 1) { metadataEntries { label __typename ... on IntMetadataEntry { intValue } } }
    }
  }
  ingest: assetOrError(assetKey: {path: $ingest}) {
    ... on Asset {
      assetMaterializations(limit: 1) {
        metadataEntries { label __typename ... on MarkdownMetadataEntry { mdStr } ... on IntMetadataEntry { intValue } }
      }
    }
  }
  dead: assetOrError(assetKey: {path: $dead}) {
    ... on Asset {
      assetMaterializations(limit: 1) { runId }
      assetObservations(limit: 1) { runId timestamp metadataEntries { label ... on IntMetadataEntry { intValue } } }
      definition { isMaterializable isObservable }
    }
  }
  changelog: assetOrError(assetKey: {path: $changelog}) {
    ... on Asset { assetMaterializations(limit: 1) { metadataEntries { label __typename } } }
  }
  ingestRuns: runsOrError(filter: {tags: [{key: "icecdc/ingest", value: "customers_cdc"}]}) {
    ... on Runs { results { runId status assetSelection { path } tags { key value } } }
  }
}
"""


def _event(op, before=None, after=None):
    return json.dumps({"payload": {"op": op, "before": before, "after": after, "ts_ms": 1,
                                   "source": {"schema": "shop", "table": "customers"}}})


def test_asset_pages_explain_themselves(spark, catalog_settings, catalog, instance, tmp_path, monkeypatch):
    from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "001.json").write_text("\n".join([_event("c", after={"id": 1, "name": "a"}),
                                                 _event("c", after={"id": 2, "name": "b"}),
                                                 _event("c", after={"id": 3, "name": "c"}),
                                                 _event("d", before={"id": 2, "name": "b"}),
                                                 _event("x", after={"id": 9})]) + "\n")
    (landing / "002.json").write_text(_event("c", after={"id": 4, "name": "d"}) + "\n")  # a 2nd commit, same tick
    path = write_pipeline(
        tmp_path / "p.yaml", catalog_settings,
        [{"table_name": "db.customers", "sinks": [{"iceberg": {"table_name": "replica.customers"}}]}],
        ingest=[{"name": "customers_cdc", "landing": str(landing), "target": "db.customers",
                 "identifier_columns": ["id"], "auto_create": True}])
    config = load_config(path)
    defs = build_definitions(config)
    assert all(all(t.succeeded) for t in drain_sensor(defs, instance, "landing__customers_cdc", [INGEST]))
    assert all(all(t.succeeded) for t in drain(defs, instance, config.tables[0]))
    committed = str(catalog.load_table("db.customers").current_snapshot().snapshot_id)

    code = tmp_path / "code.py"
    code.write_text("from icecdc_dagster.definitions import defs  # noqa: F401\n")
    monkeypatch.setenv("ICECDC_CONFIG", str(path))
    with define_out_of_process_context(str(code), "defs", instance) as context:
        result = execute_dagster_graphql(context, QUERY, {"path": list(TARGET.path), "ingest": list(INGEST.path),
                                                          "replica": list(REPLICA.path), "dead": list(DEAD.path),
                                                          "changelog": list(CHANGELOG.path)})
    assert not result.errors, result.errors

    # 6: the ingest target is materialised when its line adds the snapshot the ingest committed as a
    # partition; issue 44, 9: never a partition outside the set (an ingest commit before the line's
    # bootstrap is none of its partitions), and 1: every partition of the line is filled.
    target = result.data["assetOrError"]
    materialization, *_ = target["assetMaterializations"]
    entries = {e["label"]: e for e in materialization["metadataEntries"]}
    assert materialization["partition"] == committed
    assert {m["partition"] for m in target["assetMaterializations"]} == set(target["definition"]["partitionKeys"])
    stats = target["definition"]["partitionStats"]
    assert stats["numMaterialized"] == stats["numPartitions"] == 1
    assert entries["dagster/row_count"]["intValue"] == spark.table(f"{catalog_settings.name}.db.customers").count() == 3
    # 8: the location as text (a path value renders as an empty copy icon).
    assert entries["dagster/uri"]["__typename"] == "TextMetadataEntry"
    assert entries["dagster/uri"]["text"] == catalog.load_table("db.customers").location()

    # 9: column lineage the open-source UI renders, on the landing -> table edge (the ingest run): each
    # column from the landing field of its name.
    (ingested,) = result.data["ingest"]["assetMaterializations"]
    edge = {e["label"]: e for e in ingested["metadataEntries"]}
    header, _, *rows = edge["column_lineage_table"]["mdStr"].strip().splitlines()
    assert header == "| column | from | from column |"
    landed = config.ingest[0].source
    columns = [f.name for f in catalog.load_table("db.customers").schema().fields]
    assert {"id", "name"} <= set(columns)
    assert [tuple(c.strip().strip("`") for c in row.strip("|").split("|")) for row in rows] == [
        (column, landed, column) for column in columns]

    # Issue 44, 3-4: what a batch shows, as the Plots tab reads it: ids as text, every count of the batch
    # (0 included), each fact once, none of our bookkeeping.
    (latest,) = result.data["replica"]["assetMaterializations"]
    shown = {e["label"]: e for e in latest["metadataEntries"]}
    ids = [label for label in shown if label.endswith("snapshot_id")]
    assert {"snapshot_id", "checkpoint_snapshot_id", "target_snapshot_id"} <= set(ids)
    assert all(shown[label]["__typename"] == "TextMetadataEntry" for label in ids), {i: shown[i] for i in ids}
    assert [shown[f"count_{t}"]["intValue"] for t in ("insert", "delete", "update_before", "update_after")] == [
        3, 0, 0, 0]
    assert not {"snapshots", "export", "insert_rows", "counted_by", "carry_over_groups_in_arrow"} & set(shown)

    # Issue 44, 7: an ingest run shows its entry and its landing files (no snapshot or table tag naming a
    # file or an entry), and its Target the ingest asset; the line key the queue and the lock use is hidden.
    ingest_runs = result.data["ingestRuns"]["results"]
    assert ingest_runs and all(r["status"] == "SUCCESS" for r in ingest_runs)
    for run in ingest_runs:
        tags = {t["key"]: t["value"] for t in run["tags"] if not t["key"].startswith("dagster/")}
        assert set(tags) == {run_tags.INGEST_TAG, run_tags.BATCH_TAG}, tags
        assert tags[run_tags.BATCH_TAG] in ("001.json", "002.json", "001.json..002.json"), tags
        assert [a["path"] for a in run["assetSelection"]] == [list(INGEST.path)]
        assert run_tags.line_of(instance.get_run_by_id(run["runId"]).tags) == "ingest:customers_cdc"

    # Issue 44, 12: the dead letters are observed by the ingest run that found their table (its row count),
    # never shown "Materialized" beside an empty latest event (the UI's node reads an observation for an
    # asset it cannot materialise); the maintenance asset is not partitioned.
    dead = result.data["dead"]
    assert dead["definition"] == {"isMaterializable": False, "isObservable": False}
    assert dead["assetMaterializations"] == []
    (observed,) = dead["assetObservations"]
    assert observed["runId"] in {r["runId"] for r in ingest_runs}
    assert {e["label"]: e.get("intValue") for e in observed["metadataEntries"]}["dagster/row_count"] == 1

    # Issue 44, 3-4 and the typed sets: every label the UI shows on each kind's latest materialisation (and the
    # dead letters' observation) is documented in docs/dagster-ui.md; the product's bookkeeping is under icecdc/;
    # no internal names (the sink's, an engine batch id), the ingest's counts all there (0 included), its
    # targets a table people read.
    shown_by_kind = {"source": target["assetMaterializations"][0], "changelog": result.data["changelog"][
        "assetMaterializations"][0], "replica": latest, "ingest": ingested, "dead letters": observed}
    for kind, event in shown_by_kind.items():
        labels = {e["label"] for e in event["metadataEntries"]}
        assert labels <= DOCUMENTED, (kind, labels - DOCUMENTED)
        assert not {"sink", "batch_id", "line", "source_table_uuid", "ordered_by"} & labels, (kind, labels)
    assert "icecdc/source_table_uuid" in {e["label"] for e in shown_by_kind["changelog"]["metadataEntries"]}
    assert {"icecdc/batch_id"} <= {e["label"] for e in ingested["metadataEntries"]}
    counts = {e["label"]: e.get("intValue") for e in ingested["metadataEntries"]
              if e["__typename"] == "IntMetadataEntry"}
    assert {"events_read", "tombstones", "expired_files", "dead_lettered"} <= set(counts), counts
    dead_counts = {e["label"]: e.get("intValue") for e in observed["metadataEntries"]}   # the same run's
    assert counts["expired_files"] == 0 and counts["dead_lettered"] == dead_counts["dagster/partition_row_count"]
    assert edge["targets"]["__typename"] == "MarkdownMetadataEntry"
    assert edge["targets"]["mdStr"].splitlines()[2].startswith("| `db.customers` |"), edge["targets"]["mdStr"]

    nodes = result.data["assetNodes"]
    assert [n["isPartitioned"] for n in nodes if n["assetKey"]["path"][0] == "maintenance"] == [False]
    # Issue 44, 6: every check says what it looks at in words: no metadata key, no ISO 8601 duration.
    checks = {c["name"]: c["description"] for n in nodes for c in (n["assetChecksOrError"] or {}).get("checks", [])}
    assert {"no_stuck_snapshots", "line_follows_table", "sink_counts_agree"} <= set(checks), checks
    for name, description in checks.items():
        assert description and not re.search(r"\b[a-z]+_[a-z_]+\b|\bPT?\d", description), (name, description)
    titles: dict[str, list[str]] = {}
    for node in nodes:
        titles.setdefault(node["groupName"], []).append(node["assetKey"]["path"][-1])
        assert node["description"], node["assetKey"]                    # 7: every asset says what it is
        for entry in node["metadataEntries"]:
            if entry["__typename"] == "TableSchemaMetadataEntry":         # ... and every column
                assert all(c["description"] for c in entry["schema"]["columns"]), (node["assetKey"], entry)
    assert titles["db_customers"] == sorted(set(titles["db_customers"]), key=titles["db_customers"].index)
    assert set(titles["db_customers"]) == {"customers", "customers_changelog", "customers_maintenance",
                                           "replica_customers"}
    assert set(titles["ingest__customers_cdc"]) == {"customers_cdc", "customers_dead_letters"}
    schemas = {"/".join(n["assetKey"]["path"]): {c["name"]: c["description"] for e in n["metadataEntries"]
                                                 if e["__typename"] == "TableSchemaMetadataEntry"
                                                 for c in e["schema"]["columns"]} for n in nodes}
    assert schemas["changelog/db/customers_changelog"]["_change_type"].startswith("INSERT, DELETE, UPDATE_BEFORE")
    assert schemas["iceberg/db/customers"]["id"] == "column id of db.customers"      # 5: plainly, no hint
    assert schemas["dead_letters/db/customers_dead_letters"]["reason"].startswith("why it could not be written")
