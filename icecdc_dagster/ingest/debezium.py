"""Debezium envelopes: one JSON line -> operation, row image, field types, source position.

Accepts the JSON converter's ``{"schema": ..., "payload": {...}}`` and the bare payload;
``null`` lines are tombstones. When the schema block is present its logical types are
decoded exactly as the type table in :mod:`schema_inference` says (docs/ingestion.md lists it).
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
from enum import Enum
from typing import Any, assert_never

from icecdc_dagster.errors import IngestError
from icecdc_dagster.ingest import schema_inference as si

INSERT, UPDATE, DELETE = "insert", "update", "delete"
OPS = {"c": INSERT, "r": INSERT, "i": INSERT, "insert": INSERT, "create": INSERT, "index": INSERT,
        "u": UPDATE, "update": UPDATE, "d": DELETE, "delete": DELETE}
EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)
NANOS_TRUNCATED = "nanos_truncated"
_ISO_FRACTION = re.compile(r"(\.\d+)")
_TIME_OF_DAY = re.compile(r"^\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:?\d{2})?$")


class EventError(IngestError, ValueError):
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
    mapped = OPS.get(str(op).lower()) if op is not None else None
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


def _from_epoch(value: Any, per_second: int, notes: Counter[str]) -> dt.datetime:
    n = _integer(value)
    micros, sub = divmod(n * 10**6, per_second)
    if sub:
        notes[NANOS_TRUNCATED] += 1
    return EPOCH + dt.timedelta(microseconds=micros)


def parse_iso_timestamp(value: Any, notes: Counter[str]) -> dt.datetime:
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


def _decimal(value: Any, kind: str | None, params: dict[str, Any]) -> Decimal:
    if isinstance(value, str) and kind == "bytes":
        return _scaled(_unscaled(value), int(params.get("scale", 0)))
    if isinstance(value, bool):
        raise ValueError("boolean is not a number")
    if isinstance(value, (int, Decimal)):  # JsonConverter decimal.format=NUMERIC
        return Decimal(value)
    if isinstance(value, str):
        return Decimal(value.strip())
    raise ValueError("not a decimal")


class Logical(Enum):
    """How :func:`decode` turns the value of a Connect/Debezium logical type into a Python value (one arm of
    :func:`_logical` each; :mod:`native` has twins of some)."""

    DECIMAL = "decimal"                  # base64 of the big-endian unscaled value (or a JSON number, a numeric string)
    VARIABLE_SCALE_DECIMAL = "variable_scale_decimal"  # {"scale": s, "value": base64 of the unscaled value}
    EPOCH_DAYS = "epoch_days"            # days since 1970-01-01
    ISO_DATE = "iso_date"                # ISO-8601 date text
    MILLIS_OF_DAY = "millis_of_day"      # -> "HH:MM:SS.ffffff"
    MICROS_OF_DAY = "micros_of_day"      # -> "HH:MM:SS.ffffff"
    NANOS_OF_DAY = "nanos_of_day"        # -> "HH:MM:SS.fffffffff"
    ISO_TIME = "iso_time"                # ISO-8601 time of day, kept as (checked) text
    EPOCH_MILLIS = "epoch_millis"        # since 1970-01-01T00:00 UTC
    EPOCH_MICROS = "epoch_micros"
    EPOCH_NANOS = "epoch_nanos"          # digits below the microsecond are dropped and counted
    ISO = "iso"                          # ISO-8601 timestamp, naive meaning UTC
    ZONED = "zoned"                      # ISO-8601 timestamp with an offset
    UUID = "uuid"                        # canonical UUID text


@dataclass(frozen=True)
class LogicalDecoding:
    """How :func:`decode` reads one logical type, and whether the native reader (:mod:`native`) has an exact
    twin of that decoding (without one, schema-block lines with such a field take the Python rules)."""

    kind: Logical
    native: bool = False


# The one list of logical types with a decoding of their own: :func:`decode` and :func:`native.field_decoding`
# both dispatch on it, so a new one is one entry here (+ its arm in :func:`_logical`, and a native twin when
# ``native``). Names not listed here decode as their physical Connect type. Each also needs its Iceberg type in
# :data:`schema_inference.LOGICAL_TYPES` (docs/ingestion.md's type table).
LOGICAL_DECODINGS: dict[str, LogicalDecoding] = {
    si.DECIMAL: LogicalDecoding(Logical.DECIMAL, native=True),
    si.VARIABLE_SCALE_DECIMAL: LogicalDecoding(Logical.VARIABLE_SCALE_DECIMAL),
    "org.apache.kafka.connect.data.Date": LogicalDecoding(Logical.EPOCH_DAYS, native=True),
    "io.debezium.time.Date": LogicalDecoding(Logical.EPOCH_DAYS, native=True),
    "io.debezium.time.IsoDate": LogicalDecoding(Logical.ISO_DATE),
    "org.apache.kafka.connect.data.Time": LogicalDecoding(Logical.MILLIS_OF_DAY),
    "io.debezium.time.Time": LogicalDecoding(Logical.MILLIS_OF_DAY),
    "io.debezium.time.MicroTime": LogicalDecoding(Logical.MICROS_OF_DAY),
    "io.debezium.time.NanoTime": LogicalDecoding(Logical.NANOS_OF_DAY),
    "io.debezium.time.ZonedTime": LogicalDecoding(Logical.ISO_TIME),
    "io.debezium.time.IsoTime": LogicalDecoding(Logical.ISO_TIME),
    "org.apache.kafka.connect.data.Timestamp": LogicalDecoding(Logical.EPOCH_MILLIS, native=True),
    "io.debezium.time.Timestamp": LogicalDecoding(Logical.EPOCH_MILLIS, native=True),
    "io.debezium.time.MicroTimestamp": LogicalDecoding(Logical.EPOCH_MICROS, native=True),
    "io.debezium.time.NanoTimestamp": LogicalDecoding(Logical.EPOCH_NANOS, native=True),
    "io.debezium.time.IsoTimestamp": LogicalDecoding(Logical.ISO, native=True),
    si.ZONED_TIMESTAMP: LogicalDecoding(Logical.ZONED, native=True),
    "io.debezium.data.Uuid": LogicalDecoding(Logical.UUID),
}


def logical_decoding(name: Any) -> LogicalDecoding | None:
    """The entry of a field schema's ``name`` in :data:`LOGICAL_DECODINGS` (None: decoded by its physical type)."""
    return LOGICAL_DECODINGS.get(name)


def _logical(kind: Logical, value: Any, physical: str | None, params: dict[str, Any], notes: Counter[str]) -> Any:
    """Decode a value of a logical type (``physical``: its Connect type, ``params``: its schema parameters)."""
    match kind:
        case Logical.DECIMAL:
            return _decimal(value, physical, params)
        case Logical.VARIABLE_SCALE_DECIMAL:
            return _scaled(_unscaled(value["value"]), _integer(value["scale"]))
        case Logical.EPOCH_DAYS:
            return EPOCH_DATE + dt.timedelta(days=_integer(value))
        case Logical.ISO_DATE:
            return dt.date.fromisoformat(value.strip().rstrip("Zz"))
        case Logical.MILLIS_OF_DAY:
            return _time_string(_integer(value) * 10**6, 6)
        case Logical.MICROS_OF_DAY:
            return _time_string(_integer(value) * 1000, 6)
        case Logical.NANOS_OF_DAY:
            return _time_string(_integer(value), 9)
        case Logical.ISO_TIME:
            if not isinstance(value, str) or not _TIME_OF_DAY.match(value.strip()):
                raise ValueError("not an ISO-8601 time")
            return value.strip()
        case Logical.EPOCH_MILLIS:
            return _from_epoch(value, 1000, notes)
        case Logical.EPOCH_MICROS:
            return _from_epoch(value, 10**6, notes)
        case Logical.EPOCH_NANOS:
            return _from_epoch(value, 10**9, notes)
        case Logical.ISO:
            parsed = parse_iso_timestamp(value, notes)
            return parsed.astimezone(dt.UTC).replace(tzinfo=None) if parsed.tzinfo else parsed
        case Logical.ZONED:
            parsed = parse_iso_timestamp(value, notes)
            if parsed.tzinfo is None:
                raise ValueError("no UTC offset")
            return parsed
        case Logical.UUID:
            if not isinstance(value, str):  # uuid.UUID(1) raises AttributeError, which would fail the batch
                raise ValueError("not a string")
            return str(uuid.UUID(value))
        case _:
            assert_never(kind)


def decode(value: Any, schema: dict[str, Any] | None, path: str, notes: Counter[str] | None = None) -> Any:
    """A JSON value -> Python value per its Connect schema (logical types decoded)."""
    if value is None or not schema:
        return value
    notes = notes if notes is not None else Counter()
    name, kind = schema.get("name"), schema.get("type")
    params = schema.get("parameters") or {}
    try:
        logical = logical_decoding(name)
        if logical is not None:
            return _logical(logical.kind, value, kind, params, notes)
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


_INTEGER_PARAMETERS = ("scale", "connect.decimal.precision")


def schema_problem(node: Any, path: str = "schema") -> str | None:
    """What makes a Kafka Connect schema block unreadable by these rules, or None.

    The rules index into the block (``fields``, ``field``, ``type``, ``name``, ``parameters``, ``items``,
    ``keys`` / ``values``); a block of another shape makes its event a dead letter with this reason,
    instead of an error that fails the whole batch."""
    if not isinstance(node, dict):
        return f"{path} is not a JSON object"
    for key in ("type", "name", "field"):
        if node.get(key) is not None and not isinstance(node[key], str):
            return f"{path}.{key} is not a string"
    parameters = node.get("parameters")
    if parameters is not None and not (isinstance(parameters, dict)
                                       and all(isinstance(v, str | int | float) for v in parameters.values())):
        return f"{path}.parameters is not an object of strings"
    for key in _INTEGER_PARAMETERS:
        if parameters and key in parameters and not re.fullmatch(r"-?\d+", str(parameters[key])):
            return f"{path}.parameters.{key} is not an integer"
    fields = node.get("fields")
    if fields is not None and not isinstance(fields, list):
        return f"{path}.fields is not a list"
    children = [(f"{path}.fields[{i}]", f) for i, f in enumerate(fields or [])]
    children += [(f"{path}.{key}", node[key]) for key in ("items", "keys", "values") if node.get(key) is not None]
    for child_path, child in children:
        problem = schema_problem(child, child_path)
        if problem is not None:
            return problem
    return None


def _field_schema(envelope_schema: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
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
    problem = schema_problem(schema) if schema is not None else None
    if problem is not None:
        raise EventError(f"malformed schema block: {problem}")
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
    notes: Counter[str] = Counter()
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
