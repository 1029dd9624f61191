"""Iceberg type strings (``struct<a: int>``, ``map<string, list<long>>``) as Spark DDL, for the tables the
writer creates and the columns it adds; the ingest's schema inference reads the same strings."""

import re

from icecdc_dagster.errors import SchemaDeclarationError

_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)", re.IGNORECASE)
_FIXED = re.compile(r"fixed\[\s*\d+\s*\]", re.IGNORECASE)


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split a type DDL at ``sep`` outside brackets (``struct<a:int,b:int>`` stays one part).

    Raises:
        Nothing of its own: it splits a string.
    """
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
    """Spark DDL for an Iceberg type string (used for CREATE TABLE / ADD COLUMN).

    Raises:
        SchemaDeclarationError: not an Iceberg type this writer can create (names ``where``).
    """
    t = iceberg_type.strip()
    low = t.lower()
    if low in _PRIMITIVE_DDL:
        return _PRIMITIVE_DDL[low]
    if decimal := _DECIMAL.fullmatch(t):  # checked here: a malformed one reached Spark's parser unnamed
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        if not 1 <= precision <= 38 or scale > precision:
            raise SchemaDeclarationError(f"{where}: {iceberg_type!r} needs 1 <= precision <= 38 and scale <= precision")
        return f"decimal({precision},{scale})"
    if _FIXED.fullmatch(t):
        return "binary"
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
