"""Iceberg types of ingested fields: from a Debezium/Kafka Connect schema block, or guessed from a JSON value.

Types are Iceberg type strings (``long``, ``decimal(10,2)``, ``struct<a:long>``,
``list<string>``, ``map<string,long>``) so they can be declared in YAML, aggregated
in Spark and turned into DDL. The mapping of every Connect type name and Debezium
logical name is the table :data:`LOGICAL_TYPES` / :data:`CONNECT_PRIMITIVES` (the
docs/ingestion.md's type table lists the same rows). An unknown *physical* type name is an
error (the event is dead-lettered), never a silent string. Spark 3.5 cannot write
Iceberg ``time`` columns, so Debezium times become ``HH:MM:SS.ffffff`` strings.
"""

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from pyspark.sql import types as T

from icecdc_dagster.errors import SchemaDeclarationError
from icecdc_dagster.writer import split_top

MAX_DECIMAL_PRECISION = 38
DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
VARIABLE_SCALE = 18
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"

# Kafka's JsonConverter writes these type names (connect/json JsonSchema.java); float32/float64 are the
# names of Connect's Schema.Type enum, which some producers write instead.
CONNECT_PRIMITIVES = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float": "float",
                      "float32": "float", "double": "double", "float64": "double", "boolean": "boolean",
                      "string": "string", "bytes": "binary"}
CONNECT_CONTAINERS = {"array", "map", "struct"}

# Logical name -> Iceberg type (None: computed from parameters). Names not listed here take their
# physical Connect type, as Kafka's own JsonConverter does for logical types it does not know.
LOGICAL_TYPES: dict[str, str | None] = {
    DECIMAL: None,
    VARIABLE_SCALE_DECIMAL: f"decimal({MAX_DECIMAL_PRECISION},{VARIABLE_SCALE})",
    "org.apache.kafka.connect.data.Date": "date",
    "io.debezium.time.Date": "date",
    "io.debezium.time.IsoDate": "date",
    "org.apache.kafka.connect.data.Time": "string",
    "io.debezium.time.Time": "string",
    "io.debezium.time.MicroTime": "string",
    "io.debezium.time.NanoTime": "string",
    "io.debezium.time.ZonedTime": "string",
    "io.debezium.time.IsoTime": "string",
    "org.apache.kafka.connect.data.Timestamp": "timestamp",
    "io.debezium.time.Timestamp": "timestamp",
    "io.debezium.time.MicroTimestamp": "timestamp",
    "io.debezium.time.NanoTimestamp": "timestamp",
    "io.debezium.time.IsoTimestamp": "timestamp",
    ZONED_TIMESTAMP: "timestamptz",
    "io.debezium.time.Year": "int",
    "io.debezium.time.MicroDuration": "long",
    "io.debezium.time.Interval": "string",
    "io.debezium.data.Uuid": "string",
    "io.debezium.data.Json": "string",
    "io.debezium.data.Xml": "string",
    "io.debezium.data.Enum": "string",
    "io.debezium.data.EnumSet": "string",
    "io.debezium.data.Ltree": "string",
    "io.debezium.data.Tsvector": "string",
    "io.debezium.data.Bits": "binary",
}
# Logical types whose Iceberg type is their physical struct/list (listed so the documented type table is complete).
PHYSICAL_LOGICAL_TYPES = ("io.debezium.data.geometry.Point", "io.debezium.data.geometry.Geometry",
                          "io.debezium.data.geometry.Geography", "io.debezium.data.DoubleVector",
                          "io.debezium.data.FloatVector")


class ConnectSchemaError(SchemaDeclarationError, ValueError):
    """A Connect schema block names a type this mapping does not know (the event is dead-lettered)."""


def decimal_type(precision: int, scale: int) -> str:
    return f"decimal({precision},{scale})"


def connect_decimal_type(params: dict[str, Any]) -> str:
    """``decimal(P,S)`` of a Connect Decimal: P from ``connect.decimal.precision`` (38 when absent or larger)."""
    scale = int(params.get("scale", 0))
    if not 0 <= scale <= MAX_DECIMAL_PRECISION:
        raise ConnectSchemaError(f"decimal scale {scale} is outside Iceberg's 0..{MAX_DECIMAL_PRECISION}")
    precision = int(params.get("connect.decimal.precision", MAX_DECIMAL_PRECISION))
    return decimal_type(min(max(precision, scale, 1), MAX_DECIMAL_PRECISION), scale)


def type_of_connect(schema: dict[str, Any], path: str = "") -> str:
    """Iceberg type of a Kafka Connect field schema (logical names first); ConnectSchemaError when unknown."""
    where = path or schema.get("field") or "?"
    name = schema.get("name")
    if name in LOGICAL_TYPES:
        mapped = LOGICAL_TYPES[name]
        return mapped if mapped is not None else connect_decimal_type(schema.get("parameters") or {})
    kind = schema.get("type")
    if kind == "struct":
        fields = schema.get("fields") or []
        if not fields:
            raise ConnectSchemaError(f"field {where}: a struct without fields cannot be an Iceberg column")
        inner = ",".join(f"{f['field']}:{type_of_connect(f, where + '.' + f['field'])}" for f in fields)
        return f"struct<{inner}>"
    if kind == "array":
        return f"list<{type_of_connect(schema.get('items') or {}, f'{where}[]')}>"
    if kind == "map":
        return (f"map<{type_of_connect(schema.get('keys') or {}, f'{where}.key')},"
                f"{type_of_connect(schema.get('values') or {}, f'{where}.value')}>")
    if kind not in CONNECT_PRIMITIVES:
        raise ConnectSchemaError(f"field {where}: unknown Kafka Connect type {kind!r}")
    return CONNECT_PRIMITIVES[kind]


def type_of_value(value: Any) -> str | None:
    """Guess from JSON (no schema block): bool, int -> long, fraction -> double, dict -> struct, list -> list.

    ``None``, ``[]`` and ``{}`` carry no type (also inside structs and lists): they never decide a column type.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, (float, Decimal)):
        return "double"
    if isinstance(value, dict):
        fields = [(k, t) for k, t in ((k, type_of_value(v)) for k, v in value.items()) if t is not None]
        return "struct<" + ",".join(f"{k}:{t}" for k, t in fields) + ">" if fields else None
    if isinstance(value, list):
        element = merge_types(type_of_value(v) for v in value)
        return f"list<{element}>" if element else None
    return "string"


_NUMERIC_RANK = {"int": 0, "long": 1, "float": 2, "double": 3}


def _decimal_parts(t: str) -> tuple[int, int] | None:
    if not t.startswith("decimal("):
        return None
    p, s = t[8:-1].split(",")
    return int(p), int(s)


def _merge_two(first: str, other: str) -> str:
    """The one type both fit, or ``first`` when there is none (values of ``other`` then fit or dead-letter)."""
    if first == other:
        return first
    if first in _NUMERIC_RANK and other in _NUMERIC_RANK:
        return max(first, other, key=_NUMERIC_RANK.__getitem__)
    a, b = _decimal_parts(first), _decimal_parts(other)
    if a and b:
        scale = max(a[1], b[1])
        return decimal_type(min(max(a[0] - a[1], b[0] - b[1]) + scale, MAX_DECIMAL_PRECISION), scale)
    if first.startswith("struct<") and other.startswith("struct<"):
        fields = dict(_struct_fields(first))
        for name, t in _struct_fields(other):
            fields[name] = _merge_two(fields[name], t) if name in fields else t
        return "struct<" + ",".join(f"{k}:{t}" for k, t in fields.items()) + ">"
    if first.startswith("list<") and other.startswith("list<"):
        return f"list<{_merge_two(first[5:-1], other[5:-1])}>"
    return first


def merge_types(types: Iterable[str | None]) -> str | None:
    """One column type for a field seen with several types, in event order.

    int < long < float < double (an integer that a double cannot hold exactly is dead-lettered);
    decimals keep the most integer digits and the largest scale (at most 38 digits); structs take
    the union of their fields; lists merge their elements. Any other mix: the first event's type
    wins and events whose values do not fit it go to the dead-letter table.
    """
    merged: str | None = None
    for t in types:
        if t is None:
            continue
        merged = t if merged is None else _merge_two(merged, t)
    return merged


def _struct_fields(t: str) -> list[tuple[str, str]]:
    out = []
    for part in split_top(t[7:-1]):
        name, _, inner = part.partition(":")
        out.append((name.strip(), inner.strip()))
    return out


_SPARK_PRIMITIVES = {"boolean": T.BooleanType(), "int": T.IntegerType(), "integer": T.IntegerType(),
                     "long": T.LongType(), "bigint": T.LongType(), "float": T.FloatType(), "double": T.DoubleType(),
                     "date": T.DateType(), "timestamp": T.TimestampNTZType(), "timestamp_ntz": T.TimestampNTZType(),
                     "timestamptz": T.TimestampType(), "string": T.StringType(), "uuid": T.StringType(),
                     "binary": T.BinaryType()}


def spark_type(iceberg_type: str) -> T.DataType:
    """The Spark type of an Iceberg type string (pure Python: also usable in executors and without a session)."""
    t = iceberg_type.strip()
    low = t.lower()
    if low in _SPARK_PRIMITIVES:
        return _SPARK_PRIMITIVES[low]
    if low.startswith("decimal("):
        p, s = (int(x) for x in t[8:-1].split(","))
        return T.DecimalType(p, s)
    if low.startswith("fixed["):
        return T.BinaryType()
    if low.startswith("struct<"):
        return T.StructType([T.StructField(n, spark_type(inner), True) for n, inner in _struct_fields(t)])
    if low.startswith("list<"):
        return T.ArrayType(spark_type(t[5:-1]), True)
    if low.startswith("map<"):
        key, value = split_top(t[4:-1])
        return T.MapType(spark_type(key), spark_type(value), True)
    raise SchemaDeclarationError(f"unknown Iceberg type {iceberg_type!r}")


def widened(column: T.DataType, wanted: T.DataType) -> T.DataType | None:
    """The type Iceberg may promote ``column`` to so that ``wanted`` values fit, or None.

    Iceberg's allowed promotions: int -> long, float -> double, decimal(P,S) -> decimal(P',S), P' > P.
    """
    if isinstance(column, T.IntegerType) and isinstance(wanted, T.LongType):
        return T.LongType()
    if isinstance(column, T.FloatType) and isinstance(wanted, T.DoubleType):
        return T.DoubleType()
    if (isinstance(column, T.DecimalType) and isinstance(wanted, T.DecimalType) and wanted.scale == column.scale
            and column.precision < wanted.precision <= MAX_DECIMAL_PRECISION):
        return T.DecimalType(wanted.precision, wanted.scale)
    return None
