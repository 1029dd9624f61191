"""One column's value by native rules (Spark column expressions), and whether it provably equals the value the
Python rules (:mod:`debezium`, :mod:`coercion`) give: the guards the package docstring explains."""

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.ingest.native.schema_blocks import Decoding, FieldDecoding

_ISO_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_ISO_TS = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})?$"
_ISO_TS_NAIVE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?$"
# Epoch millis with 9..14 digits: no ISO reading (Python's fromisoformat takes 8 digits as a date),
# below 1e14 (the millis range of the declared rule), no sub-microsecond part.
_EPOCH_MILLIS = r"^-?[0-9]{9,14}$"
_BASE64 = r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
# Text of a non-string JSON token as Spark renders it (numbers, literals, objects, arrays).
_NON_STRING_TEXT = r"^(-?[0-9]|[{\[]|(true|false|NaN|-?Infinity)$)"
_BIG_INTEGER = r"^-?[0-9]{16,}$"
_INTEGER_18 = r"^-?[0-9]{1,18}$"  # always fits a long; longer digit strings: the Python rules say
_INTEGER_9 = r"^-?[0-9]{1,9}$"
_PLAIN_NUMBER = r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$"  # no Java suffixes (1.5d), hex or spaces
# Text of a number token or literal as Spark renders it into a string (Java's double rendering included):
# such a text cannot tell a JSON string from a non-string token, so a decoder that needs a string routes it.
_NOT_A_STRING_TOKEN = r"^(-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?|true|false|NaN|-?Infinity)$|^[{\[]"
_OFFSET_TS = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$"
# Python's datetime range (year 1..9999): epoch values outside it are dead letters by the Python rules.
_MIN_MICROS = (dt.datetime(1, 1, 1) - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
_MAX_MICROS = (dt.datetime(9999, 12, 31, 23, 59, 59, 999999) - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
_MIN_DAYS = (dt.date(1, 1, 1) - dt.date(1970, 1, 1)).days
_MAX_DAYS = (dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days


@dataclass(frozen=True)
class TargetColumn:
    """A column of the target table, as the native rules type it."""

    name: str
    dtype: T.DataType
    nullable: bool


def columns_of(schema: T.StructType) -> list[TargetColumn]:
    return [TargetColumn(f.name, f.dataType, f.nullable) for f in schema.fields]


def utc(spark: Any) -> bool:
    """Whether the session's time zone is UTC: only then is Spark's cast to timestamp_ntz the UTC wall clock."""
    return str(spark.conf.get("spark.sql.session.timeZone", "")).upper() in ("UTC", "Z", "ETC/UTC", "+00:00")


def decimal_is_exact(c: TargetColumn, raw: Column) -> Column | None:
    """For a decimal column: the line writes this field plainly, with at most the column's scale in digits.

    Spark's decimal reader rounds to the scale (HALF_UP) without a word, and the field's text comes back
    re-rendered through a double, so the check reads the line itself: a field written with more fraction
    digits or an exponent (or with an escaped name the check cannot see) goes to the Python rules.
    """
    if not isinstance(c.dtype, T.DecimalType):
        return None
    name = re.escape(json.dumps(c.name))
    value = name + r'\s*:\s*"?\s*[-+]?[0-9]*'
    longer = value + r"\.[0-9]{" + str(c.dtype.scale + 1) + ",}"
    exponent = value + r"\.?[0-9]*[eE]"
    return raw.contains(json.dumps(c.name)) & ~raw.rlike(longer) & ~raw.rlike(exponent)


def _native_value(c: TargetColumn, typed: Column, text: Column, exact_decimal: Column | None, utc_session: bool
                  ) -> tuple[Column, Column]:
    """(value, ok): the column's value by native rules, and whether it provably equals the Python rules' value.

    ``text`` is the field's JSON text (a string token unquoted: for the kinds read from it, a numeric string
    and a number mean the same under the Python rules, so the token kind does not matter there);
    ``typed`` is Spark's typed read, used where the text is not exact (decimals: numbers come back
    re-rendered through a double) or the token kind matters (binary: only a JSON string is base64).
    A null text (JSON null or no such field) is always ok: the value is null.
    """
    dtype = c.dtype
    value: Column = typed
    if isinstance(dtype, T.StringType):
        value, ok = text, ~text.rlike(_NON_STRING_TEXT)
    elif isinstance(dtype, T.LongType):
        value = F.when(text.rlike(_INTEGER_18), text.cast("long"))
        ok = value.isNotNull()
    elif isinstance(dtype, T.IntegerType):
        value = F.when(text.rlike(_INTEGER_9), text.cast("int"))
        ok = value.isNotNull()
    elif isinstance(dtype, T.BooleanType):
        value = F.when(text == "true", F.lit(True)).when(text == "false", F.lit(False))
        ok = value.isNotNull()
    elif isinstance(dtype, T.DoubleType):
        value = F.when(text.rlike(_PLAIN_NUMBER) & ~text.rlike(_BIG_INTEGER), text.cast("double"))
        ok = value.isNotNull() & ~F.isnan(value) & (F.abs(value) != F.lit(float("inf")))
    elif isinstance(dtype, T.DecimalType):
        assert exact_decimal is not None
        ok = typed.isNotNull() & exact_decimal & ~text.contains(",")
    elif isinstance(dtype, T.DateType):
        value = F.when(text.rlike(_ISO_DATE), text.cast("date"))
        ok = value.isNotNull()
    elif isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
        iso = text.rlike(_ISO_TS) if utc_session else (text.rlike(_ISO_TS) & ~text.rlike(_ISO_TS_NAIVE))
        instant = (F.when(iso, text.cast("timestamp"))
                   .when(text.rlike(_EPOCH_MILLIS), F.timestamp_millis(text.cast("long"))))
        value, ok = _as_column_time(dtype, instant, utc_session)
    elif isinstance(dtype, T.BinaryType):
        value = F.when(text.rlike(_BASE64), F.unbase64(text))
        ok = typed.isNotNull() & value.isNotNull()  # typed: the token is a JSON string
    else:  # float (Python narrows twice), struct, list, map: the Python rules decide
        ok = F.lit(False)
    # the value only where the image has the field by its exact name (the map is exact; a struct field
    # read case-insensitively would not be)
    return F.when(text.isNotNull(), value), text.isNull() | ok


def _as_column_time(dtype: T.DataType, instant: Column, utc_session: bool) -> tuple[Column, Column]:
    """(value, ok) of an instant for a timestamp column. The Python rules give a timestamp_ntz column the
    UTC wall clock, which Spark's cast to timestamp_ntz gives only in a UTC session."""
    if isinstance(dtype, T.TimestampNTZType):
        return instant.cast("timestamp_ntz"), instant.isNotNull() & F.lit(utc_session)
    return instant, instant.isNotNull()


def decoded_value(c: TargetColumn, decoding: FieldDecoding, typed: Column, text: Column,
                   exact_decimal: Column | None, utc_session: bool) -> tuple[Column, Column]:
    """(value, ok) of a schema-block field decoded by :func:`debezium.decode` and coerced to the column.

    ``typed`` is the payload's typed read (decimal/binary as declared, epoch numbers of date/timestamp
    columns as int/long). Only the natural pairs are native (a Decimal into a decimal column, an epoch
    into a timestamp...); any other pair, and any value whose decoding would fail, drop digits or
    leave the Python datetime range, takes the Python rules (ok is false unless the field is absent).
    """
    kind, dtype = decoding.kind, c.dtype
    if kind is Decoding.IDENTITY or (kind is Decoding.BASE64 and isinstance(dtype, T.BinaryType)):
        return _native_value(c, typed, text, exact_decimal, utc_session)
    value: Column | None = None
    ok: Column = F.lit(False)
    timestamp = isinstance(dtype, (T.TimestampType, T.TimestampNTZType))
    if kind is Decoding.DECIMAL and isinstance(dtype, T.DecimalType):
        value, ok = _bytes_decimal(text, decoding.scale, dtype)
    elif kind is Decoding.EPOCH_DAYS and isinstance(dtype, T.DateType):
        ok = typed.between(_MIN_DAYS, _MAX_DAYS)
        value = F.date_add(F.lit(dt.date(1970, 1, 1)), typed)
    elif kind in (Decoding.EPOCH_MILLIS, Decoding.EPOCH_MICROS, Decoding.EPOCH_NANOS) and timestamp:
        per_micro = {Decoding.EPOCH_MILLIS: None, Decoding.EPOCH_MICROS: 1, Decoding.EPOCH_NANOS: 1000}[kind]
        if per_micro is None:
            in_range = typed.between(-(-_MIN_MICROS // 1000), _MAX_MICROS // 1000)
            instant = F.when(in_range, F.timestamp_millis(typed))
        else:  # nanos: exact only without digits below the microsecond (decimal division: no double)
            micros = typed if per_micro == 1 else F.when(
                typed % per_micro == 0, (typed.cast(T.DecimalType(20, 0)) / per_micro).cast("long"))
            instant = F.when(micros.between(_MIN_MICROS, _MAX_MICROS), F.timestamp_micros(micros))
        value, ok = _as_column_time(dtype, instant, utc_session)
    elif kind in (Decoding.ZONED, Decoding.ISO) and timestamp:
        iso = text.rlike(_ISO_TS) if kind is Decoding.ISO and utc_session else text.rlike(_OFFSET_TS)
        value, ok = _as_column_time(dtype, F.when(iso, text.cast("timestamp")), utc_session)
    # a null check (an absent typed value) is "not provable": the line is routed, never dropped
    return (F.when(text.isNotNull(), value if value is not None else F.lit(None)),
            text.isNull() | F.coalesce(ok, F.lit(False)))


def _bytes_decimal(text: Column, scale: int, dtype: T.DecimalType) -> tuple[Column, Column]:
    """A Connect Decimal (base64 of the big-endian two's-complement unscaled value, ``scale`` from the schema)
    into ``dtype``: native up to 8 bytes, and only when exact (``coercion._decimal``: no fraction digit
    beyond the column's scale, the integer digits fit its precision)."""
    # Spark's unbase64 fails the task on text that is not base64 (a number, a bad string): decode only
    # what the pattern accepts; anything else is null here and routed to the Python rules.
    well_formed = text.rlike(_BASE64) & ~text.rlike(_NOT_A_STRING_TOKEN)
    unscaled_bytes = F.unbase64(F.when(well_formed, text))
    digits = F.hex(unscaled_bytes)
    negative = digits.substr(1, 1).isin(*"89ABCDEF")
    unscaled_text = F.conv(F.when(negative, F.lpad(digits, 16, "F")).otherwise(F.lpad(digits, 16, "0")), 16, -10)
    unscaled = unscaled_text.cast("long")
    ok = well_formed & (F.length(unscaled_bytes) <= 8) & unscaled.isNotNull()
    magnitude_digits = dtype.precision - dtype.scale + scale  # |value| < 10^(P-S)  <=>  |unscaled| < 10^this
    if magnitude_digits < 19:
        ok = ok & (unscaled > -(10 ** magnitude_digits)) & (unscaled < 10 ** magnitude_digits)
    dropped = scale - dtype.scale  # fraction digits beyond the column's scale must all be zero
    if dropped >= 19:
        ok = ok & (unscaled == 0)
    elif dropped > 0:
        ok = ok & (unscaled % (10 ** dropped) == 0)
    return F.concat(unscaled_text, F.lit(f"E{-scale}")).cast(dtype), ok
