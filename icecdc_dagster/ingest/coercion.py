"""Coerce a decoded JSON/Debezium value to the Spark type of its Iceberg column, or say why not.

Runs in executors. Numbers from numbers or numeric strings, exact decimals, booleans
from bool or "true"/"false", dates/timestamps from ISO-8601 or epoch units (Debezium
conventions: dates in days; timestamps in millis, micros or nanos by magnitude),
binary from base64, structs/lists/maps recursively.
"""

import base64
import datetime as dt
import json
from decimal import Decimal, InvalidOperation
from typing import Any

from pyspark.sql import types as T

EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)
UTC = dt.timezone.utc
_INT_RANGE = {T.ByteType: 7, T.ShortType: 15, T.IntegerType: 31, T.LongType: 63}


class CoercionError(ValueError):
    pass


def _epoch(value: int) -> dt.datetime:
    """Epoch number -> naive UTC datetime: millis below 1e14, micros below 1e17, else nanos."""
    magnitude = abs(value)
    if magnitude < 10**14:
        return EPOCH + dt.timedelta(milliseconds=value)
    if magnitude < 10**17:
        return EPOCH + dt.timedelta(microseconds=value)
    return EPOCH + dt.timedelta(microseconds=value // 1000)


def _integral(value: Any) -> int:
    if isinstance(value, bool):
        raise CoercionError("boolean is not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (str, Decimal)):
        try:
            d = Decimal(str(value).strip())
        except InvalidOperation as exc:
            raise CoercionError(f"{value!r} is not numeric") from exc
        if d == d.to_integral_value():
            return int(d)
    raise CoercionError(f"{value!r} is not an integer")


def _timestamp(value: Any, aware: bool) -> dt.datetime:
    if isinstance(value, bool):
        raise CoercionError("boolean is not a timestamp")
    if isinstance(value, dt.datetime):
        ts = value
    elif isinstance(value, int):
        ts = _epoch(value)
    elif isinstance(value, str):
        try:
            ts = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            ts = _epoch(_integral(value))
    else:
        raise CoercionError(f"{value!r} is not a timestamp")
    if aware:
        return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts
    return ts.astimezone(UTC).replace(tzinfo=None) if ts.tzinfo is not None else ts


def coerce(value: Any, dtype: T.DataType) -> Any:
    """``value`` as the Python value Spark expects for ``dtype``; CoercionError when it cannot be exact."""
    if value is None:
        return None
    try:
        if isinstance(dtype, T.StringType):
            if isinstance(value, str):
                return value
            if isinstance(value, (dict, list)):
                return json.dumps(value, default=str, separators=(",", ":"))
            if isinstance(value, bool):
                return "true" if value else "false"
            if isinstance(value, bytes):
                return base64.b64encode(value).decode()
            return value.isoformat() if isinstance(value, (dt.date, dt.time)) else str(value)
        if type(dtype) in _INT_RANGE:
            n = _integral(value)
            bits = _INT_RANGE[type(dtype)]
            if not -(1 << bits) <= n < (1 << bits):
                raise CoercionError(f"{n} is out of range for {dtype.simpleString()}")
            return n
        if isinstance(dtype, (T.DoubleType, T.FloatType)):
            if isinstance(value, bool):
                raise CoercionError("boolean is not a number")
            return float(value)
        if isinstance(dtype, T.DecimalType):
            if isinstance(value, bool):
                raise CoercionError("boolean is not a number")
            d = Decimal(repr(value)) if isinstance(value, float) else Decimal(str(value).strip())
            q = d.quantize(Decimal(1).scaleb(-dtype.scale))
            if q != d or len(q.as_tuple().digits) > dtype.precision:
                raise CoercionError(f"{value!r} does not fit decimal({dtype.precision},{dtype.scale}) exactly")
            return q
        if isinstance(dtype, T.BooleanType):
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
            raise CoercionError(f"{value!r} is not a boolean")
        if isinstance(dtype, T.DateType):
            if isinstance(value, dt.datetime):
                return value.date()
            if isinstance(value, dt.date):
                return value
            if isinstance(value, int) and not isinstance(value, bool):
                return EPOCH_DATE + dt.timedelta(days=value)
            if isinstance(value, str):
                return dt.date.fromisoformat(value.strip()[:10]) if len(value.strip()) >= 10 else dt.date.fromisoformat(value)
            raise CoercionError(f"{value!r} is not a date")
        if isinstance(dtype, T.TimestampType):
            return _timestamp(value, aware=True)
        if isinstance(dtype, T.TimestampNTZType):
            return _timestamp(value, aware=False)
        if isinstance(dtype, T.BinaryType):
            if isinstance(value, (bytes, bytearray)):
                return bytes(value)
            if isinstance(value, str):
                return base64.b64decode(value, validate=True)
            raise CoercionError(f"{value!r} is not base64 bytes")
        if isinstance(dtype, T.StructType):
            if not isinstance(value, dict):
                raise CoercionError(f"{value!r} is not an object")
            return tuple(coerce(value.get(f.name), f.dataType) for f in dtype.fields)
        if isinstance(dtype, T.ArrayType):
            if not isinstance(value, list):
                raise CoercionError(f"{value!r} is not a list")
            return [coerce(v, dtype.elementType) for v in value]
        if isinstance(dtype, T.MapType):
            if not isinstance(value, dict):
                raise CoercionError(f"{value!r} is not an object")
            return {coerce(k, dtype.keyType): coerce(v, dtype.valueType) for k, v in value.items()}
    except CoercionError:
        raise
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise CoercionError(f"{value!r} cannot be read as {dtype.simpleString()}: {exc}") from exc
    raise CoercionError(f"unsupported column type {dtype.simpleString()}")
