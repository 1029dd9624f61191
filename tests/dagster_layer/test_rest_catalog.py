"""A source table in an Iceberg REST catalog (the session's REST server, over HTTP), followed by the
real sensor and runs into a replica in the same catalog and an OpenSearch index. The pipeline file's
only REST-specific lines are ``type: rest`` and ``uri:``; every change is committed by pyiceberg
through the REST catalog; both sinks equal the source after every sync."""

import pyarrow as pa
import pytest
import yaml
from opensearchpy import OpenSearch
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from tests.dagster_layer.harness import drain
from tests.helpers import write_pipeline

INDEX = "rest_items"
ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("qty", pa.int32())])


def _arrow(rows):
    return pa.Table.from_pylist([{"id": i, "name": n, "qty": q} for i, n, q in rows], schema=ARROW)


def _table_rows(catalog, name):
    return sorted((r["id"], r["name"], r["qty"]) for r in catalog.load_table(name).scan().to_arrow().to_pylist())


def _documents(url):
    client = OpenSearch(hosts=[url])
    client.indices.refresh(index=INDEX)
    hits = client.search(index=INDEX, body={"query": {"match_all": {}}, "size": 1000})["hits"]["hits"]
    return sorted((int(h["_id"]), h["_source"]["name"], h["_source"]["qty"]) for h in hits)


@pytest.mark.parametrize("catalog_settings", ["rest"], indirect=True)
def test_pyiceberg_commits_to_a_rest_catalog_reach_a_replica_and_opensearch_after_every_sync(
        spark, catalog_settings, catalog, instance, tmp_path, opensearch_url):
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()),
                    NestedField(3, "qty", IntegerType()), identifier_field_ids=[1])
    source = catalog.create_table("db.items", schema=schema, properties={"format-version": "2"})
    source.append(_arrow([(i, f"n{i}", i) for i in range(1, 11)]))
    path = write_pipeline(tmp_path / "pipeline.yaml", catalog_settings, [{
        "table_name": "db.items", "sinks": [{"opensearch": {"hosts": [opensearch_url], "index": INDEX}},
                                            {"iceberg": {"table_name": "db.items_replica"}}]}])
    block = yaml.safe_load(path.read_text())["catalog"]
    assert block == {"type": "rest", "name": catalog_settings.name, "uri": catalog_settings.uri}
    config = load_config(path)
    defs, table = build_definitions(config), config.tables[0]

    commits = [
        lambda t: t.append(_arrow([(i, f"n{i}", i) for i in range(11, 16)])),
        lambda t: t.delete("id IN (2, 3, 12)"),
        lambda t: t.upsert(_arrow([(4, "n4-up", 40), (5, "n5-up", 50), (16, "n16", 16)]), join_cols=["id"]),
        lambda t: t.overwrite(_arrow([(1, "n1-over", 100)]), overwrite_filter="id = 1"),
    ]
    for step, commit in enumerate([None, *commits]):
        if commit is not None:
            commit(catalog.load_table("db.items"))
        ticks = drain(defs, instance, table)
        assert ticks[0].requested and all(all(t.succeeded) for t in ticks), f"step {step}: {ticks}"
        expected = _table_rows(catalog, "db.items")
        assert _table_rows(catalog, "db.items_replica") == expected, f"step {step}"
        assert _documents(opensearch_url) == expected, f"step {step}"
    assert (4, "n4-up", 40) in expected and (1, "n1-over", 100) in expected
    assert not any(row[0] in (2, 3, 12) for row in expected) and len(expected) == 13
