"""Debezium envelopes: one JSON line -> operation, row image, field types, source position.

Accepts the JSON converter's ``{"schema": ..., "payload": {...}}`` and the bare payload;
``null`` lines are tombstones. When the schema block is present its logical types are
honoured (Decimal bytes, epoch dates/times/timestamps, ZonedTimestamp, Uuid, Json,
VariableScaleDecimal, base64 bytes) and give the field types.
"""

import base64
import datetime as dt
import json
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from icecdc_dagster.ingest import schema_inference as si

INSERT, UPDATE, DELETE = "insert", "update", "delete"
_OPS = {"c": INSERT, "r": INSERT, "i": INSERT, "insert": INSERT, "create": INSERT, "index": INSERT,
        "u": UPDATE, "update": UPDATE, "d": DELETE, "delete": DELETE}
EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)


class EventError(ValueError):
    """This event cannot be ingested; the message is the dead-letter reason."""


@dataclass(frozen=True)
class Envelope:
    op: str
    image: dict[str, Any]
    field_types: dict[str, str]
    source: dict[str, Any]
    payload: dict[str, Any]


def map_op(op: Any) -> str:
    mapped = _OPS.get(str(op).lower()) if op is not None else None
    if mapped is None:
        raise EventError(f"unknown op {op!r}")
    return mapped


def _time_string(micros_of_day: int) -> str:
    return (dt.datetime.min + dt.timedelta(microseconds=micros_of_day)).time().isoformat(timespec="microseconds")


def _unscaled(value: Any) -> int:
    return int.from_bytes(base64.b64decode(value, validate=True), "big", signed=True)


def decode(value: Any, schema: dict | None, path: str) -> Any:
    """A JSON value -> Python value per its Connect schema (logical types decoded)."""
    if value is None or not schema:
        return value
    name, kind = schema.get("name"), schema.get("type")
    params = schema.get("parameters") or {}
    try:
        if name == si.DECIMAL:
            if isinstance(value, str) and kind != "bytes":
                return Decimal(value)
            if isinstance(value, (int, float)):
                return Decimal(str(value))
            return Decimal(_unscaled(value)).scaleb(-int(params.get("scale", 0)))
        if name == si.VARIABLE_SCALE_DECIMAL:
            return Decimal(_unscaled(value["value"])).scaleb(-int(value["scale"]))
        if name in si.DATE_NAMES:
            return EPOCH_DATE + dt.timedelta(days=int(value))
        if name in ("io.debezium.time.Time", "org.apache.kafka.connect.data.Time"):
            return _time_string(int(value) * 1000)
        if name == "io.debezium.time.MicroTime":
            return _time_string(int(value))
        if name == "io.debezium.time.NanoTime":
            return _time_string(int(value) // 1000)
        if name in ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp"):
            return EPOCH + dt.timedelta(milliseconds=int(value))
        if name == "io.debezium.time.MicroTimestamp":
            return EPOCH + dt.timedelta(microseconds=int(value))
        if name == "io.debezium.time.NanoTimestamp":
            return EPOCH + dt.timedelta(microseconds=int(value) // 1000)
        if name == si.ZONED_TIMESTAMP:
            parsed = dt.datetime.fromisoformat(value)
            if parsed.tzinfo is None:
                raise ValueError("no offset")
            return parsed
        if name == "io.debezium.data.Uuid":
            return str(uuid.UUID(value))
        if kind == "bytes" and isinstance(value, str):
            return base64.b64decode(value, validate=True)
        if kind == "struct" and isinstance(value, dict):
            fields = {f["field"]: f for f in schema.get("fields", [])}
            return {k: decode(v, fields.get(k), f"{path}.{k}") for k, v in value.items()}
        if kind == "array" and isinstance(value, list):
            return [decode(v, schema.get("items"), f"{path}[]") for v in value]
        if kind == "map" and isinstance(value, dict):
            return {k: decode(v, schema.get("values"), f"{path}.{k}") for k, v in value.items()}
    except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
        raise EventError(f"field {path}: value {value!r} is not a valid {name or kind}: {exc}") from exc
    return value


def _field_schema(envelope_schema: dict | None, name: str) -> dict | None:
    if not envelope_schema:
        return None
    for f in envelope_schema.get("fields", []):
        if f.get("field") == name:
            return f
    return None


def parse_line(line: str) -> Envelope | None:
    """One landing line -> Envelope; ``None`` for a tombstone or blank line; EventError for a bad event."""
    text = line.strip()
    if not text or text == "null":
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EventError(f"malformed JSON: {exc.msg} at column {exc.colno}") from exc
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise EventError("event is not a JSON object")
    schema = doc.get("schema") if "payload" in doc else None
    payload = doc["payload"] if "payload" in doc else doc
    if payload is None:
        return None
    if not isinstance(payload, dict):
        raise EventError("payload is not a JSON object")
    op = map_op(payload.get("op"))
    side = "before" if op == DELETE else "after"
    raw_image = payload.get(side)
    if not isinstance(raw_image, dict):
        raise EventError(f"op {payload.get('op')!r} without a '{side}' row image")
    image_schema = _field_schema(schema, side)
    if image_schema:
        fields = {f["field"]: f for f in image_schema.get("fields", [])}
        image = {k: decode(v, fields.get(k), k) for k, v in raw_image.items()}
        field_types = {k: si.type_of_connect(f) for k, f in fields.items()}
    else:
        image = raw_image
        field_types = {k: t for k, t in ((k, si.type_of_value(v)) for k, v in raw_image.items()) if t}
    source = payload.get("source") if isinstance(payload.get("source"), dict) else {}
    return Envelope(op, image, field_types, source, payload)
