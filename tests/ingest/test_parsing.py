"""Envelope parsing, logical types, op mapping, coercion, routing and byte-range reading (no Spark session)."""

import base64
import datetime as dt
import json
from decimal import Decimal

import pytest
from pyspark.sql import types as T

from icecdc_dagster.errors import SchemaDeclarationError
from icecdc_dagster.ingest import routing
from icecdc_dagster.ingest.coercion import CoercionError, coerce
from icecdc_dagster.ingest.debezium import DELETE, INSERT, UPDATE, EventError, map_op, parse_line
from icecdc_dagster.ingest.schema_inference import merge_types, type_of_value
from icecdc_dagster.writer.type_ddl import spark_ddl


@pytest.mark.parametrize("op,expected", [("c", INSERT), ("R", INSERT), ("i", INSERT), ("Insert", INSERT),
                                         ("create", INSERT), ("INDEX", INSERT), ("u", UPDATE), ("UPDATE", UPDATE),
                                         ("d", DELETE), ("Delete", DELETE)])
def test_op_mapping_is_case_insensitive(op, expected):
    assert map_op(op) == expected


@pytest.mark.parametrize("op", ["x", "upsert", "", None, "t"])
def test_unknown_op_is_an_event_error(op):
    with pytest.raises(EventError, match="unknown op"):
        map_op(op)


def test_tombstones_and_bare_payload():
    assert parse_line("null") is None and parse_line("   ") is None
    assert parse_line('{"schema": null, "payload": null}') is None
    env = parse_line(json.dumps({"op": "d", "before": {"id": 3, "tags": []}, "after": None}))
    assert env.op == DELETE and env.image == {"id": 3, "tags": []}
    assert env.field_types == {"id": "long"}   # an empty list carries no type
    with pytest.raises(EventError, match="malformed JSON"):
        parse_line('{"op": "c", "after": {')
    with pytest.raises(EventError, match="without a 'after'"):
        parse_line('{"op": "c", "after": null}')


def test_schema_block_logical_types():
    unscaled = (-12345).to_bytes(2, "big", signed=True)
    fields = [
        {"field": "d", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
         "parameters": {"scale": "3", "connect.decimal.precision": "7"}},
        {"field": "day", "type": "int32", "name": "io.debezium.time.Date"},
        {"field": "ns", "type": "int64", "name": "io.debezium.time.NanoTimestamp"},
        {"field": "z", "type": "string", "name": "io.debezium.time.ZonedTimestamp"},
        {"field": "t", "type": "int64", "name": "io.debezium.time.MicroTime"},
        {"field": "v", "type": "struct", "name": "io.debezium.data.VariableScaleDecimal"},
        {"field": "b", "type": "bytes"},
    ]
    payload = {"op": "c", "after": {
        "d": base64.b64encode(unscaled).decode(), "day": 19723, "ns": 1_700_000_000_123_456_789,
        "z": "2024-01-02T03:04:05.5+01:00", "t": 45_296_000_001,
        "v": {"scale": 4, "value": base64.b64encode((31415).to_bytes(2, "big", signed=True)).decode()},
        "b": base64.b64encode(b"\x00\xff").decode()}}
    schema = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": fields}]}
    env = parse_line(json.dumps({"schema": schema, "payload": payload}))
    assert env.image["d"] == Decimal("-12.345")
    assert env.image["day"] == dt.date(2024, 1, 1)
    assert env.image["ns"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert env.image["z"].utcoffset() == dt.timedelta(hours=1)
    assert env.image["t"] == "12:34:56.000001"
    assert env.image["v"] == Decimal("3.1415")
    assert env.image["b"] == b"\x00\xff"
    assert env.field_types["d"] == "decimal(7,3)" and env.field_types["z"] == "timestamptz"
    assert env.field_types["ns"] == "timestamp" and env.field_types["b"] == "binary"


def test_coercion_rules():
    assert coerce("42", T.LongType()) == 42 and coerce(7.0, T.IntegerType()) == 7
    with pytest.raises(CoercionError):
        coerce(2**40, T.IntegerType())
    with pytest.raises(CoercionError):
        coerce(True, T.LongType())
    assert coerce("1.10", T.DecimalType(5, 2)) == Decimal("1.10")
    with pytest.raises(CoercionError, match="exactly"):
        coerce("1.105", T.DecimalType(5, 2))
    assert coerce("TRUE", T.BooleanType()) is True
    with pytest.raises(CoercionError):
        coerce("yes", T.BooleanType())
    assert coerce(19723, T.DateType()) == dt.date(2024, 1, 1)
    ms = coerce(1_700_000_000_000, T.TimestampNTZType())
    us = coerce(1_700_000_000_000_000, T.TimestampNTZType())
    assert ms == us == dt.datetime(2023, 11, 14, 22, 13, 20)
    assert coerce("2024-01-01T01:00:00+01:00", T.TimestampType()) == dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    assert coerce("AP8=", T.BinaryType()) == b"\x00\xff"
    nested = T.StructType([T.StructField("a", T.ArrayType(T.LongType())), T.StructField("m", T.MapType(
        T.StringType(), T.DoubleType()))])
    assert coerce({"a": ["1", 2], "m": {"x": 1}}, nested) == ([1, 2], {"x": 1.0})
    with pytest.raises(CoercionError):
        coerce({"a": ["one"]}, nested)


def test_inference_and_ddl():
    # empty objects and lists carry no type: they never make a column a string
    assert type_of_value({"a": 1, "b": [1.5], "c": {}, "d": []}) == "struct<a:long,b:list<double>>"
    assert merge_types(["int", "long"]) == "long" and merge_types(["long", "double"]) == "double"
    assert merge_types(["long", "string"]) == "long"   # first event's type wins; misfits are dead letters
    assert spark_ddl("map<string,list<timestamptz>>") == "map<string, array<timestamp>>"
    assert spark_ddl("decimal( 10 , 2 )") == "decimal(10,2)" and spark_ddl("fixed[16]") == "binary"


@pytest.mark.parametrize("declared", ["decimal(10", "decimal(10,2", "decimal(39,2)", "decimal(4,5)", "fixed[x]",
                                      "decimal(10,2) extra"])
def test_a_malformed_declared_type_is_named_before_spark_parses_it(declared):
    """YAML's flow style splits ``{type: decimal(10,2)}`` at the comma: the type that reached Spark's parser was
    ``decimal(10``, and its error named neither the table nor the column."""
    with pytest.raises(SchemaDeclarationError, match=r"table t column balance: .*"):
        spark_ddl(declared, "table t column balance")


def test_routing_template():
    payload = {"source": {"schema": "Inv", "table": "order-lines"}}
    assert routing.route("lake.{source.schema}_{source.table}", payload) == "lake.inv_order_lines"
    assert routing.namespace_of("lake.{source.schema}_{source.table}") == "lake"
    with pytest.raises(EventError, match="source.db"):
        routing.route("lake.{source.db}", payload)


def _after_field(field: object) -> dict:
    return {"schema": {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [field]}]},
            "payload": {"op": "c", "after": {"id": 1}}}


@pytest.mark.parametrize("event,where", [
    (_after_field({"field": "id", "type": "int32", "name": ["x"]}), "schema.fields[0].fields[0].name is not a string"),
    (_after_field({"field": ["id"], "type": "int32"}), "fields[0].fields[0].field is not a string"),
    (_after_field({"field": "id", "type": {"a": 1}}), "fields[0].fields[0].type is not a string"),
    (_after_field("id"), "schema.fields[0].fields[0] is not a JSON object"),
    (_after_field({"field": "id", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                   "parameters": ["scale"]}), "parameters is not an object of strings"),
    (_after_field({"field": "id", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                   "parameters": {"scale": "two"}}), "parameters.scale is not an integer"),
    (_after_field({"field": "id", "type": "array", "items": "int32"}), "fields[0].fields[0].items is not a JSON object"),
    (_after_field({"field": "id", "type": "map", "keys": {"type": "string"}, "values": {"type": 3}}),
     "fields[0].fields[0].values.type is not a string"),
    ({"schema": {"type": "struct", "fields": {"after": {}}}, "payload": {"op": "c", "after": {"id": 1}}},
     "schema.fields is not a list"),
    ({"schema": "struct", "payload": {"op": "c", "after": {"id": 1}}}, "schema is not a JSON object"),
])
def test_a_malformed_schema_block_is_an_event_error_naming_where(event, where):
    """Any shape of block the rules cannot read makes the event a dead letter (with the place), never a
    TypeError that fails the batch."""
    with pytest.raises(EventError, match="malformed schema block: .*" + where.replace("[", r"\[").replace("]", r"\]")):
        parse_line(json.dumps(event))


@pytest.mark.parametrize("value", [1, 1.5, True, ["a"], {"a": 1}])
def test_a_uuid_field_that_is_not_a_string_is_an_event_error_not_a_crash(value):
    """Found by the exploring profile of test_native_rules: ``uuid.UUID(1)`` raises AttributeError, which
    failed the whole batch instead of dead-lettering the line."""
    schema = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"field": "id", "type": "string", "name": "io.debezium.data.Uuid"}]}]}
    line = json.dumps({"schema": schema, "payload": {"op": "c", "after": {"id": value}}})
    with pytest.raises(EventError, match=r"field .*id.*Uuid.*not a string"):
        parse_line(line)
