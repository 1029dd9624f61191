"""Pipeline evolution on a running line, through ``sync_all`` (what ``icecdc sync`` runs) and real
Spark, Iceberg, osmem-server and a real Dagster instance.

- A sink added after N snapshots takes its own export, the other sink goes on from its checkpoint:
  its checkpoint and snapshot count are unchanged by the join, and both equal the source afterwards.
  Added while nothing is pending, the join runs the new sink alone at the line's applied snapshot;
  added with several snapshots pending and a small ``max_snapshots_per_run``, it exports in the line's next
  batch run at that batch's last snapshot, which is not the table's current one.
- A removed sink leaves the others untouched; ``icecdc status`` lists its target and last checkpoint.
- Changed identifier columns are refused at load, naming the ``icecdc resync`` command.
- A table added to the file starts by itself (its export).
"""

import pytest
from dagster import AssetKey, AssetRecordsFilter
from opensearchpy import OpenSearch

from icecdc_dagster.assets import naming
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.errors import DefinitionChangedError
from icecdc_dagster.sinks.iceberg import SOURCE_SNAPSHOT_PROPERTY
from icecdc_dagster.status import table_status
from icecdc_dagster.sync import sync_all
from tests.helpers import write_pipeline

INDEX = "items_idx"
CHANGELOG = AssetKey(["changelog", "db", "items_changelog"])
OPENSEARCH = AssetKey(["opensearch", f"{INDEX}_opensearch"])
REPLICA, REPLICA2 = "db.items_rep", "db.items_rep2"


def _entry(*sinks: dict, identifier_columns: tuple[str, ...] = ("id",), **extra) -> dict:
    return {"table_name": "db.items", "identifier_columns": list(identifier_columns), "sinks": list(sinks), **extra}


REPLICA_SINK = {"iceberg": {"table_name": REPLICA}}
REPLICA2_SINK = {"iceberg": {"table_name": REPLICA2}}


def _opensearch_sink(url: str) -> dict:
    return {"opensearch": {"hosts": [url], "index": INDEX, "refresh": True}}


def _sync(tmp_path, catalog_settings, instance, tables: list[dict], name: str = "p.yaml"):  # noqa: ANN001, ANN202
    config = load_config(write_pipeline(tmp_path / name, catalog_settings, tables))
    defs = build_definitions(config)
    reports = sync_all(config, defs, instance)
    assert all(r.ok for r in reports), [r.render() for r in reports]
    return config, defs, reports


def _source(spark, cat: str) -> list[tuple]:  # noqa: ANN001
    return sorted((r.id, r.name, r.qty) for r in spark.table(f"{cat}.db.items").collect())


def _replica(spark, cat: str, name: str) -> list[tuple]:  # noqa: ANN001
    rows = spark.table(f"{cat}.{name}")
    assert rows.groupBy("id").count().where("count > 1").count() == 0, f"duplicate keys in {name}"
    return sorted((r.id, r.name, r.qty) for r in rows.collect())


def _documents(url: str) -> list[tuple]:
    client = OpenSearch(hosts=[url])
    client.indices.refresh(index=INDEX)
    hits = client.search(index=INDEX, body={"query": {"match_all": {}}, "size": 1000})["hits"]["hits"]
    assert len({h["_id"] for h in hits}) == len(hits)
    return sorted((h["_source"]["id"], h["_source"]["name"], h["_source"]["qty"]) for h in hits)


def _replica_state(catalog, name: str) -> tuple[int, str]:  # noqa: ANN001
    """(snapshot count, checkpoint): what a re-export or a stray commit would change."""
    table = catalog.load_table(name)
    current = table.current_snapshot()
    return len(table.snapshots()), current.summary.additional_properties.get(SOURCE_SNAPSHOT_PROPERTY)


def _materialisations(instance, key: AssetKey) -> int:  # noqa: ANN001
    return len(instance.fetch_materializations(AssetRecordsFilter(asset_key=key), limit=1000).records)


def _commit(spark, cat: str, round_no: int) -> str:  # noqa: ANN001
    spark.sql(f"UPDATE {cat}.db.items SET qty = qty + {round_no}, name = concat(name, '/{round_no}') "
              f"WHERE id % 5 = {round_no % 5}")
    spark.sql(f"DELETE FROM {cat}.db.items WHERE id = {round_no * 3}")
    spark.sql(f"INSERT INTO {cat}.db.items VALUES ({100 + round_no}, 'new{round_no}', {round_no})")
    return str(spark.sql(f"SELECT snapshot_id FROM {cat}.db.items.snapshots ORDER BY committed_at DESC LIMIT 1")
               .first()[0])


@pytest.fixture
def items(spark, catalog_settings, catalog):  # noqa: ANN001, ANN201
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.items (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg "
              f"TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {cat}.db.items SELECT id, concat('n', id), CAST(id AS INT) FROM range(0, 40)")
    return cat


def test_a_sink_added_to_a_running_line_takes_its_own_export_and_the_other_goes_on(
        spark, catalog_settings, catalog, items, instance, tmp_path, opensearch_url):
    cat = items
    _sync(tmp_path, catalog_settings, instance, [_entry(REPLICA_SINK)])           # export
    for round_no in (1,):                                                         # 3 more snapshots applied
        _commit(spark, cat, round_no)
    _sync(tmp_path, catalog_settings, instance, [_entry(REPLICA_SINK)])
    before = _replica_state(catalog, REPLICA)
    assert before[1] == str(catalog.load_table("db.items").current_snapshot().snapshot_id)
    changelog_batches = _materialisations(instance, CHANGELOG)

    # Nothing pending: the new sink joins alone, exporting at the line's applied snapshot.
    added = [_entry(REPLICA_SINK, _opensearch_sink(opensearch_url))]
    _, _, (joined,) = _sync(tmp_path, catalog_settings, instance, added)
    assert len(joined.runs) == 1
    assert _replica_state(catalog, REPLICA) == before                              # no re-export, no commit
    assert _materialisations(instance, CHANGELOG) == changelog_batches             # the batch was not recomputed
    assert _documents(opensearch_url) == _source(spark, cat) == _replica(spark, cat, REPLICA)
    (record,) = instance.fetch_materializations(OPENSEARCH, limit=1).records
    metadata = record.asset_materialization.metadata
    assert metadata["joined_line_export"].value is True and metadata["is_export"].value is True

    # A sink added while several snapshots are pending and max_snapshots_per_run is small joins in the
    # line's next batch run, exporting at that batch's last snapshot: the one the line applies next, not the
    # table's current one. Then it follows the line; the sink added before follows it like the first one.
    _commit(spark, cat, 3)
    _commit(spark, cat, 4)                                                        # 6 snapshots pending
    both = [REPLICA_SINK, _opensearch_sink(opensearch_url), REPLICA2_SINK]
    config, _, (report,) = _sync(tmp_path, catalog_settings, instance, [_entry(*both, max_snapshots_per_run=2)])
    assert len(report.runs) == 3
    current = str(catalog.load_table("db.items").current_snapshot().snapshot_id)
    next_applied = report.runs[0][1]
    assert next_applied != current
    (joined,) = instance.fetch_materializations(AssetRecordsFilter(asset_key=naming.sink_key(
        config.tables[0].sinks[2])), limit=1, ascending=True).records
    joined_metadata = joined.asset_materialization.metadata
    assert joined_metadata["joined_line_export"].value is True
    assert joined_metadata["checkpoint_snapshot_id"].value == joined_metadata["snapshot_id"].value == next_applied
    exported = [s for s in catalog.load_table(REPLICA2).snapshots()
                if s.summary.additional_properties.get(SOURCE_SNAPSHOT_PROPERTY)][0]
    assert exported.summary.additional_properties[SOURCE_SNAPSHOT_PROPERTY] == next_applied
    assert _replica_state(catalog, REPLICA) == (before[0] + 3, current)           # its batches, not an export
    assert _replica_state(catalog, REPLICA2)[1] == current
    (record,) = instance.fetch_materializations(OPENSEARCH, limit=1).records
    assert "joined_line_export" not in record.asset_materialization.metadata
    assert record.asset_materialization.metadata["checkpoint_snapshot_id"].value == current
    assert _documents(opensearch_url) == _source(spark, cat) == _replica(spark, cat, REPLICA) \
        == _replica(spark, cat, REPLICA2)


def test_removed_sink_is_left_behind_a_changed_key_is_refused_and_a_new_table_starts(
        spark, catalog_settings, catalog, items, instance, tmp_path, opensearch_url):
    cat = items
    both = [REPLICA_SINK, _opensearch_sink(opensearch_url)]
    _sync(tmp_path, catalog_settings, instance, [_entry(*both)])
    index_checkpoint = str(catalog.load_table("db.items").current_snapshot().snapshot_id)

    # Removed: the replica goes on alone; the index stays at its checkpoint, listed by status.
    _commit(spark, cat, 1)
    config, defs, _ = _sync(tmp_path, catalog_settings, instance, [_entry(REPLICA_SINK)])
    current = str(catalog.load_table("db.items").current_snapshot().snapshot_id)
    assert _replica_state(catalog, REPLICA)[1] == current
    assert _replica(spark, cat, REPLICA) == _source(spark, cat)
    assert _documents(opensearch_url) == sorted(
        (r.id, r.name, r.qty) for r in spark.sql(f"SELECT * FROM {cat}.db.items VERSION AS OF {index_checkpoint}")
        .collect())                                                                # untouched since
    status = table_status(defs, instance, config.tables[0], config.source)
    (left,) = status.left_behind
    assert (left.name, left.target, left.last_checkpoint_snapshot_id) == (f"opensearch/{INDEX}", INDEX,
                                                                          index_checkpoint)
    assert f"LEFT BEHIND: opensearch/{INDEX}" in status.render() and index_checkpoint in status.render()

    # A changed key is refused at load, naming the command that rebuilds the line.
    changed = load_config(write_pipeline(tmp_path / "changed.yaml", catalog_settings,
                                         [_entry(REPLICA_SINK, identifier_columns=("id", "name"))]))
    with pytest.raises(DefinitionChangedError) as refused:
        build_definitions(changed)
    message = str(refused.value)
    assert "['id'] to ['id', 'name']" in message
    assert f"icecdc resync --config {changed.source} --table db.items" in message
    build_definitions(changed, rebuilt=("db.items",))                             # what icecdc resync loads

    # A table added to the file starts by itself.
    spark.sql(f"CREATE TABLE {cat}.db.more (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg")
    spark.sql(f"INSERT INTO {cat}.db.more VALUES (1, 'a', 1), (2, 'b', 2)")
    more = {"table_name": "db.more", "identifier_columns": ["id"],
            "sinks": [{"iceberg": {"table_name": "db.more_rep"}}]}
    _, _, (unchanged, started) = _sync(tmp_path, catalog_settings, instance, [_entry(REPLICA_SINK), more])
    assert unchanged.runs == [] and len(started.runs) == 1
    assert sorted((r.id, r.name, r.qty) for r in spark.table(f"{cat}.db.more_rep").collect()) == [
        (1, "a", 1), (2, "b", 2)]
