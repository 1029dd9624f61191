"""Iceberg schema -> OpenSearch mappings, and the additions schema evolution needs.

The mapping follows how :mod:`.documents` renders values as JSON: decimals are
strings (keyword, full precision), binary is base64, temporal values are
ISO-8601 strings.
"""

from typing import Any

from pyiceberg import types as it
from pyiceberg.schema import Schema

DATE_FORMAT = "strict_date_optional_time||epoch_millis"
TEXT_WITH_KEYWORD = {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}}
ICEBERG_METADATA_PROPERTIES = {
    "iceberg_operation": {"type": "keyword"},           # the row's change: INSERT / UPDATE_AFTER
    "iceberg_snapshot_operation": {"type": "keyword"},  # the snapshot's: append / overwrite / delete
    "iceberg_table_name": {"type": "keyword"},
    "iceberg_snapshot_id": {"type": "long"},
}

_PRIMITIVES: dict[type, dict[str, Any]] = {
    it.BooleanType: {"type": "boolean"},
    it.IntegerType: {"type": "long"},
    it.LongType: {"type": "long"},
    it.FloatType: {"type": "double"},
    it.DoubleType: {"type": "double"},
    it.StringType: TEXT_WITH_KEYWORD,
    it.UUIDType: TEXT_WITH_KEYWORD,
    it.DateType: {"type": "date", "format": DATE_FORMAT},
    it.TimestampType: {"type": "date", "format": DATE_FORMAT},
    it.TimestamptzType: {"type": "date", "format": DATE_FORMAT},
    it.TimestampNanoType: {"type": "date_nanos", "format": DATE_FORMAT},
    it.TimestamptzNanoType: {"type": "date_nanos", "format": DATE_FORMAT},
    it.TimeType: {"type": "keyword"},
    it.BinaryType: {"type": "binary"},
    it.FixedType: {"type": "binary"},
    it.DecimalType: {"type": "keyword"},
}


def field_mapping(field_type: it.IcebergType) -> dict[str, Any] | None:
    """The mapping of one Iceberg type; None when no mapping is needed (unknown type)."""
    if isinstance(field_type, it.StructType):
        properties = {f.name: m for f in field_type.fields if (m := field_mapping(f.field_type)) is not None}
        return {"properties": properties}
    if isinstance(field_type, it.ListType):
        # OpenSearch arrays are implicit: a list is mapped as its element.
        return field_mapping(field_type.element_type)
    if isinstance(field_type, it.MapType):
        # Keys are data, not schema: an object whose fields are mapped dynamically.
        return {"type": "object", "dynamic": True}
    for iceberg_type, mapping in _PRIMITIVES.items():
        if isinstance(field_type, iceberg_type):
            return _copy(mapping)
    return None


def iceberg_schema_to_mapping(schema: Schema, include_iceberg_metadata: bool = False) -> dict[str, Any]:
    """The ``mappings`` body for an index holding one document per row of ``schema``."""
    properties = {f.name: m for f in schema.fields if (m := field_mapping(f.field_type)) is not None}
    if include_iceberg_metadata:
        properties.update(_copy(ICEBERG_METADATA_PROPERTIES))
    return {"dynamic": True, "properties": properties}


def missing_properties(wanted: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """The part of ``wanted['properties']`` absent from ``current`` (recursively), for put_mapping.

    Fields already mapped are never changed, whatever their type: OpenSearch
    cannot change a field's type, and a user's mapping wins.
    """
    missing: dict[str, Any] = {}
    have = current.get("properties", {}) or {}
    for name, spec in (wanted.get("properties") or {}).items():
        if name not in have:
            missing[name] = _copy(spec)
        elif "properties" in spec and ("properties" in have[name] or have[name].get("type") in (None, "object")):
            sub = missing_properties(spec, have[name])
            if sub:
                missing[name] = {"properties": sub}
    return missing


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value
