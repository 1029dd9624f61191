"""A format v1 source (no sequence numbers), followed by the real sensor and runs into a replica and an
OpenSearch index: appends, deletes, upserts and overwrites committed by pyiceberg and by Spark; both sinks
equal the source after every sync, and every document's external version (the line's ordinal of the
snapshot that wrote it) only grows. Old snapshots expired under the running line change no number:
the line goes on, its next batch numbered one past the last."""

import pyarrow as pa
import pytest
from opensearchpy import OpenSearch
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from icecdc_dagster.assets import naming
from icecdc_dagster.changelog import ancestry_ids
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from tests.dagster_layer.harness import drain
from tests.helpers import write_pipeline

INDEX = "v1_items"
ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("qty", pa.int32())])


def _arrow(rows):
    return pa.Table.from_pylist([{"id": i, "name": n, "qty": q} for i, n, q in rows], schema=ARROW)


def _table_rows(catalog, name):
    return sorted((r["id"], r["name"], r["qty"]) for r in catalog.load_table(name).scan().to_arrow().to_pylist())


def _documents(url) -> dict[int, tuple]:
    """id -> (id, name, qty, external version)."""
    client = OpenSearch(hosts=[url])
    client.indices.refresh(index=INDEX)
    hits = client.search(index=INDEX, body={"query": {"match_all": {}}, "size": 1000, "version": True})["hits"]["hits"]
    return {int(h["_id"]): (int(h["_id"]), h["_source"]["name"], h["_source"]["qty"], h["_version"]) for h in hits}


def _latest_sequence_number(instance, table) -> int:
    record = instance.fetch_materializations(naming.changelog_key(table), limit=1).records[0]
    return int(record.asset_materialization.metadata["sequence_number"].value)


def _depth(catalog) -> int:
    return len(ancestry_ids(catalog.load_table("db.items"), None))


@pytest.mark.long
def test_v1_source_syncs_into_replica_and_opensearch_through_pyiceberg_and_spark_commits_and_expiry(
        spark, catalog_settings, catalog, instance, tmp_path, opensearch_url):
    cat = catalog_settings.name
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()),
                    NestedField(3, "qty", IntegerType()), identifier_field_ids=[1])
    source = catalog.create_table("db.items", schema=schema, properties={"format-version": "1"})
    source.append(_arrow([(i, f"n{i}", i) for i in range(1, 11)]))
    path = write_pipeline(tmp_path / "pipeline.yaml", catalog_settings, [{
        "table_name": "db.items", "sinks": [{"opensearch": {"hosts": [opensearch_url], "index": INDEX}},
                                            {"iceberg": {"table_name": "db.items_replica"}}]}])
    config = load_config(path)
    defs, table = build_definitions(config), config.tables[0]
    ident = f"{cat}.db.items"

    commits = [
        lambda: catalog.load_table("db.items").append(_arrow([(i, f"n{i}", i) for i in range(11, 16)])),
        lambda: catalog.load_table("db.items").delete("id IN (2, 3, 12)"),
        lambda: catalog.load_table("db.items").upsert(_arrow([(4, "n4-up", 40), (16, "n16", 16)]), join_cols=["id"]),
        lambda: catalog.load_table("db.items").overwrite(_arrow([(1, "n1-over", 100)]), overwrite_filter="id = 1"),
        lambda: spark.sql(f"UPDATE {ident} SET qty = qty + 1000 WHERE id IN (5, 6)"),
        lambda: spark.sql(f"DELETE FROM {ident} WHERE id = 7"),
        lambda: spark.sql(f"MERGE INTO {ident} t USING (SELECT 8L AS id, 'n8-m' AS name, 80 AS qty UNION ALL "
                          f"SELECT 20L, 'n20', 20) s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * "
                          f"WHEN NOT MATCHED THEN INSERT *"),
    ]
    versions: dict[int, int] = {}
    numbers, depths = [], []
    for step, commit in enumerate([None, *commits]):
        if commit is not None:
            commit()
        ticks = drain(defs, instance, table)
        assert ticks[0].requested and all(all(t.succeeded) for t in ticks), f"step {step}: {ticks}"
        expected = _table_rows(catalog, "db.items")
        assert _table_rows(catalog, "db.items_replica") == expected, f"step {step}"
        documents = _documents(opensearch_url)
        assert sorted(d[:3] for d in documents.values()) == expected, f"step {step}"
        numbers.append(_latest_sequence_number(instance, table))
        depths.append(_depth(catalog))
        for doc_id, (*_, version) in documents.items():
            assert version >= versions.get(doc_id, 0), f"step {step}: document {doc_id} went back in version"
        versions = {doc_id: d[3] for doc_id, d in documents.items()}
    # Nothing expired yet: the line's numbers are the depths (pyiceberg's upsert and overwrite commit two
    # snapshots each); a document carries the number of the snapshot that last wrote it.
    assert numbers == depths and numbers == sorted(set(numbers)) and numbers[0] == 1
    assert versions[8] == numbers[7] and versions[5] == numbers[5] and versions[9] == numbers[0]
    assert catalog.load_table("db.items_replica").metadata.format_version == 1

    # Expire every snapshot but the current one: the depths restart at 1, the line's numbers go on.
    spark.sql(f"CALL {cat}.system.expire_snapshots(table => 'db.items', older_than => TIMESTAMP '2999-01-01 00:00:00', "
              f"retain_last => 1)")
    assert len(catalog.load_table("db.items").metadata.snapshots) == 1
    catalog.load_table("db.items").upsert(_arrow([(9, "n9-after", 90)]), join_cols=["id"])
    spark.sql(f"UPDATE {ident} SET name = 'n10-after' WHERE id = 10")
    ticks = drain(defs, instance, table)
    assert ticks[0].requested and all(all(t.succeeded) for t in ticks), f"after expiry: {ticks}"
    expected = _table_rows(catalog, "db.items")
    assert _table_rows(catalog, "db.items_replica") == expected
    documents = _documents(opensearch_url)
    assert sorted(d[:3] for d in documents.values()) == expected
    assert (9, "n9-after", 90) in expected and (10, "n10-after", 10) in expected
    added = _depth(catalog) - 1  # the snapshots after the one that survived the expiry
    assert added >= 2 and _latest_sequence_number(instance, table) == numbers[-1] + added
    assert documents[10][3] == numbers[-1] + added and numbers[-1] < documents[9][3] < documents[10][3]
