"""The type table of docs/ingestion.md, one test per row: Connect type / Debezium logical name -> Iceberg type -> decoded value.

Each row is parsed from a schema-block envelope (``parse_line``), typed by the mapping, and the decoded value
coerced to the Spark type of that Iceberg type, exactly as ingestion does. A last test checks that docs/ingestion.md
table lists every name the code maps, with the same Iceberg type.
"""

import base64
import datetime as dt
import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from icecdc_dagster.ingest import schema_inference as si
from icecdc_dagster.ingest.coercion import coerce
from icecdc_dagster.ingest.debezium import EventError, parse_line

UTC = dt.UTC


def _b64(n: int) -> str:
    return base64.b64encode(n.to_bytes((n.bit_length() + 8) // 8 or 1, "big", signed=True)).decode()


def _f(type_, name=None, **extra):
    return {"type": type_, **({"name": name} if name else {}), **extra}


POINT = _f("struct", "io.debezium.data.geometry.Point", fields=[
    {"field": "x", "type": "double"}, {"field": "y", "type": "double"},
    {"field": "wkb", "type": "bytes", "optional": True}, {"field": "srid", "type": "int32", "optional": True}])
GEOMETRY_FIELDS = [{"field": "wkb", "type": "bytes"}, {"field": "srid", "type": "int32", "optional": True}]

# (row id = the name in the type table, field schema, wire value, Iceberg type, expected coerced value)
ROWS = [
    ("int8", _f("int8"), -128, "int", -128),
    ("int16", _f("int16"), 32767, "int", 32767),
    ("int32", _f("int32"), -2147483648, "int", -2147483648),
    ("int64", _f("int64"), 9223372036854775807, "long", 9223372036854775807),
    ("float", _f("float"), 1.5, "float", 1.5),
    ("float32", _f("float32"), -0.25, "float", -0.25),
    ("double", _f("double"), 0.1, "double", 0.1),
    ("float64", _f("float64"), 1e300, "double", 1e300),
    ("boolean", _f("boolean"), True, "boolean", True),
    ("string", _f("string"), "ünïcode", "string", "ünïcode"),
    ("bytes", _f("bytes"), "AP8=", "binary", b"\x00\xff"),
    ("array", _f("array", items={"type": "int32"}), [1, None, 3], "list<int>", [1, None, 3]),
    ("map", _f("map", keys={"type": "string"}, values={"type": "int64"}), {"a": 1}, "map<string,long>", {"a": 1}),
    ("struct", _f("struct", fields=[{"field": "a", "type": "int32"}, {"field": "b", "type": "string"}]),
     {"a": 1, "b": "x"}, "struct<a:int,b:string>", (1, "x")),
    ("org.apache.kafka.connect.data.Decimal",
     _f("bytes", si.DECIMAL, parameters={"scale": "3", "connect.decimal.precision": "40"}),
     _b64(123456789876543212345678987654321110), "decimal(38,3)", Decimal("123456789876543212345678987654321.110")),
    ("io.debezium.data.VariableScaleDecimal",
     _f("struct", si.VARIABLE_SCALE_DECIMAL, fields=[{"field": "scale", "type": "int32"},
                                                     {"field": "value", "type": "bytes"}]),
     {"scale": 4, "value": _b64(-31415)}, "decimal(38,18)", Decimal("-3.1415")),
    ("org.apache.kafka.connect.data.Date", _f("int32", "org.apache.kafka.connect.data.Date"), 19723, "date",
     dt.date(2024, 1, 1)),
    ("io.debezium.time.Date", _f("int32", "io.debezium.time.Date"), -1, "date", dt.date(1969, 12, 31)),
    ("io.debezium.time.IsoDate", _f("string", "io.debezium.time.IsoDate"), "2017-09-15Z", "date", dt.date(2017, 9, 15)),
    ("org.apache.kafka.connect.data.Time", _f("int32", "org.apache.kafka.connect.data.Time"), 45296789, "string",
     "12:34:56.789000"),
    ("io.debezium.time.Time", _f("int32", "io.debezium.time.Time"), 1, "string", "00:00:00.001000"),
    ("io.debezium.time.MicroTime", _f("int64", "io.debezium.time.MicroTime"), 45296000001, "string", "12:34:56.000001"),
    ("io.debezium.time.NanoTime", _f("int64", "io.debezium.time.NanoTime"), 45296000000001, "string",
     "12:34:56.000000001"),
    ("io.debezium.time.ZonedTime", _f("string", "io.debezium.time.ZonedTime"), "12:34:56.789Z", "string",
     "12:34:56.789Z"),
    ("io.debezium.time.IsoTime", _f("string", "io.debezium.time.IsoTime"), "04:05:11.789Z", "string", "04:05:11.789Z"),
    ("org.apache.kafka.connect.data.Timestamp", _f("int64", "org.apache.kafka.connect.data.Timestamp"),
     1529476623000, "timestamp", dt.datetime(2018, 6, 20, 6, 37, 3)),
    ("io.debezium.time.Timestamp", _f("int64", "io.debezium.time.Timestamp"), 1529476623001, "timestamp",
     dt.datetime(2018, 6, 20, 6, 37, 3, 1000)),
    ("io.debezium.time.MicroTimestamp", _f("int64", "io.debezium.time.MicroTimestamp"), 1529507596945104,
     "timestamp", dt.datetime(2018, 6, 20, 15, 13, 16, 945104)),
    ("io.debezium.time.NanoTimestamp", _f("int64", "io.debezium.time.NanoTimestamp"), 1529507596945104000,
     "timestamp", dt.datetime(2018, 6, 20, 15, 13, 16, 945104)),
    ("io.debezium.time.IsoTimestamp", _f("string", "io.debezium.time.IsoTimestamp"), "2019-07-09T02:28:57.123456Z",
     "timestamp", dt.datetime(2019, 7, 9, 2, 28, 57, 123456)),
    ("io.debezium.time.ZonedTimestamp", _f("string", "io.debezium.time.ZonedTimestamp"), "2018-06-20T15:37:03+02:00",
     "timestamptz", dt.datetime(2018, 6, 20, 13, 37, 3, tzinfo=UTC)),
    ("io.debezium.time.Year", _f("int32", "io.debezium.time.Year"), 2024, "int", 2024),
    ("io.debezium.time.MicroDuration", _f("int64", "io.debezium.time.MicroDuration"), 3_600_000_000, "long",
     3_600_000_000),
    ("io.debezium.time.Interval", _f("string", "io.debezium.time.Interval"), "P1Y2M3DT4H5M6.78S", "string",
     "P1Y2M3DT4H5M6.78S"),
    ("io.debezium.data.Uuid", _f("string", "io.debezium.data.Uuid"), "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
     "string", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("io.debezium.data.Json", _f("string", "io.debezium.data.Json"), '{"k": [1, 2.50]}', "string",
     '{"k": [1, 2.50]}'),
    ("io.debezium.data.Xml", _f("string", "io.debezium.data.Xml"), "<a>1</a>", "string", "<a>1</a>"),
    ("io.debezium.data.Enum", _f("string", "io.debezium.data.Enum", parameters={"allowed": "S,M,L"}), "M",
     "string", "M"),
    ("io.debezium.data.EnumSet", _f("string", "io.debezium.data.EnumSet", parameters={"allowed": "a,b,c"}), "a,c",
     "string", "a,c"),
    ("io.debezium.data.Ltree", _f("string", "io.debezium.data.Ltree"), "Top.Science", "string", "Top.Science"),
    ("io.debezium.data.Tsvector", _f("string", "io.debezium.data.Tsvector"), "'a':1 'b':2", "string", "'a':1 'b':2"),
    ("io.debezium.data.Bits", _f("bytes", "io.debezium.data.Bits", parameters={"length": "10"}), "BQI=", "binary",
     b"\x05\x02"),
    ("io.debezium.data.geometry.Point", POINT, {"x": 1.5, "y": -2.0, "wkb": None, "srid": None},
     "struct<x:double,y:double,wkb:binary,srid:int>", (1.5, -2.0, None, None)),
    ("io.debezium.data.geometry.Geometry", _f("struct", "io.debezium.data.geometry.Geometry", fields=GEOMETRY_FIELDS),
     {"wkb": "AQE=", "srid": 4326}, "struct<wkb:binary,srid:int>", (b"\x01\x01", 4326)),
    ("io.debezium.data.geometry.Geography", _f("struct", "io.debezium.data.geometry.Geography",
                                               fields=GEOMETRY_FIELDS),
     {"wkb": "AQE=", "srid": 4326}, "struct<wkb:binary,srid:int>", (b"\x01\x01", 4326)),
    ("io.debezium.data.DoubleVector", _f("array", "io.debezium.data.DoubleVector", items={"type": "double"}),
     [0.5, 1.0], "list<double>", [0.5, 1.0]),
    ("io.debezium.data.FloatVector", _f("array", "io.debezium.data.FloatVector", items={"type": "float"}),
     [0.5], "list<float>", [0.5]),
    ("(other logical name)", _f("int64", "com.example.Custom"), 42, "long", 42),
]


def _envelope(field_schema, value):
    after = {"type": "struct", "field": "after", "fields": [{**field_schema, "field": "col"}]}
    return json.dumps({"schema": {"type": "struct", "fields": [after]},
                       "payload": {"op": "c", "after": {"col": value}}})


@pytest.mark.parametrize("row_id,field_schema,wire,iceberg_type,expected", ROWS, ids=[r[0] for r in ROWS])
def test_type_table_row(row_id, field_schema, wire, iceberg_type, expected):
    env = parse_line(_envelope(field_schema, wire))
    assert env.field_types["col"] == iceberg_type
    value = coerce(env.image["col"], si.spark_type(iceberg_type))
    assert value == expected and type(value) is type(expected)
    if isinstance(expected, dt.datetime):
        assert value.tzinfo == expected.tzinfo


@pytest.mark.parametrize("field_schema,message", [
    (_f("decimal"), "unknown Kafka Connect type 'decimal'"),
    (_f("array", items={"type": "float128"}), "unknown Kafka Connect type 'float128'"),
    (_f("struct", fields=[]), "struct without fields"),
    (_f("bytes", si.DECIMAL, parameters={"scale": "40"}), "scale 40"),
])
def test_unknown_or_unmappable_types_dead_letter_the_event(field_schema, message):
    with pytest.raises(EventError, match=re.escape(message)):
        parse_line(_envelope(field_schema, None))


def test_documented_type_table_lists_every_mapped_name_with_its_type():
    doc = (Path(__file__).parents[2] / "docs" / "ingestion.md").read_text()
    section = doc.split("## Type table", 1)[1].split("\n#", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and not set(cells[0]) <= {"-", " "}:
            for name in cells[0].replace("`", "").split(","):
                table[name.strip()] = cells[1].replace("`", "")
    for row_id, _, _, iceberg_type, _ in ROWS:
        if row_id in ("array", "map", "struct", "(other logical name)", si.DECIMAL):  # parametrised types
            assert row_id in table, row_id
            continue
        assert table.get(row_id) == iceberg_type, row_id
    mapped = set(si.CONNECT_PRIMITIVES) | set(si.LOGICAL_TYPES) | set(si.PHYSICAL_LOGICAL_TYPES)
    assert mapped <= set(table), sorted(mapped - set(table))
    assert mapped <= {r[0] for r in ROWS}, sorted(mapped - {r[0] for r in ROWS})
