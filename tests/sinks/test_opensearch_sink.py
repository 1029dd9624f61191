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
from icecdc_dagster.errors import CheckpointError, SinkWriteError
from icecdc_dagster.sinks.opensearch import (DeleteWithoutDocumentIdError, OpenSearchSink, OpenSearchSinkSettings,
                                             iceberg_schema_to_mapping, write_events)
from tests.sinks.test_opensearch_support import (CuttableProxy, all_documents, batch_info, document_versions,
                                                 events_frame)

UTC = dt.timezone.utc
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
    mapping = OpenSearch(hosts=[opensearch_url]).indices.get_mapping(index="items")["items"]["mappings"]
    props = mapping["properties"]
    assert props["price"]["type"] == "keyword" and props["payload"]["type"] == "binary"
    assert props["updated_at"]["type"] == "date" and props["born"]["type"] == "date"
    assert props["attrs"]["properties"]["weight"]["type"] == "keyword"
    assert props["qty"]["type"] == "long" and props["ratio"]["type"] == "double"
    assert props["name"]["fields"]["keyword"]["type"] == "keyword"
    # The checkpoint is read back from the index itself by a fresh sink object.
    assert OpenSearchSink(settings(opensearch_url), TYPES_SCHEMA).read_checkpoint() == Checkpoint(101, 1)
