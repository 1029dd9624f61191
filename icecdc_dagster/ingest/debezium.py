"""Debezium envelopes: one JSON line -> operation, row image, field types, source position.

Accepts the JSON converter's ``{"schema": ..., "payload": {...}}`` and the bare payload;
``null`` lines are tombstones. When the schema block is present its logical types are
decoded exactly as the type table in :mod:`schema_inference` says (the README lists it).
JSON numbers with a fraction are read as exact decimals, never through a binary float.
Decoding that drops information under a declared rule (nanoseconds below the microsecond
that Iceberg/Spark timestamps hold) is counted in ``Envelope.notes``.
"""

import base64
import datetime as dt
import json
import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from icecdc_dagster.ingest import schema_inference as si

INSERT, UPDATE, DELETE = "insert", "update", "delete"
_OPS = {"c": INSERT, "r": INSERT, "i": INSERT, "insert": INSERT, "create": INSERT, "index": INSERT,
        "u": UPDATE, "update": UPDATE, "d": DELETE, "delete": DELETE}
EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)
NANOS_TRUNCATED = "nanos_truncated"
_ISO_FRACTION = re.compile(r"(\.\d+)")
_TIME_OF_DAY = re.compile(r"^\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:?\d{2})?$")


class EventError(ValueError):
    """This event cannot be ingested; the message is the dead-letter reason."""


@dataclass(frozen=True)
class Envelope:
    op: str
    image: dict[str, Any]
    field_types: dict[str, str]
    source: dict[str, Any]
    payload: dict[str, Any]
    notes: dict[str, int] = field(default_factory=dict)


def map_op(op: Any) -> str:
    mapped = _OPS.get(str(op).lower()) if op is not None else None
    if mapped is None:
        raise EventError(f"unknown op {op!r}")
    return mapped


JSON_DECODER = json.JSONDecoder(parse_float=Decimal)


def loads(text: str) -> Any:
    """JSON with exact numbers: fractions become ``Decimal`` (a 38-digit decimal survives)."""
    return JSON_DECODER.decode(text)


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, Decimal)) or value != int(value):
        raise ValueError("not an integer")
    return int(value)


def _time_string(nanos_of_day: int, digits: int) -> str:
    if not 0 <= nanos_of_day < 86_400 * 10**9:
        raise ValueError("outside 00:00:00..24:00:00")
    seconds, nanos = divmod(nanos_of_day, 10**9)
    hours, rest = divmod(seconds, 3600)
    text = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{text}.{nanos:09d}"[: len(text) + 1 + digits]


def _from_epoch(value: Any, per_second: int, notes: Counter) -> dt.datetime:
    n = _integer(value)
    micros, sub = divmod(n * 10**6, per_second)
    if sub:
        notes[NANOS_TRUNCATED] += 1
    return EPOCH + dt.timedelta(microseconds=micros)


def parse_iso_timestamp(value: Any, notes: Counter) -> dt.datetime:
    """ISO-8601 with any number of fractional digits; digits below the microsecond are dropped and counted."""
    if not isinstance(value, str):
        raise ValueError("not an ISO-8601 string")
    text = value.strip().replace("Z", "+00:00").replace("z", "+00:00")
    match = _ISO_FRACTION.search(text)
    if match and len(match.group(1)) > 7:
        if int(match.group(1)[7:]):
            notes[NANOS_TRUNCATED] += 1
        text = text[: match.start()] + match.group(1)[:7] + text[match.end():]
    return dt.datetime.fromisoformat(text)


def _unscaled(value: Any) -> int:
    return int.from_bytes(base64.b64decode(value, validate=True), "big", signed=True)


def _scaled(unscaled: int, scale: int) -> Decimal:
    """Exact, whatever the number of digits (the string constructor never rounds)."""
    return Decimal(f"{unscaled}E{-scale}")


def _decimal(value: Any, kind: str | None, params: dict) -> Decimal:
    if isinstance(value, str) and kind == "bytes":
        return _scaled(_unscaled(value), int(params.get("scale", 0)))
    if isinstance(value, bool):
        raise ValueError("boolean is not a number")
    if isinstance(value, (int, Decimal)):  # JsonConverter decimal.format=NUMERIC
        return Decimal(value)
    if isinstance(value, str):
        return Decimal(value.strip())
    raise ValueError("not a decimal")


def _logical(name: str, value: Any, kind: str | None, params: dict, notes: Counter) -> Any:
    """Decode a known logical type; ``NotImplemented`` when ``name`` has no special decoding."""
    if name == si.DECIMAL:
        return _decimal(value, kind, params)
    if name == si.VARIABLE_SCALE_DECIMAL:
        return _scaled(_unscaled(value["value"]), _integer(value["scale"]))
    if name in si.DATE_NAMES:
        return EPOCH_DATE + dt.timedelta(days=_integer(value))
    if name == "io.debezium.time.IsoDate":
        return dt.date.fromisoformat(value.strip().rstrip("Zz"))
    if name in ("io.debezium.time.Time", "org.apache.kafka.connect.data.Time"):
        return _time_string(_integer(value) * 10**6, 6)
    if name == "io.debezium.time.MicroTime":
        return _time_string(_integer(value) * 1000, 6)
    if name == "io.debezium.time.NanoTime":
        return _time_string(_integer(value), 9)
    if name in ("io.debezium.time.ZonedTime", "io.debezium.time.IsoTime"):
        if not isinstance(value, str) or not _TIME_OF_DAY.match(value.strip()):
            raise ValueError("not an ISO-8601 time")
        return value.strip()
    if name in ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp"):
        return _from_epoch(value, 1000, notes)
    if name == "io.debezium.time.MicroTimestamp":
        return _from_epoch(value, 10**6, notes)
    if name == "io.debezium.time.NanoTimestamp":
        return _from_epoch(value, 10**9, notes)
    if name == "io.debezium.time.IsoTimestamp":
        parsed = parse_iso_timestamp(value, notes)
        return parsed.astimezone(dt.UTC).replace(tzinfo=None) if parsed.tzinfo else parsed
    if name == si.ZONED_TIMESTAMP:
        parsed = parse_iso_timestamp(value, notes)
        if parsed.tzinfo is None:
            raise ValueError("no UTC offset")
        return parsed
    if name == "io.debezium.data.Uuid":
        return str(uuid.UUID(value))
    return NotImplemented


def decode(value: Any, schema: dict | None, path: str, notes: Counter | None = None) -> Any:
    """A JSON value -> Python value per its Connect schema (logical types decoded)."""
    if value is None or not schema:
        return value
    notes = notes if notes is not None else Counter()
    name, kind = schema.get("name"), schema.get("type")
    params = schema.get("parameters") or {}
    try:
        if name in si.LOGICAL_TYPES:
            decoded = _logical(name, value, kind, params, notes)
            if decoded is not NotImplemented:
                return decoded
        if kind == "bytes":
            return base64.b64decode(value, validate=True)
        if kind == "struct":
            if not isinstance(value, dict):
                raise ValueError("not an object")
            fields = {f["field"]: f for f in schema.get("fields", [])}
            return {k: decode(v, fields.get(k), f"{path}.{k}", notes) for k, v in value.items()}
        if kind == "array":
            if not isinstance(value, list):
                raise ValueError("not a list")
            return [decode(v, schema.get("items"), f"{path}[]", notes) for v in value]
        if kind == "map":
            if not isinstance(value, dict):
                raise ValueError("not an object")
            return {k: decode(v, schema.get("values"), f"{path}.{k}", notes) for k, v in value.items()}
    except EventError:
        raise
    except (ValueError, TypeError, KeyError, ArithmeticError, OverflowError) as exc:
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
        doc = loads(text)
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
    notes: Counter = Counter()
    if image_schema:
        fields = {f["field"]: f for f in image_schema.get("fields", [])}
        try:
            field_types = {k: si.type_of_connect(f, k) for k, f in fields.items()}
        except si.ConnectSchemaError as exc:
            raise EventError(str(exc)) from exc
        image = {k: decode(v, fields.get(k), k, notes) for k, v in raw_image.items()}
    else:
        image = raw_image
        field_types = {k: t for k, t in ((k, si.type_of_value(v)) for k, v in raw_image.items()) if t}
    source: dict[str, Any] = payload["source"] if isinstance(payload.get("source"), dict) else {}
    return Envelope(op, image, field_types, source, payload, dict(notes))
