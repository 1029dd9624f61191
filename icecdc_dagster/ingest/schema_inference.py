"""Iceberg types of ingested fields: from a Debezium/Kafka Connect schema block, or guessed from a JSON value.

Types are Iceberg type strings (``long``, ``decimal(10,2)``, ``struct<a:long>``,
``list<string>``, ``map<string,long>``) so they can be declared in YAML, aggregated
in Spark and turned into DDL. Spark 3.5 cannot write Iceberg ``time`` columns, so
Debezium times become ``HH:MM:SS.ffffff`` strings; uuids are strings.
"""

from typing import Any

from pyspark.sql import types as T

from icecdc_dagster.errors import SchemaDeclarationError

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
VARIABLE_SCALE = 18
DATE_NAMES = {"io.debezium.time.Date", "org.apache.kafka.connect.data.Date"}
TIME_NAMES = {"io.debezium.time.Time", "io.debezium.time.MicroTime", "io.debezium.time.NanoTime",
              "org.apache.kafka.connect.data.Time", "io.debezium.time.ZonedTime"}
TIMESTAMP_NAMES = {"io.debezium.time.Timestamp", "io.debezium.time.MicroTimestamp", "io.debezium.time.NanoTimestamp",
                   "org.apache.kafka.connect.data.Timestamp"}
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
STRING_NAMES = {"io.debezium.data.Uuid", "io.debezium.data.Json", "io.debezium.data.Enum", "io.debezium.data.Xml"}
CONNECT_PRIMITIVES = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float32": "float",
                      "float64": "double", "boolean": "boolean", "string": "string", "bytes": "binary"}


def type_of_connect(schema: dict) -> str:
    """Iceberg type of a Kafka Connect field schema (logical names first)."""
    name = schema.get("name")
    params = schema.get("parameters") or {}
    if name == DECIMAL:
        precision = int(params.get("connect.decimal.precision", 38))
        return f"decimal({min(precision, 38)},{int(params.get('scale', 0))})"
    if name == VARIABLE_SCALE_DECIMAL:
        return f"decimal(38,{VARIABLE_SCALE})"
    if name in DATE_NAMES:
        return "date"
    if name in TIME_NAMES:
        return "string"
    if name in TIMESTAMP_NAMES:
        return "timestamp"
    if name == ZONED_TIMESTAMP:
        return "timestamptz"
    if name in STRING_NAMES:
        return "string"
    kind = schema.get("type")
    if kind == "struct":
        inner = ",".join(f"{f['field']}:{type_of_connect(f)}" for f in schema.get("fields", []))
        return f"struct<{inner}>" if inner else "string"
    if kind == "array":
        return f"list<{type_of_connect(schema['items'])}>"
    if kind == "map":
        return f"map<{type_of_connect(schema['keys'])},{type_of_connect(schema['values'])}>"
    return CONNECT_PRIMITIVES.get(kind, "string")


def type_of_value(value: Any) -> str | None:
    """Guess from JSON: bool, int -> long, float -> double, dict -> struct, list -> list of the first element."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        fields = [(k, type_of_value(v) or "string") for k, v in value.items()]
        return "struct<" + ",".join(f"{k}:{t}" for k, t in fields) + ">" if fields else "string"
    if isinstance(value, list):
        return f"list<{type_of_value(value[0]) or 'string'}>" if value else "string"
    return "string"


def widest(types: set[str]) -> str:
    """One type for a field seen with several (long+double -> double; anything else mixed -> string)."""
    if len(types) == 1:
        return next(iter(types))
    if types <= {"int", "long"}:
        return "long"
    if types <= {"int", "long", "float", "double"}:
        return "double"
    return "string"


def split_top(text: str, sep: str = ",") -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


_PRIMITIVE_DDL = {"boolean": "boolean", "int": "int", "integer": "int", "long": "bigint", "bigint": "bigint",
                  "float": "float", "double": "double", "date": "date", "timestamp": "timestamp_ntz",
                  "timestamp_ntz": "timestamp_ntz", "timestamptz": "timestamp", "string": "string",
                  "uuid": "string", "binary": "binary"}


def spark_ddl(iceberg_type: str, where: str = "") -> str:
    """Spark DDL for an Iceberg type string (used for CREATE TABLE / ADD COLUMN)."""
    t = iceberg_type.strip()
    low = t.lower()
    if low in _PRIMITIVE_DDL:
        return _PRIMITIVE_DDL[low]
    if low.startswith("decimal(") or low.startswith("fixed["):
        return t if low.startswith("decimal(") else "binary"
    if low.startswith("struct<") and t.endswith(">"):
        fields = []
        for part in split_top(t[7:-1]):
            name, _, inner = part.partition(":")
            fields.append(f"`{name.strip()}`: {spark_ddl(inner, where)}")
        return "struct<" + ", ".join(fields) + ">"
    if low.startswith("list<") and t.endswith(">"):
        return f"array<{spark_ddl(t[5:-1], where)}>"
    if low.startswith("map<") and t.endswith(">"):
        key, value = split_top(t[4:-1])
        return f"map<{spark_ddl(key, where)}, {spark_ddl(value, where)}>"
    if low == "time":
        raise SchemaDeclarationError(f"{where}: Spark 3.5 cannot write Iceberg 'time' columns; declare string")
    raise SchemaDeclarationError(f"{where}: unknown Iceberg type {iceberg_type!r}")


def spark_type(iceberg_type: str) -> T.DataType:
    return T._parse_datatype_string(spark_ddl(iceberg_type).replace("`", ""))
