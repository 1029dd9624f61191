"""Zero-downtime reindex behind the alias (real Spark, Iceberg, the changelog store and osmem-server
over HTTP): a rename, a drop or a type change the documents cannot take builds ``<index>_v<n+1>`` from
an export of the source at the batch's snapshot and moves the alias in one ``_aliases`` call; an
addition or a widening stays in place; a resync and the migration of a plain index use the same
build. After every batch the index is compared, document by document and field by field, with the
source read by time travel at that snapshot."""

import json
import threading
import time

import pytest
from opensearchpy import OpenSearch, helpers
from pyiceberg import types as it
from pyiceberg.schema import Schema

from icecdc_dagster import changelog
from icecdc_dagster.errors import SinkWriteError
from icecdc_dagster.sinks.kind import SinkContext
from icecdc_dagster.sinks.opensearch.config import OpenSearchSinkConfig
from icecdc_dagster.sinks.opensearch.evolution import compare, field_map
from icecdc_dagster.steps.batches import compute_batch, keys_to_request
from icecdc_dagster.steps.changelog_store import ChangelogStore
from tests.sinks.test_opensearch_support import CuttableProxy, all_documents

NAME = "db.people"
INDEX = "people"
SINK = f"opensearch/{INDEX}"


def _schema(*fields: it.NestedField) -> Schema:
    return Schema(*fields)


def test_field_id_comparison_tells_renames_drops_and_type_changes_from_in_place_changes():
    base = _schema(it.NestedField(1, "id", it.LongType()), it.NestedField(2, "name", it.StringType()),
                   it.NestedField(3, "qty", it.IntegerType()), it.NestedField(4, "price", it.DecimalType(10, 2)),
                   it.NestedField(5, "ratio", it.FloatType()),
                   it.NestedField(6, "attrs", it.StructType(it.NestedField(7, "color", it.StringType()))))
    recorded = field_map(base)
    assert recorded["2"] == {"name": "name", "field": "name", "type": "string"}
    assert recorded["7"] == {"name": "attrs.color", "field": "color", "type": "string"}
    widened = _schema(it.NestedField(1, "id", it.LongType()), it.NestedField(2, "name", it.StringType()),
                      it.NestedField(3, "qty", it.LongType()), it.NestedField(4, "price", it.DecimalType(18, 2)),
                      it.NestedField(5, "ratio", it.FloatType()),
                      it.NestedField(6, "attrs", it.StructType(it.NestedField(7, "color", it.StringType()),
                                                               it.NestedField(9, "size", it.IntegerType()))),
                      it.NestedField(8, "note", it.StringType()))
    change = compare(recorded, field_map(widened))
    assert not change.needs_reindex and len(change.in_place) == 4   # qty, price, attrs.size, note
    renamed = _schema(it.NestedField(1, "id", it.LongType()), it.NestedField(2, "full_name", it.StringType()),
                      it.NestedField(3, "qty", it.IntegerType()), it.NestedField(4, "price", it.DecimalType(10, 2)),
                      it.NestedField(5, "ratio", it.DoubleType()),
                      it.NestedField(6, "props", it.StructType(it.NestedField(7, "colour", it.StringType()))))
    assert compare(recorded, field_map(renamed)).reindex == [
        "column name (field id 2) was renamed to full_name",
        "column ratio (field id 5) changed type float -> double",
        "column attrs (field id 6) was renamed to props",
        "column attrs.color (field id 7) was renamed to props.colour"]
    dropped = _schema(*[f for f in base.fields if f.field_id != 3])
    assert compare(recorded, field_map(dropped)).reindex == [
        "column qty (field id 3) was dropped; documents still carry it"]
    # A drop and a re-add under the same name is a new field id: the documents carry the old values.
    readded = _schema(*[f for f in base.fields if f.field_id != 3], it.NestedField(10, "qty", it.IntegerType()))
    assert compare(recorded, field_map(readded)).needs_reindex


class Pipeline:
    """One source table, its changelog store and the OpenSearch sink, run as the assets run them."""

    def __init__(self, spark, catalog, catalog_name: str, url: str) -> None:
        self.spark, self.catalog, self.cat, self.url = spark, catalog, catalog_name, url
        self.fq = f"{catalog_name}.{NAME}"
        self.keys: list[str] = []
        self.config = OpenSearchSinkConfig(index=INDEX, hosts=(url,), chunk_size=50)

    def sync(self, resync: bool = False):
        """The next batch (the current snapshot) through the store into the sink."""
        table = self.catalog.load_table(NAME)
        current = str(table.current_snapshot().snapshot_id)
        key = f"{current}@resync1" if resync else current
        if not self.keys or self.keys[-1] != key:  # a retried batch keeps its key
            self.keys.append(key)
        request = keys_to_request(NAME, [key], self.keys, False, ("id",))
        store = ChangelogStore(self.spark, self.cat, NAME)
        with changelog.staged_scans(self.spark):
            computed = compute_batch(self.spark, self.cat, table, request)
            store.write(computed.info, computed.rows)
        context = SinkContext(self.cat, self.catalog, table, NAME, ("id",), spark=self.spark)
        sink = self.config.open(context)
        try:
            return sink.apply(computed.info, store.read_events(computed.info, use_row_id=False))
        finally:
            sink.close()

    def sink(self):
        return self.config.open(SinkContext(self.cat, self.catalog, self.catalog.load_table(NAME), NAME, ("id",),
                                            spark=self.spark))

    def source_documents(self) -> dict[str, dict]:
        """The table at its current snapshot by time travel, as documents (every column of the schema)."""
        snapshot = self.catalog.load_table(NAME).current_snapshot().snapshot_id
        rows = self.spark.sql(f"SELECT * FROM {self.fq} VERSION AS OF {snapshot}").collect()
        return {str(r["id"]): r.asDict(recursive=True) for r in rows}

    def assert_index_equals_source(self) -> None:
        docs, expected = all_documents(self.url, INDEX), self.source_documents()
        assert set(docs) == set(expected)
        wrong = {k: (docs[k], expected[k]) for k in expected if docs[k] != expected[k]}
        assert not wrong, f"{len(wrong)} documents differ, e.g. {next(iter(wrong.items()))}"

    def live(self) -> str:
        client = OpenSearch(hosts=[self.url])
        try:
            return next(iter(client.indices.get_alias(name=INDEX)))
        finally:
            client.close()


def _exists(url: str, index: str) -> bool:
    client = OpenSearch(hosts=[url])
    try:
        return bool(client.indices.exists(index=index))
    finally:
        client.close()


def _create_people(spark, fq: str, rows: int = 40) -> None:
    spark.sql(f"CREATE TABLE {fq} (id bigint NOT NULL, name string, qty int, ratio float) USING iceberg "
              f"TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('n', id), CAST(id AS int), CAST(id / 4 AS float) "
              f"FROM range(0, {rows})")


def test_rename_then_updates_and_inserts_reindexes_once_and_matches_the_source_at_every_snapshot(
        spark, catalog, catalog_settings, opensearch_url):
    p = Pipeline(spark, catalog, catalog_settings.name, opensearch_url)
    _create_people(spark, p.fq)
    assert p.sync().details["index_version"] == "people_v1"
    p.assert_index_equals_source()

    spark.sql(f"ALTER TABLE {p.fq} RENAME COLUMN name TO full_name")
    spark.sql(f"UPDATE {p.fq} SET full_name = concat('u', id), qty = qty + 100 WHERE id < 20")
    renamed = p.sync()
    assert renamed.details["index_version"] == "people_v2" and p.live() == "people_v2"
    assert renamed.details["reindexed"] == "column name (field id 2) was renamed to full_name"
    assert renamed.counts["indexed"] == 40        # the export at the batch's snapshot, every row
    assert not _exists(opensearch_url, "people_v1")  # the old version is dropped after the swap
    p.assert_index_equals_source()                # no stale `name`, no null `full_name`

    spark.sql(f"INSERT INTO {p.fq} SELECT id, concat('i', id), 1, 0.5 FROM range(40, 70)")
    inserted = p.sync()
    assert inserted.details["index_version"] == "people_v2" and "reindexed" not in inserted.details
    assert inserted.counts["indexed"] == 30
    p.assert_index_equals_source()
    spark.sql(f"UPDATE {p.fq} SET full_name = 'again' WHERE id % 10 = 0")
    p.sync()
    p.assert_index_equals_source()
    spark.sql(f"DELETE FROM {p.fq} WHERE id IN (1, 41)")
    p.sync()
    p.assert_index_equals_source()
    assert p.live() == "people_v2" and p.sink().read_checkpoint().snapshot_id == \
        catalog.load_table(NAME).current_snapshot().snapshot_id


def test_additions_and_widening_stay_in_place_type_change_and_drop_reindex(
        spark, catalog, catalog_settings, opensearch_url):
    p = Pipeline(spark, catalog, catalog_settings.name, opensearch_url)
    _create_people(spark, p.fq, rows=12)
    p.sync()
    spark.sql(f"ALTER TABLE {p.fq} ADD COLUMN note string")
    spark.sql(f"ALTER TABLE {p.fq} ALTER COLUMN qty TYPE bigint")
    spark.sql(f"UPDATE {p.fq} SET note = concat('note ', id), qty = qty * 1000000000 WHERE id < 4")
    added = p.sync()
    assert added.details["index_version"] == "people_v1" and "reindexed" not in added.details
    assert added.counts["indexed"] == 4
    docs, expected = all_documents(opensearch_url, INDEX), p.source_documents()
    # In place: documents written before `note` existed lack it (the table reads it as null).
    assert {k: {"note": None, **d} for k, d in docs.items()} == expected

    spark.sql(f"ALTER TABLE {p.fq} ALTER COLUMN ratio TYPE double")
    spark.sql(f"UPDATE {p.fq} SET name = 'x' WHERE id = 5")
    widened = p.sync()
    assert widened.details["index_version"] == "people_v2"
    assert widened.details["reindexed"] == "column ratio (field id 4) changed type float -> double"
    p.assert_index_equals_source()

    spark.sql(f"ALTER TABLE {p.fq} DROP COLUMN note")
    spark.sql(f"DELETE FROM {p.fq} WHERE id = 7")
    dropped = p.sync()
    assert dropped.details["index_version"] == "people_v3" and "dropped" in dropped.details["reindexed"]
    p.assert_index_equals_source()
    assert not any("note" in d for d in all_documents(opensearch_url, INDEX).values())


@pytest.mark.slow  # test_lifecycle's rollback test resyncs through the alias in the default run
def test_resync_builds_a_new_version_and_swaps_the_alias(spark, catalog, catalog_settings, opensearch_url):
    p = Pipeline(spark, catalog, catalog_settings.name, opensearch_url)
    _create_people(spark, p.fq, rows=10)
    p.sync()
    good = catalog.load_table(NAME).current_snapshot().snapshot_id
    spark.sql(f"DELETE FROM {p.fq} WHERE id < 3")
    p.sync()
    # Rolled back past what the sink applied and written again: only a resync can follow.
    spark.sql(f"CALL {catalog_settings.name}.system.rollback_to_snapshot('{NAME}', {good})")
    spark.sql(f"INSERT INTO {p.fq} VALUES (100, 'new', 1, 1.0)")
    resynced = p.sync(resync=True)
    assert resynced.details["index_version"] == "people_v2" and resynced.details["reindexed"].startswith("resync")
    assert resynced.checkpoint.line == p.keys[-1]
    assert not _exists(opensearch_url, "people_v1")
    p.assert_index_equals_source()                 # rows 0..2 are back, 100 is there: nothing stale
    spark.sql(f"DELETE FROM {p.fq} WHERE id = 100")
    assert p.sync().details["index_version"] == "people_v2"
    p.assert_index_equals_source()


def _plain_index_as_before(url: str, spark, fq: str, snapshot_id: int, sequence_number: int) -> None:
    """What the sink wrote before versions: a plain index named like the sink, its checkpoint in _meta."""
    client = OpenSearch(hosts=[url])
    client.indices.create(index=INDEX, body={"mappings": {
        "_meta": {"icecdc": {"checkpoints": {SINK: {"snapshot_id": str(snapshot_id),
                                                    "sequence_number": str(sequence_number), "table": NAME}}}},
        "properties": {"id": {"type": "long"}, "name": {"type": "text"}, "qty": {"type": "long"},
                       "ratio": {"type": "double"}}}})
    rows = spark.sql(f"SELECT * FROM {fq} VERSION AS OF {snapshot_id}").collect()
    helpers.bulk(client, [{"_index": INDEX, "_id": str(r["id"]), "_source": r.asDict(), "_version": sequence_number,
                           "_version_type": "external"} for r in rows], refresh=True)
    client.close()


class Reader(threading.Thread):
    """Polls the alias (count and a search) the way an application would, recording what it sees."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = OpenSearch(hosts=[url])
        self.counts: list[int] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                count = int(self.client.count(index=INDEX)["count"])
                hits = self.client.search(index=INDEX, body={"size": 0, "query": {"match_all": {}}})
                self.counts.append(min(count, int(hits["hits"]["total"]["value"])))
            except Exception as exc:  # noqa: BLE001 - what the reader saw is the test's subject
                self.errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.01)

    def __enter__(self) -> "Reader":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.join()
        self.client.close()


def test_plain_index_is_migrated_once_by_name_while_a_reader_polls_it(spark, catalog, catalog_settings,
                                                                      opensearch_url):
    p = Pipeline(spark, catalog, catalog_settings.name, opensearch_url)
    _create_people(spark, p.fq, rows=300)
    first = catalog.load_table(NAME).current_snapshot()
    p.keys.append(str(first.snapshot_id))
    _plain_index_as_before(opensearch_url, spark, p.fq, first.snapshot_id, first.sequence_number)
    assert "plain index" in p.sink().target_state()
    with Reader(opensearch_url) as reader:
        time.sleep(0.2)
        spark.sql(f"DELETE FROM {p.fq} WHERE id < 5")     # 5 real deletes
        migrated = p.sync()
        spark.sql(f"INSERT INTO {p.fq} VALUES (500, 'n500', 1, 1.0)")
        migrated_too = p.sync()                        # in place on the new version
        time.sleep(0.2)
    assert "migration of the plain index people" in migrated.details["reindexed"]
    assert migrated.details["index_version"] == "people_v1" and p.live() == "people_v1"
    assert migrated_too.details["index_version"] == "people_v1" and "reindexed" not in migrated_too.details
    assert p.sink().target_state() == "index people -> people_v1"
    client = OpenSearch(hosts=[opensearch_url])
    # The plain index's own mapping of a column carries over (`name` was text without a keyword field).
    assert client.indices.get_mapping(index=INDEX)["people_v1"]["mappings"]["properties"]["name"] == {"type": "text"}
    client.close()
    p.assert_index_equals_source()
    assert reader.errors == [] and len(reader.counts) >= 10
    assert min(reader.counts) >= 300 - 5 and set(reader.counts) <= {300, 295, 296}, sorted(set(reader.counts))


def test_a_reader_polling_the_alias_during_a_reindex_never_sees_fewer_documents_or_a_404(
        spark, catalog, catalog_settings, opensearch_url):
    """The alias moves in ONE ``_aliases`` call holding both the remove and the add (what makes the move atomic
    for readers), read from the sink's own requests on the wire."""
    proxy = CuttableProxy(opensearch_url)
    p = Pipeline(spark, catalog, catalog_settings.name, proxy.url)
    _create_people(spark, p.fq, rows=300)
    p.sync()
    spark.sql(f"ALTER TABLE {p.fq} RENAME COLUMN qty TO quantity")
    spark.sql(f"DELETE FROM {p.fq} WHERE id % 50 = 0")   # 6 real deletes in the reindexed batch
    moved_before = len(proxy.requests("/_aliases"))
    try:
        with Reader(opensearch_url) as reader:
            time.sleep(0.2)
            result = p.sync()
            time.sleep(0.2)
        assert result.details["index_version"] == "people_v2"
        [move] = [json.loads(body) for body in proxy.requests("/_aliases")[moved_before:]]
        assert move == {"actions": [{"remove": {"index": "people_v1", "alias": INDEX}},
                                    {"add": {"index": "people_v2", "alias": INDEX}}]}, move
        p.assert_index_equals_source()
    finally:
        proxy.stop()
    assert reader.errors == [] and len(reader.counts) >= 10
    assert min(reader.counts) >= 300 - 6 and set(reader.counts) <= {300, 294}
    assert reader.counts[0] == 300 and reader.counts[-1] == 294


def test_a_reindex_cut_midway_is_shown_in_progress_then_resumed_and_swapped(
        spark, catalog, catalog_settings, opensearch_url):
    proxy = CuttableProxy(opensearch_url)
    try:
        p = Pipeline(spark, catalog, catalog_settings.name, proxy.url)
        p.config = OpenSearchSinkConfig(index=INDEX, hosts=(proxy.url,), chunk_size=20, parallelism=1,
                                        max_retries=0)
        _create_people(spark, p.fq, rows=100)
        p.sync()
        spark.sql(f"ALTER TABLE {p.fq} RENAME COLUMN name TO label")
        spark.sql(f"UPDATE {p.fq} SET label = 'changed' WHERE id < 10")
        proxy.cut_at_bulk = proxy.bulk_requests + 3    # the build dies after two bulk requests
        with pytest.raises(SinkWriteError, match="not fully applied to index people .version people_v2."):
            p.sync()
        # The server is back (reached directly; the proxy stays down).
        p.url, p.config = opensearch_url, OpenSearchSinkConfig(index=INDEX, hosts=(opensearch_url,), chunk_size=20)
        state = p.sink().target_state()
        assert state.startswith("index people -> people_v1; REINDEX in progress: people_v2"), state
        assert "renamed to label" in state and "filling" in state
        assert p.live() == "people_v1" and p.sink().read_checkpoint().snapshot_id == int(p.keys[-2])
        resumed = p.sync()
        assert resumed.details["index_version"] == "people_v2" and resumed.counts["version_conflicts"] > 0
        assert resumed.counts["version_conflicts"] + resumed.counts["indexed"] == 100  # the build continued
        assert p.sink().target_state() == "index people -> people_v2"
        p.assert_index_equals_source()
    finally:
        proxy.stop()
