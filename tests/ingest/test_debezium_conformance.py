"""Conformance with Debezium's published event shapes, through the real pipeline into real Iceberg tables.

Fixtures (tests/ingest/fixtures/debezium/) copy the shapes of Debezium's documentation: the tutorial's MySQL
``dbserver1.inventory.customers`` snapshot/update/delete events (with the docs' duplicated ``name`` key in
``source``) and the MySQL and PostgreSQL connectors' data-type mappings (JsonConverter type names ``float`` /
``double``, ``Decimal`` with ``connect.decimal.precision`` up to 40, ``VariableScaleDecimal``,
``io.debezium.time.*``, ``ZonedTimestamp``, ``Json``, ``Uuid``, ``Enum``/``EnumSet``, ``Bits``, base64 bytes,
arrays, maps, ``geometry.Point``). Expected rows and column types are written by hand below.
"""

import base64
import datetime as dt
from decimal import Decimal
from pathlib import Path

from icecdc_dagster.ingest import IngestSettings, ingest_files, pending_files

FIXTURES = Path(__file__).parent / "fixtures" / "debezium"


def _land(tmp_path, parts):
    """Landing files from fixture lines: ``parts`` = [(file name, fixture, first line, end line)]."""
    landing = tmp_path / "landing"
    landing.mkdir()
    for name, fixture, start, end in parts:
        lines = (FIXTURES / fixture).read_text().splitlines()[start:end]
        (landing / name).write_text("\n".join(lines) + "\n")
    return str(landing)


def _ingest(spark, catalog, cat, landing, target, keys):
    settings = IngestSettings(landing=landing, target=target, identifier_columns=keys, auto_create=True,
                              schema_evolution=True)
    return [ingest_files(spark, cat, catalog, settings, [f]) for f in pending_files(spark, cat, settings)]


def _table(spark, cat, table):
    df = spark.table(f"{cat}.{table}")
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    return types, {r.id: r.asDict(recursive=True) for r in df.collect()}


def test_mysql_tutorial_customers(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    landing = _land(tmp_path, [("001-snapshot.json", "mysql_tutorial_customers.jsonl", 0, 4),
                               ("002-stream.json", "mysql_tutorial_customers.jsonl", 4, 7)])
    snapshot, stream = _ingest(spark, catalog, cat, landing, "db.customers", ("id",))
    types, rows = _table(spark, cat, "db.customers")
    assert list(types.items()) == [("id", "int"), ("first_name", "string"), ("last_name", "string"),
                                   ("email", "string")]   # the schema block's order
    assert rows == {
        1001: {"id": 1001, "first_name": "Sally", "last_name": "Thomas", "email": "sally.thomas@acme.com"},
        1002: {"id": 1002, "first_name": "George", "last_name": "Bailey", "email": "gbailey@foobar.com"},
        1003: {"id": 1003, "first_name": "Edward", "last_name": "Walker", "email": "ed@walker.com"},
    }
    assert snapshot.targets["db.customers"].counts["inserted"] == 4
    assert stream.tombstones == 1 and stream.targets["db.customers"].counts["deleted"] == 1
    assert stream.targets["db.customers"].counts["dead_lettered"] == 0
    assert not catalog.table_exists("db.customers__dead_letters")


PG_TYPES = {
    "id": "int", "small": "int", "big": "bigint", "real_col": "float", "double_col": "double", "flag": "boolean",
    "bit1": "boolean", "bits10": "binary", "amount": "decimal(12,3)", "money_col": "decimal(38,2)",
    "num": "decimal(38,18)", "day": "date", "t3": "string", "t6": "string", "ts3": "timestamp_ntz",
    "ts6": "timestamp_ntz", "tstz": "timestamp", "timetz": "string", "span": "bigint", "doc": "string",
    "uid": "string", "mood": "string", "xml_col": "string", "path": "string", "addr": "string", "raw": "binary",
    "ints": "array<int>", "words": "array<string>", "attrs": "map<string,string>",
    "location": "struct<x:double,y:double,wkb:binary,srid:int>",
}


def test_postgresql_data_types(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    landing = _land(tmp_path, [("001.json", "postgresql_types_1.jsonl", 0, None),
                               ("002.json", "postgresql_types_2.jsonl", 0, None)])
    first, second = _ingest(spark, catalog, cat, landing, "db.all_types", ("id",))
    types, rows = _table(spark, cat, "db.all_types")
    assert types == PG_TYPES
    empty = {name: None for name in PG_TYPES}
    assert rows == {
        1: {"id": 1, "small": -32768, "big": 9223372036854775807, "real_col": 3.25, "double_col": 1e300,
            "flag": True, "bit1": False, "bits10": bytearray(b"\x05\x02"), "amount": Decimal("-999999999.999"),
            "money_col": Decimal("-1234.56"), "num": Decimal("3.141592653589793000"), "day": dt.date(2018, 6, 20),
            "t3": "12:34:56.789000", "t6": "12:34:56.123456", "ts3": dt.datetime(2018, 6, 20, 6, 37, 3),
            "ts6": dt.datetime(2018, 6, 20, 15, 13, 16, 945104), "tstz": dt.datetime(2018, 6, 20, 13, 37, 3, 123456),
            "timetz": "10:15:30.5Z", "span": 93_784_000_000, "doc": '{"a": [1, 2.50], "b": null}',
            "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "mood": "sad", "xml_col": "<a>1</a>",
            "path": "Top.Science.Astronomy", "addr": "192.168.0.1/24", "raw": bytearray(b"\x00\x01\x02\xff"),
            "ints": [1, None, -3], "words": ["a", "ü"], "attrs": {"k": "v", "n": None},
            "location": {"x": 1.5, "y": -2.25, "srid": None,
                         "wkb": bytearray(base64.b64decode("AQEAAAAAAAAAAAD4PwAAAAAAAALA"))}},
        3: {**empty, "id": 3, "small": 1},
    }
    assert first.targets["db.all_types"].counts["inserted"] == 2
    assert second.targets["db.all_types"].counts["deleted"] == 1
    assert first.targets["db.all_types"].counts["dead_lettered"] == 0
    assert not catalog.table_exists("db.all_types__dead_letters")


def test_mysql_data_types(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    landing = _land(tmp_path, [("001.json", "mysql_types.jsonl", 0, None)])
    [result] = _ingest(spark, catalog, cat, landing, "db.my_types", ("id",))
    types, rows = _table(spark, cat, "db.my_types")
    assert types == {
        "id": "int", "tiny": "int", "tiny_unsigned": "int", "medium": "int", "f": "float", "d": "double",
        "dec40": "decimal(38,3)", "dec38": "decimal(38,10)", "yr": "int", "birth": "date", "wake": "string",
        "dt0": "timestamp_ntz", "dt6": "timestamp_ntz", "ts": "timestamp", "size": "string", "tags": "string",
        "j": "string", "blob": "binary", "bit1": "boolean", "bit8": "binary"}
    one = {"id": 1, "tiny": -128, "tiny_unsigned": 255, "medium": -8388608, "f": 1.5, "d": -2.5e-300,
           "dec40": Decimal("123456789876543212345678987654321.110"),
           "dec38": Decimal("1234567890123456789012345678.0123456789"), "yr": 2024, "birth": dt.date(1960, 1, 1),
           "wake": "08:30:00.000000", "dt0": dt.datetime(2018, 6, 20, 6, 37, 3),
           "dt6": dt.datetime(2018, 6, 20, 6, 37, 3, 123456), "ts": dt.datetime(2018, 6, 20, 13, 37, 3), "size": "M",
           "tags": "a,c", "j": '{"k":1}', "blob": bytearray(b"\xde\xad\xbe\xef"), "bit1": True,
           "bit8": bytearray(b"\x81")}
    two = {**one, "id": 2, "dec40": Decimal("-123456789876543212345678987654321.110"), "dec38": None, "f": None,
           "tags": ""}
    assert rows == {1: one, 2: two}
    assert str(rows[1]["dec40"]) == "123456789876543212345678987654321.110"   # every digit, scale kept
    assert result.targets["db.my_types"].counts == {**result.targets["db.my_types"].counts, "inserted": 2,
                                                    "dead_lettered": 0, "nanos_truncated": 0, "stringified": 0}
