"""The OpenSearch sink against an OpenSearch-compatible server over HTTP, with events built in Spark."""

import base64
import datetime as dt
from decimal import Decimal

import pytest
from opensearchpy import OpenSearch
from pyiceberg import types as it
from pyiceberg.schema import Schema

from icecdc_dagster import batch as b
from icecdc_dagster.batch import Checkpoint
from icecdc_dagster.errors import CheckpointError, ConfigError, SinkWriteError
from icecdc_dagster.sinks.opensearch import (
    DeleteWithoutDocumentIdError,
    OpenSearchSink,
    OpenSearchSinkSettings,
    write_events,
)
from icecdc_dagster.sinks.opensearch.sink import prepare_events
from tests.sinks.test_opensearch_support import (
    CuttableProxy,
    all_documents,
    batch_info,
    document_versions,
    events_frame,
    live_mappings,
)

UTC = dt.UTC
TYPES_DDL = ("id long, name string, price decimal(12,4), qty int, ratio double, active boolean, born date, "
             "updated_at timestamp, local_ts timestamp_ntz, payload binary, tags array<string>, "
             "attrs struct<color:string,size:int,weight:decimal(6,2)>, props map<string,double>")
TYPES_SCHEMA = Schema(
    it.NestedField(1, "id", it.LongType(), required=False),
    it.NestedField(2, "name", it.StringType(), required=False),
    it.NestedField(3, "price", it.DecimalType(12, 4), required=False),
    it.NestedField(4, "qty", it.IntegerType(), required=False),
    it.NestedField(5, "ratio", it.DoubleType(), required=False),
    it.NestedField(6, "active", it.BooleanType(), required=False),
    it.NestedField(7, "born", it.DateType(), required=False),
    it.NestedField(8, "updated_at", it.TimestamptzType(), required=False),
    it.NestedField(9, "local_ts", it.TimestampType(), required=False),
    it.NestedField(10, "payload", it.BinaryType(), required=False),
    it.NestedField(11, "tags", it.ListType(20, it.StringType(), element_required=False), required=False),
    it.NestedField(12, "attrs", it.StructType(
        it.NestedField(21, "color", it.StringType(), required=False),
        it.NestedField(22, "size", it.IntegerType(), required=False),
        it.NestedField(23, "weight", it.DecimalType(6, 2), required=False)), required=False),
    it.NestedField(13, "props", it.MapType(24, it.StringType(), 25, it.DoubleType(), value_required=False),
                   required=False),
)
SIMPLE_DDL = "id long, name string, qty int"
SIMPLE_SCHEMA = Schema(it.NestedField(1, "id", it.LongType(), required=True),
                       it.NestedField(2, "name", it.StringType(), required=False),
                       it.NestedField(3, "qty", it.IntegerType(), required=False),
                       identifier_field_ids=[1])


def settings(url: str, index: str = "items", **kw) -> OpenSearchSinkSettings:
    kw.setdefault("chunk_size", 7)
    kw.setdefault("initial_backoff_s", 0.05)
    kw.setdefault("max_retries", 2)
    return OpenSearchSinkSettings(hosts=(url,), index=index, **kw)


def typed_row(i: int) -> tuple:
    return (i, f"name {i} é", Decimal(f"{i}123456.7890"), i * 10, i / 3, i % 2 == 0, dt.date(2020, 1, i),
            dt.datetime(2024, 5, i, 10, 30, 15, 123456, tzinfo=UTC), dt.datetime(2024, 6, i, 8, 0, 0, 654321),
            bytes([i, 0, 255, 7]), [f"t{i}", None, "x"], (f"c{i}", i, Decimal(f"{i}.25")), {"a": i * 1.5, "b": None})


def expected_document(row: tuple) -> dict:
    """The JSON an index should hold for ``typed_row``; written from the spec, independent of the sink."""
    (i, name, price, qty, ratio, active, born, updated_at, local_ts, payload, tags, attrs, props) = row
    return {"id": i, "name": name, "price": str(price), "qty": qty, "ratio": ratio, "active": active,
            "born": born.isoformat(), "updated_at": updated_at, "local_ts": local_ts,
            "payload": base64.b64encode(payload).decode(), "tags": tags,
            "attrs": {"color": attrs[0], "size": attrs[1], "weight": str(attrs[2])}, "props": props}


def normalise_times(doc: dict) -> dict:
    out = dict(doc)
    out["updated_at"] = dt.datetime.fromisoformat(doc["updated_at"].replace("Z", "+00:00"))
    out["local_ts"] = dt.datetime.fromisoformat(doc["local_ts"])
    return out


def test_every_type_lands_as_mapped_and_checkpoint_is_stored(spark, opensearch_url):
    rows = [typed_row(i) for i in range(1, 6)]
    nulls = (6, None, None, None, None, None, None, None, None, None, None, None, None)
    events = events_frame(spark, TYPES_DDL, [(b.INSERT, *r) for r in rows + [nulls]], 101, 1)
    sink = OpenSearchSink(settings(opensearch_url), TYPES_SCHEMA)

    result = sink.apply(batch_info(101, 1, None, export=True), events)

    assert not result.skipped and result.checkpoint == Checkpoint(101, 1)
    assert result.counts["indexed"] == 6 and result.counts["failed"] == 0
    docs = all_documents(opensearch_url, "items")
    assert set(docs) == {str(i) for i in range(1, 7)}
    for row in rows:
        assert normalise_times(docs[str(row[0])]) == expected_document(row)
    assert docs["6"] == {"id": 6, **{k: None for k in expected_document(rows[0]) if k != "id"}}
    mapping = live_mappings(opensearch_url, "items")
    props = mapping["properties"]
    assert props["price"]["type"] == "keyword" and props["payload"]["type"] == "binary"
    assert props["updated_at"]["type"] == "date" and props["born"]["type"] == "date"
    assert props["attrs"]["properties"]["weight"]["type"] == "keyword"
    assert props["qty"]["type"] == "long" and props["ratio"]["type"] == "double"
    assert props["name"]["fields"]["keyword"]["type"] == "keyword"
    # The checkpoint is read back from the index itself by a fresh sink object.
    assert OpenSearchSink(settings(opensearch_url), TYPES_SCHEMA).read_checkpoint() == Checkpoint(101, 1)


def simple_events(spark, rows, snapshot_id, seq, key="id"):
    return events_frame(spark, SIMPLE_DDL, rows, snapshot_id, seq, key=key)


def test_rerun_is_a_noop_and_a_stale_batch_cannot_regress_documents(spark, opensearch_url):
    sink = OpenSearchSink(settings(opensearch_url), SIMPLE_SCHEMA)
    export = simple_events(spark, [(b.INSERT, i, f"v1-{i}", i) for i in range(1, 9)], 10, 1)
    second = simple_events(spark, [(b.UPDATE_AFTER, 1, "v2-1", 100), (b.DELETE, 2, "v1-2", 2),
                                   (b.INSERT, 9, "v2-9", 9)], 11, 2)
    sink.apply(batch_info(10, 1, None, export=True), export)
    applied = sink.apply(batch_info(11, 2, 10), second)
    assert applied.counts["indexed"] == 2 and applied.counts["deleted"] == 1
    after_second = all_documents(opensearch_url, "items")
    assert after_second["1"] == {"id": 1, "name": "v2-1", "qty": 100} and "2" not in after_second
    assert len(after_second) == 8

    # Rerun of either batch through the sink: skipped by the checkpoint guard.
    assert sink.apply(batch_info(11, 2, 10), second).skipped
    assert sink.apply(batch_info(10, 1, None, export=True), export).skipped
    # The stale export written straight to the index (no guard): external versions refuse all of
    # it, including document 2, whose delete tombstone (sequence 2) outranks version 1.
    stale = write_events(settings(opensearch_url), export)
    assert stale.ok and stale.counts["version_conflicts"] == 8 and stale.counts["indexed"] == 0
    assert all_documents(opensearch_url, "items") == after_second
    # Replaying the second batch again directly: every action conflicts, nothing changes.
    replay = write_events(settings(opensearch_url), second)
    assert replay.ok and replay.counts["version_conflicts"] + replay.counts["delete_not_found"] == 3
    assert document_versions(opensearch_url, "items", ["1", "9", "3"]) == {"1": 2, "9": 2, "3": 1}
    assert sink.read_checkpoint() == Checkpoint(11, 2)


def test_out_of_order_batch_is_refused_and_nothing_is_written(spark, opensearch_url):
    sink = OpenSearchSink(settings(opensearch_url), SIMPLE_SCHEMA)
    sink.apply(batch_info(10, 1, None, export=True), simple_events(spark, [(b.INSERT, 1, "a", 1)], 10, 1))
    gap = simple_events(spark, [(b.INSERT, 5, "e", 5)], 12, 3)
    with pytest.raises(CheckpointError, match="apply the batches in between"):
        sink.apply(batch_info(12, 3, 11), gap)
    assert set(all_documents(opensearch_url, "items")) == {"1"}
    fresh = OpenSearchSink(settings(opensearch_url, index="other"), SIMPLE_SCHEMA)
    with pytest.raises(CheckpointError, match="export batch must be applied first"):
        fresh.apply(batch_info(12, 3, 11), gap)


def test_keyless_append_only_table_gets_stable_ids_and_refuses_deletes(spark, opensearch_url):
    sink = OpenSearchSink(settings(opensearch_url, index="log"), SIMPLE_SCHEMA)
    rows = [(b.INSERT, 1, "same", 1), (b.INSERT, 1, "same", 1), (b.INSERT, 2, "other", 2)]
    export = simple_events(spark, rows, 20, 1, key=None)
    info = batch_info(20, 1, None, export=True, key=())
    sink.apply(info, export)
    first = all_documents(opensearch_url, "log")
    # Two identical rows stay two documents; ids are derived from the rows, not random.
    assert sorted((d["id"], d["name"]) for d in first.values()) == [(1, "same"), (1, "same"), (2, "other")]
    # Written again without the checkpoint guard: the same ids come out, so nothing duplicates.
    again = write_events(settings(opensearch_url, index="log"),
                         prepare_events(simple_events(spark, rows, 20, 1, key=None), (), False, "db.t", 20, "t"))
    assert again.counts["version_conflicts"] == 3 and again.counts["indexed"] == 0
    assert all_documents(opensearch_url, "log") == first

    deleting = simple_events(spark, [(b.INSERT, 3, "new", 3), (b.DELETE, 1, "same", 1)], 21, 2, key=None)
    with pytest.raises(DeleteWithoutDocumentIdError, match="snapshot 21 of db.t deletes rows.*identifier"):
        sink.apply(batch_info(21, 2, 20, key=()), deleting)
    assert all_documents(opensearch_url, "log") == first
    assert sink.read_checkpoint() == Checkpoint(20, 1)


def test_document_rejected_by_mapping_fails_batch_keeps_checkpoint_and_rerun_converges(spark, opensearch_url):
    # The operator's own mapping types `name` as long: a non-numeric name is rejected.
    user_mapping = {"properties": {"id": {"type": "long"}, "name": {"type": "long"}, "qty": {"type": "long"}}}
    sink = OpenSearchSink(settings(opensearch_url, mapping=user_mapping), SIMPLE_SCHEMA)
    sink.apply(batch_info(10, 1, None, export=True),
               simple_events(spark, [(b.INSERT, i, str(100 + i), i) for i in range(1, 6)], 10, 1))
    batch = simple_events(spark, [(b.UPDATE_AFTER, 1, "201", 7), (b.UPDATE_AFTER, 2, "oops", 8),
                                  (b.DELETE, 3, "103", 3), (b.INSERT, 6, "106", 6)], 11, 2)
    with pytest.raises(SinkWriteError) as failure:
        sink.apply(batch_info(11, 2, 10), batch)
    message = str(failure.value)
    assert "index items" in message and "1 of 4 actions failed" in message
    assert "_id=2" in message and "mapper_parsing_exception" in message and "checkpoint left at 10" in message
    assert sink.read_checkpoint() == Checkpoint(10, 1)

    # The operator fixes the mapping (ignore_malformed is updatable); the rerun converges.
    OpenSearch(hosts=[opensearch_url]).indices.put_mapping(
        index="items", body={"properties": {"name": {"type": "long", "ignore_malformed": True}}})
    rerun = sink.apply(batch_info(11, 2, 10), batch)
    assert rerun.checkpoint == Checkpoint(11, 2)
    assert rerun.counts["indexed"] == 1 and rerun.counts["version_conflicts"] == 3
    docs = all_documents(opensearch_url, "items")
    assert docs == {"1": {"id": 1, "name": "201", "qty": 7}, "2": {"id": 2, "name": "oops", "qty": 8},
                    "4": {"id": 4, "name": "104", "qty": 4}, "5": {"id": 5, "name": "105", "qty": 5},
                    "6": {"id": 6, "name": "106", "qty": 6}}


def test_server_stopped_mid_batch_fails_batch_keeps_checkpoint_and_rerun_converges(spark, opensearch_url):
    proxy = CuttableProxy(opensearch_url)
    try:
        sink = OpenSearchSink(settings(proxy.url, chunk_size=3, parallelism=1), SIMPLE_SCHEMA)
        sink.apply(batch_info(10, 1, None, export=True),
                   simple_events(spark, [(b.INSERT, i, f"a{i}", i) for i in range(1, 31)], 10, 1))
        changes = [(b.UPDATE_AFTER, i, f"b{i}", -i) for i in range(1, 31, 2)] + [(b.DELETE, 30, "a30", 30)]
        batch = simple_events(spark, changes, 11, 2).coalesce(1)
        proxy.cut_at_bulk = proxy.bulk_requests + 3  # two bulk requests get through, the third dies
        with pytest.raises(SinkWriteError, match="partition.*stopped.*(ConnectionError|failed after)"):
            sink.apply(batch_info(11, 2, 10), batch)
        partly = all_documents(opensearch_url, "items")
        assert sum(d["name"].startswith("b") for d in partly.values()) == 6  # 2 chunks of 3 made it
        direct = OpenSearchSink(settings(opensearch_url), SIMPLE_SCHEMA)
        assert direct.read_checkpoint() == Checkpoint(10, 1)

        proxy.restart()
        rerun = sink.apply(batch_info(11, 2, 10), batch)
        assert rerun.checkpoint == Checkpoint(11, 2)
        assert rerun.counts["version_conflicts"] == 6 and rerun.counts["indexed"] == 9
        expected = {str(i): {"id": i, "name": f"b{i}" if i % 2 else f"a{i}", "qty": -i if i % 2 else i}
                    for i in range(1, 30)}
        assert all_documents(opensearch_url, "items") == expected
    finally:
        proxy.stop()


def test_schema_evolution_adds_new_columns_to_the_mapping(spark, opensearch_url):
    sink = OpenSearchSink(settings(opensearch_url), SIMPLE_SCHEMA)
    sink.apply(batch_info(10, 1, None, export=True), simple_events(spark, [(b.INSERT, 1, "a", 1)], 10, 1))
    evolved = Schema(*SIMPLE_SCHEMA.fields, it.NestedField(4, "amount", it.DecimalType(10, 2), required=False),
                     it.NestedField(5, "seen", it.TimestamptzType(), required=False), identifier_field_ids=[1])
    new_sink = OpenSearchSink(settings(opensearch_url), evolved)
    events = events_frame(spark, SIMPLE_DDL + ", amount decimal(10,2), seen timestamp",
                          [(b.INSERT, 2, "b", 2, Decimal("12.50"), dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC))],
                          11, 2)
    new_sink.apply(batch_info(11, 2, 10), events)
    props = live_mappings(opensearch_url, "items")["properties"]
    assert props["amount"] == {"type": "keyword"} and props["seen"]["type"] == "date"
    docs = all_documents(opensearch_url, "items")
    assert docs["2"] == {"id": 2, "name": "b", "qty": 2, "amount": "12.50", "seen": "2024-01-02T03:04:05.000000Z"}
    assert docs["1"] == {"id": 1, "name": "a", "qty": 1}


def test_throttled_bulk_requests_are_retried_with_backoff(spark, opensearch_url):
    proxy = CuttableProxy(opensearch_url, throttle_bulks=2)
    try:
        sink = OpenSearchSink(settings(proxy.url, parallelism=1, max_retries=3, initial_backoff_s=0.1),
                              SIMPLE_SCHEMA)
        started = dt.datetime.now()
        result = sink.apply(batch_info(10, 1, None, export=True),
                            simple_events(spark, [(b.INSERT, i, f"a{i}", i) for i in range(1, 6)], 10, 1).coalesce(1))
        assert proxy.throttled == 2 and result.counts["indexed"] == 5
        assert (dt.datetime.now() - started).total_seconds() >= 0.3  # backed off 0.1 s, then 0.2 s
        assert len(all_documents(opensearch_url, "items")) == 5
    finally:
        proxy.stop()
    # More 429s than retries: the batch fails and says why.
    proxy = CuttableProxy(opensearch_url, throttle_bulks=10)
    try:
        sink = OpenSearchSink(settings(proxy.url, parallelism=1, max_retries=1), SIMPLE_SCHEMA)
        with pytest.raises(SinkWriteError, match="failed after 2 attempts.*429"):
            sink.apply(batch_info(11, 2, 10), simple_events(spark, [(b.INSERT, 9, "z", 9)], 11, 2).coalesce(1))
        assert sink.read_checkpoint() == Checkpoint(10, 1)
    finally:
        proxy.stop()


def test_index_template_metadata_fields_and_wait_for_refresh(spark, opensearch_url):
    client = OpenSearch(hosts=[opensearch_url])
    client.indices.put_index_template(name="items-tpl", body={
        "index_patterns": ["items*"], "template": {"mappings": {"properties": {"name": {"type": "keyword"}}}}})
    missing = OpenSearchSink(settings(opensearch_url, template_name="nope"), SIMPLE_SCHEMA)
    with pytest.raises(ConfigError, match="index template 'nope' for index items does not exist"):
        missing.ensure_index()
    sink = OpenSearchSink(settings(opensearch_url, template_name="items-tpl", include_iceberg_metadata=True,
                                   refresh="wait_for"), SIMPLE_SCHEMA)
    sink.apply(batch_info(10, 1, None, export=True, table="db.items"),
               events_frame(spark, SIMPLE_DDL, [(b.INSERT, 1, "a", 1)], 10, 1, table="db.items"))
    props = live_mappings(opensearch_url, "items")["properties"]
    assert props["name"] == {"type": "keyword"}  # the template's choice wins
    assert props["qty"]["type"] == "long" and props["iceberg_snapshot_id"]["type"] == "long"
    assert all_documents(opensearch_url, "items") == {"1": {
        "id": 1, "name": "a", "qty": 1, "iceberg_operation": "INSERT", "iceberg_snapshot_operation": "overwrite",
        "iceberg_table_name": "db.items", "iceberg_snapshot_id": 10}}


def test_chunks_respect_count_and_byte_limits(spark, opensearch_url):
    proxy = CuttableProxy(opensearch_url)
    try:
        rows = [(b.INSERT, i, "x" * 200, i) for i in range(1, 13)]
        by_bytes = OpenSearchSink(settings(proxy.url, chunk_size=1000, max_chunk_bytes=700, parallelism=1),
                                  SIMPLE_SCHEMA)
        by_bytes.apply(batch_info(10, 1, None, export=True), simple_events(spark, rows, 10, 1).coalesce(1))
        # ~330 bytes per action on the wire: at most two per request under 700 bytes.
        assert proxy.bulk_requests >= 6
        assert len(all_documents(opensearch_url, "items")) == 12
        before = proxy.bulk_requests
        by_count = OpenSearchSink(settings(proxy.url, index="other", chunk_size=5, parallelism=1), SIMPLE_SCHEMA)
        by_count.apply(batch_info(10, 1, None, export=True), simple_events(spark, rows, 10, 1).coalesce(1))
        assert proxy.bulk_requests - before == 3  # 5 + 5 + 2
    finally:
        proxy.stop()
