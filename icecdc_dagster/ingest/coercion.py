"""Coerce a decoded JSON/Debezium value to the Spark type of its Iceberg column, or say why not.

Runs in executors. Nothing is ever rounded, truncated or nulled silently: a value that does
not fit its column raises :class:`CoercionError` (the event is dead-lettered with the message
as its reason). When a wider type that Iceberg can promote the column to would hold the value
(int -> long, float -> double, decimal(P,S) -> decimal(P',S)), the error says so in ``widen_to``
and the pipeline widens the column when schema evolution is on.

Declared rules (docs/ingestion.md): numbers from numbers or numeric strings;
a fraction into float/double is the nearest binary value, an integer must be exact; booleans
from bool or "true"/"false"; dates from days or ``YYYY-MM-DD``; timestamps from ISO-8601 or
epoch numbers (millis below 1e14, micros below 1e17, else nanos); binary from base64; a string
column holds the JSON text of a non-string value (counted as ``stringified``); fields a struct
column does not have are counted as ``ignored_fields``.
"""

import base64
import datetime as dt
import json
import math
import struct
from collections import Counter
from decimal import Context, Decimal, InvalidOperation, localcontext
from typing import Any

from pyspark.sql import types as T

from icecdc_dagster.errors import IngestError
from icecdc_dagster.ingest.debezium import NANOS_TRUNCATED, parse_iso_timestamp
from icecdc_dagster.ingest.schema_inference import MAX_DECIMAL_PRECISION

EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)
UTC = dt.UTC
_INT_RANGE = {T.ByteType: 7, T.ShortType: 15, T.IntegerType: 31, T.LongType: 63}
# Enough digits for any decimal(38, 38) operation on a value whose magnitude is checked first.
_EXACT = Context(prec=4 * MAX_DECIMAL_PRECISION)
STRINGIFIED = "stringified"
IGNORED_FIELDS = "ignored_fields"


class CoercionError(IngestError, ValueError):
    """The value does not fit the column; ``widen_to`` is a Spark type that would hold it (or None)."""

    def __init__(self, message: str, widen_to: T.DataType | None = None) -> None:
        super().__init__(message)
        self.widen_to = widen_to


def _epoch(value: int, notes: Counter[str]) -> dt.datetime:
    """Epoch number -> naive UTC datetime: millis below 1e14, micros below 1e17, else nanos."""
    magnitude = abs(value)
    if magnitude < 10**14:
        return EPOCH + dt.timedelta(milliseconds=value)
    if magnitude < 10**17:
        return EPOCH + dt.timedelta(microseconds=value)
    micros, nanos = divmod(value, 1000)
    if nanos:
        notes[NANOS_TRUNCATED] += 1
    return EPOCH + dt.timedelta(microseconds=micros)


def _number(value: Any) -> Decimal:
    if isinstance(value, bool):
        raise CoercionError("boolean is not a number")
    if isinstance(value, float):
        return Decimal(value)  # exact binary value
    if isinstance(value, (int, Decimal)):
        return Decimal(value)
    if isinstance(value, str):
        try:
            return Decimal(value.strip())
        except InvalidOperation as exc:
            raise CoercionError(f"{value!r} is not numeric") from exc
    raise CoercionError(f"{value!r} is not a number")


def _integral(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    d = _number(value)
    if not d.is_finite() or d != d.to_integral_value(context=_EXACT):
        raise CoercionError(f"{value!r} is not an integer")
    return int(d)


def _float(value: Any, single: bool) -> float:
    kind = "float" if single else "double"
    if isinstance(value, float):
        result = value
    else:
        d = _number(value)
        result = float(d)
        if d.is_finite() and not math.isfinite(result):
            raise CoercionError(f"{value!r} is out of range for {kind}")
        if isinstance(value, int) and Decimal(result) != d:  # JSON integers must be exact; fractions: nearest
            raise CoercionError(f"{value!r} is not exactly representable as {kind}")
    if single and math.isfinite(result):
        narrowed = struct.unpack("f", struct.pack("f", result))[0] if abs(result) <= 3.4028234663852886e38 else None
        if narrowed is None or not math.isfinite(narrowed):
            raise CoercionError(f"{value!r} is out of range for float", T.DoubleType())
        if isinstance(value, int) and narrowed != result:
            raise CoercionError(f"{value!r} is not exactly representable as float", T.DoubleType())
    return result


def _decimal(value: Any, dtype: T.DecimalType) -> Decimal:
    d = _number(value)
    if not d.is_finite():
        raise CoercionError(f"{value!r} is not a finite decimal")
    scale, precision = dtype.scale, dtype.precision
    with localcontext(_EXACT):
        integer_digits = max(d.adjusted() + 1, 0) if d else 0
        if integer_digits > MAX_DECIMAL_PRECISION:
            raise CoercionError(f"{value!r} has more than {MAX_DECIMAL_PRECISION} integer digits")
        quantized = d.quantize(Decimal(1).scaleb(-scale))
        if quantized != d:
            raise CoercionError(f"{value!r} does not fit decimal({precision},{scale}) exactly: more than {scale} "
                                "fractional digits")
    needed = integer_digits + scale
    if needed > precision:
        wider = T.DecimalType(needed, scale) if needed <= MAX_DECIMAL_PRECISION else None
        raise CoercionError(f"{value!r} does not fit decimal({precision},{scale}): it needs {needed} digits", wider)
    return quantized


def _json_text(value: Any) -> str:
    """Compact JSON text; decimals as JSON numbers exactly as decoded."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, Decimal)):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_json_text(str(k))}:{_json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    if isinstance(value, bytes):
        return _json_text(base64.b64encode(value).decode())
    if isinstance(value, (dt.date, dt.time)):
        return _json_text(value.isoformat())
    raise CoercionError(f"{value!r} has no JSON text")


def _string(value: Any, notes: Counter[str]) -> str:
    if isinstance(value, str):
        return value
    notes[STRINGIFIED] += 1
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return _json_text(value)


def _timestamp(value: Any, aware: bool, notes: Counter[str]) -> dt.datetime:
    if isinstance(value, bool):
        raise CoercionError("boolean is not a timestamp")
    if isinstance(value, dt.datetime):
        ts = value
    elif isinstance(value, dt.date):
        raise CoercionError(f"{value!r} is a date, not a timestamp")
    elif isinstance(value, (int, Decimal)):
        ts = _epoch(_integral(value), notes)
    elif isinstance(value, str):
        try:
            ts = parse_iso_timestamp(value, notes)
        except ValueError:
            ts = _epoch(_integral(value), notes)
    else:
        raise CoercionError(f"{value!r} is not a timestamp")
    if aware:
        return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
    return ts.astimezone(UTC).replace(tzinfo=None) if ts.tzinfo is not None else ts


def _date(value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        if value.time() != dt.time(0) or value.tzinfo is not None:
            raise CoercionError(f"{value!r} has a time of day; a date column would drop it")
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return EPOCH_DATE + dt.timedelta(days=value)
    if isinstance(value, str):
        return dt.date.fromisoformat(value.strip())
    raise CoercionError(f"{value!r} is not a date")


def coerce(value: Any, dtype: T.DataType, notes: Counter[str] | None = None) -> Any:
    """``value`` as the Python value Spark expects for ``dtype``; CoercionError when it cannot be exact.

    ``notes`` counts applications of declared rules (stringified values, ignored struct fields,
    truncated nanoseconds).
    """
    if value is None:
        return None
    notes = notes if notes is not None else Counter()
    try:
        if isinstance(dtype, T.StringType):
            return _string(value, notes)
        if isinstance(dtype, T.IntegralType) and type(dtype) in _INT_RANGE:
            n = _integral(value)
            bits = _INT_RANGE[type(dtype)]
            if not -(1 << bits) <= n < (1 << bits):
                wider = T.LongType() if isinstance(dtype, T.IntegerType) and -(1 << 63) <= n < (1 << 63) else None
                raise CoercionError(f"{n} is out of range for {dtype.simpleString()}", wider)
            return n
        if isinstance(dtype, (T.DoubleType, T.FloatType)):
            return _float(value, isinstance(dtype, T.FloatType))
        if isinstance(dtype, T.DecimalType):
            return _decimal(value, dtype)
        if isinstance(dtype, T.BooleanType):
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
            raise CoercionError(f"{value!r} is not a boolean")
        if isinstance(dtype, T.DateType):
            return _date(value)
        if isinstance(dtype, T.TimestampType):
            return _timestamp(value, True, notes)
        if isinstance(dtype, T.TimestampNTZType):
            return _timestamp(value, False, notes)
        if isinstance(dtype, T.BinaryType):
            if isinstance(value, (bytes, bytearray)):
                return bytes(value)
            if isinstance(value, str):
                return base64.b64decode(value, validate=True)
            raise CoercionError(f"{value!r} is not base64 bytes")
        if isinstance(dtype, T.StructType):
            if not isinstance(value, dict):
                raise CoercionError(f"{value!r} is not an object")
            names = {f.name for f in dtype.fields}
            notes[IGNORED_FIELDS] += sum(1 for k in value if k not in names)
            return tuple(_nested(value.get(f.name), f.dataType, notes, f.name) for f in dtype.fields)
        if isinstance(dtype, T.ArrayType):
            if not isinstance(value, list):
                raise CoercionError(f"{value!r} is not a list")
            return [_nested(v, dtype.elementType, notes, "[]") for v in value]
        if isinstance(dtype, T.MapType):
            if not isinstance(value, dict):
                raise CoercionError(f"{value!r} is not an object")
            out = {_nested(k, dtype.keyType, notes, "key"): _nested(v, dtype.valueType, notes, str(k))
                   for k, v in value.items()}
            if len(out) != len(value):
                raise CoercionError(f"map keys {list(value)!r} collide as {dtype.keyType.simpleString()}")
            return out
    except CoercionError:
        raise
    except (ValueError, TypeError, ArithmeticError, OverflowError) as exc:
        raise CoercionError(f"{value!r} cannot be read as {dtype.simpleString()}: {exc}") from exc
    raise CoercionError(f"unsupported column type {dtype.simpleString()}")


def _nested(value: Any, dtype: T.DataType, notes: Counter[str], where: str) -> Any:
    """Coerce inside a struct/list/map: nested columns are not widened, so a misfit is a plain error."""
    try:
        return coerce(value, dtype, notes)
    except CoercionError as exc:
        raise CoercionError(f"{where}: {exc}") from exc
