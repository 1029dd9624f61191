"""Debezium lines -> typed table rows with Spark's own JSON reader: no Python per event on the common path.

Every line is read by Spark (``from_json``), typed per the target's columns and checked natively. A
line takes the native path only when the native result is provably the value the exact Python rules
(:mod:`debezium`, :mod:`coercion`) would give; anything else — a value that needs a declared rule
(numeric strings, stringified JSON, epoch heuristics beyond the plain cases), a schema block, a value
that does not fit, malformed JSON — is *routed*, not guessed: those lines go through the Python rules,
which give the value or the dead-letter reason. So both paths always agree, and the Python rules are
paid only for the lines that need them.

Why each guard exists (Spark's JSON reader is more lenient than Python's ``json`` in places):

- number tokens read as text come back re-rendered through a double (``1.10`` -> ``1.1``) and Spark's
  decimal reader rounds to the column's scale silently, so a decimal field is typed natively only when
  the line itself writes it with at most the column's scale in fraction digits and no exponent;
- a JSON integer read as a double is rounded silently above 2^53: such integers go the Python way;
- Spark's decimal reader drops ``,`` from strings (US locale): such strings go the Python way;
- Spark accepts single quotes (turned off here) and ignores text after the first object (``}{``);
- a string column cannot tell ``"5"`` from ``5`` in Spark: numeric-looking text goes the Python way.
"""

import datetime as dt
import itertools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.ingest import debezium, landing
from icecdc_dagster.ingest import schema_inference as si
from icecdc_dagster.ingest.coercion import IGNORED_FIELDS
from icecdc_dagster.ingest.columns import NOTES, RAW, REASON, SOURCE_FILE, SOURCE_OFFSET, TOMBSTONE, WIDEN
from icecdc_dagster.ingest.debezium import DELETE, INSERT, OPS, Logical
from icecdc_dagster.writer.merge import OP_COLUMN, OP_DELETE, OP_INSERT, OP_UPSERT, ORDER_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LINE_SCHEMA = T.StructType([T.StructField("file_index", T.LongType()), T.StructField("source_file", T.StringType()),
                            T.StructField("source_offset", T.LongType()), T.StructField("raw", T.StringType())])
_LINE_ARROW = pa.schema([pa.field("file_index", pa.int64()), pa.field("source_file", pa.string()),
                         pa.field("source_offset", pa.int64()), pa.field("raw", pa.string())])
_RANGE_SCHEMA = T.StructType([T.StructField("file_index", T.LongType()), T.StructField("uri", T.StringType()),
                              T.StructField("start", T.LongType()), T.StructField("end", T.LongType())])
_ARROW_BATCH = 65536
_MIN_CHUNK = 1 << 20
# Spark's JSON reader, as strict as Python's json where it can be.
JSON_OPTIONS = {"allowSingleQuotes": "false", "allowNumericLeadingZeros": "false",
                "allowUnquotedControlChars": "false", "allowBackslashEscapingAnyCharacter": "false",
                "allowUnquotedFieldNames": "false", "allowComments": "false", "mode": "PERMISSIVE"}
FAST = "_icecdc_fast"
_OP_TEXT, _TYPED = "_n_op", "_n_typed"
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


@dataclass(frozen=True)
class TargetColumn:
    name: str
    dtype: T.DataType
    nullable: bool


def lines_frame(spark: "SparkSession", files: Sequence[landing.LandingFile]) -> DataFrame:
    """(file_index, source_file, source_offset, raw) per line, read in byte ranges by executors (Arrow batches)."""
    # Enough ranges to keep every core busy (two per core), each at most CHUNK_BYTES and at least 1 MB.
    cores = max(int(spark.sparkContext.defaultParallelism), 1)
    total = sum(f.size for f in files)
    chunk = min(landing.CHUNK_BYTES, max(_MIN_CHUNK, -(-total // (2 * cores))))
    ranges = landing.chunks(files, chunk)
    frame = spark.createDataFrame(spark.sparkContext.parallelize(ranges, max(len(ranges), 1)), _RANGE_SCHEMA)
    return frame.mapInArrow(_read_ranges, LINE_SCHEMA)


def _read_ranges(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for file_index, uri, start, end in zip(*(batch.column(i).to_pylist() for i in range(4)), strict=True):
            offsets: list[int] = []
            raws: list[bytes] = []
            for offset, raw in landing.read_line_bytes(uri, start, end):
                offsets.append(offset)
                raws.append(raw)
                if len(raws) >= _ARROW_BATCH:
                    yield _line_batch(file_index, uri, offsets, raws)
                    offsets, raws = [], []
            if raws:
                yield _line_batch(file_index, uri, offsets, raws)


def _line_batch(file_index: int, uri: str, offsets: list[int], raws: list[bytes]) -> pa.RecordBatch:
    try:
        text = pa.array(raws, pa.binary()).cast(pa.string())  # validates UTF-8
    except pa.ArrowInvalid:
        text = pa.array([r.decode("utf-8", errors="replace") for r in raws], pa.string())
    n = len(raws)
    return pa.RecordBatch.from_arrays([pa.array([file_index] * n, pa.int64()), pa.array([uri] * n, pa.string()),
                                       pa.array(offsets, pa.int64()), text], schema=_LINE_ARROW)


# --- Lines with a Connect schema block (JsonConverter ``schemas.enable=true``) -------------------------
# A batch's lines mostly share one schema block (one per topic and schema version). The driver reads the
# blocks of a few sample lines, decides per field how the Python rules would decode it, and the lines that
# start with exactly that block's text are decoded natively; a line with any other block is routed.

_PAYLOAD_KEY = '"payload"'
_SCHEMA_KEY = '"schema"'
_JSON_WS = " \t\r\n"
_SCHEMA_OPENING = re.compile(r'^[ \t\r\n]*\{[ \t\r\n]*"schema"[ \t\r\n]*:[ \t\r\n]*')
_SAMPLE_BYTES = 1 << 16
_SAMPLE_LINES = 4
MAX_BRANCHES = 8
# Text of a number token or literal as Spark renders it into a string (Java's double rendering included):
# such a text cannot tell a JSON string from a non-string token, so a decoder that needs a string routes it.
_NOT_A_STRING_TOKEN = r"^(-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?|true|false|NaN|-?Infinity)$|^[{\[]"
_OFFSET_TS = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$"
# Python's datetime range (year 1..9999): epoch values outside it are dead letters by the Python rules.
_MIN_MICROS = (dt.datetime(1, 1, 1) - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
_MAX_MICROS = (dt.datetime(9999, 12, 31, 23, 59, 59, 999999) - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
_MIN_DAYS = (dt.date(1, 1, 1) - dt.date(1970, 1, 1)).days
_MAX_DAYS = (dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days


class Decoding(Enum):
    """How the Python rules (:func:`debezium.decode`) turn a field's JSON value into a Python value, as far as
    the native reader tells them apart: a logical decoding by its native twin (:func:`_decoded_value`)."""

    IDENTITY = "identity"                # no schema, or a primitive without a logical decoding: the value as is
    BASE64 = "base64"                    # Connect bytes
    OTHER = "other"                      # anything else (times of day, UUIDs, structs...): the Python rules decide
    # The twins of the logical decodings marked ``native`` in :data:`debezium.LOGICAL_DECODINGS` (found by value).
    DECIMAL = Logical.DECIMAL            # Connect Decimal as bytes: base64 of the big-endian unscaled value
    EPOCH_DAYS = Logical.EPOCH_DAYS      # Date
    EPOCH_MILLIS = Logical.EPOCH_MILLIS  # Timestamp
    EPOCH_MICROS = Logical.EPOCH_MICROS  # MicroTimestamp
    EPOCH_NANOS = Logical.EPOCH_NANOS    # NanoTimestamp
    ZONED = Logical.ZONED                # ZonedTimestamp: ISO-8601 with an offset
    ISO = Logical.ISO                    # IsoTimestamp: ISO-8601, naive meaning UTC


@dataclass(frozen=True)
class FieldDecoding:
    kind: Decoding
    scale: int = 0


@dataclass(frozen=True)
class SchemaBranch:
    """Lines whose text starts with ``prefix`` + ``"payload"``: the same schema block, decoded per side.

    A side is None when its schema makes the Python rules dead-letter every such line (an unknown type)
    or cannot be read here: those lines are routed.
    """

    prefix: str
    before: dict[str, FieldDecoding] | None
    after: dict[str, FieldDecoding] | None


def field_decoding(schema: Any) -> FieldDecoding:
    """The decoding :func:`debezium.decode` applies to a value with this field schema: a logical type's by the
    shared table :data:`debezium.LOGICAL_DECODINGS` (OTHER without a native twin), else by its physical type."""
    if not schema:
        return FieldDecoding(Decoding.IDENTITY)
    name, kind = schema.get("name"), schema.get("type")
    logical = debezium.logical_decoding(name)
    if logical is not None:
        if not logical.native:
            return FieldDecoding(Decoding.OTHER)
        if logical.kind is Logical.DECIMAL:
            return _bytes_decimal_decoding(kind, schema.get("parameters"))
        return FieldDecoding(Decoding(logical.kind))
    if kind == "bytes":
        return FieldDecoding(Decoding.BASE64)
    if kind in si.CONNECT_CONTAINERS or not isinstance(kind, str):
        return FieldDecoding(Decoding.OTHER)
    return FieldDecoding(Decoding.IDENTITY)


def _bytes_decimal_decoding(kind: Any, parameters: Any) -> FieldDecoding:
    """A Connect Decimal is native only as bytes with a readable scale (a number or numeric string: Python rules)."""
    if kind != "bytes":
        return FieldDecoding(Decoding.OTHER)
    try:
        return FieldDecoding(Decoding.DECIMAL, int((parameters or {}).get("scale", 0)))
    except (AttributeError, TypeError, ValueError, ArithmeticError):
        return FieldDecoding(Decoding.OTHER)


def _side_decodings(schema: dict[str, Any], side: str) -> dict[str, FieldDecoding] | None:
    """Field decodings of one image side, as ``debezium.parse_line`` reads them; None when the Python rules
    would dead-letter (or fail on) every line with this side, so they must decide."""
    try:
        image_schema = next((f for f in schema.get("fields", []) if f.get("field") == side), None)
        if not image_schema:
            return {}
        fields = {f["field"]: f for f in image_schema.get("fields", [])}
        for name, f in fields.items():
            si.type_of_connect(f, name)
        return {name: field_decoding(f) for name, f in fields.items()}
    except Exception:  # any failure of the Python rules' own reading: they decide, line by line
        return None


def schema_branch(line: str) -> SchemaBranch | None:
    """The branch of a line written ``{"schema": {...}, "payload": ...}``; None for any other line."""
    if _PAYLOAD_KEY not in line:
        return None
    prefix = line.split(_PAYLOAD_KEY, 1)[0]
    opening = _SCHEMA_OPENING.match(prefix)
    if opening is None:
        return None
    try:
        schema, end = debezium.JSON_DECODER.raw_decode(prefix, opening.end())
    except ValueError:
        return None  # "payload" inside the block, or no valid block: not a branch
    if debezium.schema_problem(schema) is not None or prefix[end:].strip(_JSON_WS) != ",":
        return None  # not a branch: such lines take the Python rules (a malformed block: a dead letter)
    return SchemaBranch(prefix, _side_decodings(schema, "before"), _side_decodings(schema, "after"))


def sample_branches(files: Sequence[landing.LandingFile]) -> list[SchemaBranch]:
    """Schema branches of the first lines of each file (a block that appears only later is routed)."""
    return line_branches(raw.decode("utf-8", errors="replace") for f in files for _, raw in
                         itertools.islice(landing.read_line_bytes(f.uri, 0, min(f.size, _SAMPLE_BYTES)), _SAMPLE_LINES))


def line_branches(lines: Iterable[str]) -> list[SchemaBranch]:
    """Schema branches of sample lines (landing lines or stream messages), at most ``MAX_BRANCHES``."""
    branches: dict[str, SchemaBranch] = {}
    for line in lines:
        branch = schema_branch(line)
        if branch is not None and branch.prefix not in branches and len(branches) < MAX_BRANCHES:
            branches[branch.prefix] = branch
    return list(branches.values())


def sample_records(records: Sequence[str]) -> list[SchemaBranch]:
    """Schema branches of a stream batch's first messages (as many as a landing file's sample)."""
    return line_branches(itertools.islice(records, _SAMPLE_LINES))


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _image_struct(columns: Sequence[TargetColumn], types: dict[str, T.DataType] | None = None) -> T.StructType:
    """The typed read of the columns whose JSON text is not enough (decimal, binary; and for schema-block
    lines the epoch numbers of date/timestamp columns: only a typed read tells a number from a string)."""
    return T.StructType([T.StructField(c.name, (types or {}).get(c.name, c.dtype), True) for c in columns])


def _envelope(image: T.StructType, payload_image: T.StructType | None) -> T.StructType:
    fields = [T.StructField("before", image), T.StructField("after", image)]
    if payload_image is not None:
        fields.append(T.StructField("payload", T.StructType([T.StructField("before", payload_image),
                                                             T.StructField("after", payload_image)])))
    return T.StructType(fields)


def _exact_decimal(c: TargetColumn, raw: Column) -> Column | None:
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


def _decoded_value(c: TargetColumn, decoding: FieldDecoding, typed: Column, text: Column,
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


def coerce_lines(lines: DataFrame, columns: Sequence[TargetColumn], keys: Sequence[str], known: Sequence[str],
                 utc_session: bool, order_file_shift: int, branches: Sequence[SchemaBranch] = (),
                 extra: Sequence[Column] = ()) -> DataFrame:
    """``lines`` typed natively, each with the flag :data:`FAST` (the native row is the Python rules' row).

    Rows carry the table's columns plus op, order, reason (null or a key/required-null reason),
    raw, source position and notes (``ignored_fields``), as the Python rules would produce them.
    ``branches``: schema blocks (:func:`sample_branches`) whose lines are decoded natively too.
    ``extra``: more columns over the line (``raw``, ``file_index``, ``source_offset``), kept as given.
    """
    raw = F.col("raw")
    frame, typed_columns, payload_typed = _parsed_lines(lines, columns, branches)
    deleting = F.col(_OP_TEXT) == F.lit(DELETE)
    image = F.col("_n_map")
    arms = [_plain_arm(typed_columns)]
    for i, b in enumerate(branches):
        arms += _branch_arms(i, b, deleting, payload_typed)
    values: list[Column] = []
    fast = _well_formed(image) & _shape(branches, columns, image, deleting)
    for c in columns:
        value, ok = _column_value(c, arms, image[F.lit(c.name)], deleting, c.name in keys, utc_session)
        values.append(value)
        fast = fast & ok
    fast = F.coalesce(fast, F.lit(False))  # never null: a null flag would drop the line from both sides
    tombstone = F.trim(raw).isin("", "null")  # Python's rule: a blank line or JSON null
    fast = tombstone | fast
    reason = F.when(~tombstone, _null_reason(columns, values, keys, deleting))
    known_keys = F.array(*[F.lit(k) for k in known]) if known else F.array().cast("array<string>")
    ignored = F.size(F.array_except(F.map_keys(image), known_keys)).cast("long")
    ops_out = F.when(tombstone, F.lit(TOMBSTONE)).when(F.col(_OP_TEXT) == F.lit(INSERT), F.lit(OP_INSERT)).when(
        deleting, F.lit(OP_DELETE)).otherwise(F.lit(OP_UPSERT))
    empty_notes = F.create_map().cast("map<string,bigint>")
    return frame.select(
        *[F.when(reason.isNull(), v.cast(c.dtype).alias(c.name)).alias(c.name)
          for v, c in zip(values, columns, strict=True)],
        ops_out.alias(OP_COLUMN),
        (F.col("file_index") * F.lit(order_file_shift) + F.col("source_offset")).alias(ORDER_COLUMN),
        # the raw line is kept only where it is needed: dead letters and the Python rules (a smaller cache)
        reason.alias(REASON), F.when(reason.isNotNull() | ~fast, raw).alias(RAW),
        F.col("source_file").alias(SOURCE_FILE), F.col("source_offset").alias(SOURCE_OFFSET),
        F.when(reason.isNull() & (ignored > 0), F.create_map(F.lit(IGNORED_FIELDS), ignored))
        .otherwise(empty_notes).alias(NOTES),
        F.lit(None).cast("map<string,string>").alias(WIDEN), "file_index", fast.alias(FAST), *extra)


def _parsed_lines(lines: DataFrame, columns: Sequence[TargetColumn], branches: Sequence[SchemaBranch]
                  ) -> tuple[DataFrame, list[TargetColumn], list[TargetColumn]]:
    """``lines`` + each one's branch (-1: plain), parsed text, JSON reads, op and image (a map of field texts).

    One JSON read gives the op, the wrappers and every field's text; a second, typed read only for the
    columns whose text is not enough: returned, those of plain lines (decimals, binary) and those of
    schema-block lines (the same, and the epoch numbers of date/timestamp columns).
    """
    raw = F.col("raw")
    image_map = T.MapType(T.StringType(), T.StringType())
    payload = T.StructType([T.StructField("op", T.StringType()), T.StructField("before", image_map),
                            T.StructField("after", image_map)])
    envelope = T.StructType([T.StructField("schema", T.StringType()), T.StructField("payload", payload),
                             T.StructField("op", T.StringType()), T.StructField("before", image_map),
                             T.StructField("after", image_map)])
    op_map = F.create_map(*[x for k, v in OPS.items() for x in (F.lit(k), F.lit(v))])
    typed_columns = [c for c in columns if isinstance(c.dtype, (T.DecimalType, T.BinaryType))]
    epoch_types: dict[str, T.DataType] = {}
    if branches:
        epoch_types = {c.name: T.IntegerType() if isinstance(c.dtype, T.DateType) else T.LongType()
                       for c in columns if isinstance(c.dtype, (T.DateType, T.TimestampType, T.TimestampNTZType))}
    payload_typed = [c for c in columns if c in typed_columns or c.name in epoch_types]
    # A branch line is parsed without its schema block (most of its bytes): "{" + the text after the block.
    branch_index: Column = F.lit(-1)
    parsed_text: Column = raw
    for i, b in reversed(list(enumerate(branches))):
        branch_index = F.when(raw.startswith(b.prefix + _PAYLOAD_KEY), F.lit(i)).otherwise(branch_index)
        parsed_text = F.when(F.col("_n_branch") == i,
                             F.concat(F.lit("{"), F.substring(raw, len(b.prefix) + 1, 1 << 30))).otherwise(parsed_text)
    frame = lines.select("file_index", "source_file", "source_offset", "raw", branch_index.alias("_n_branch"))
    frame = frame.select("*", parsed_text.alias("_n_text"))
    text_of_line = F.col("_n_text")
    parses = [F.from_json(text_of_line, envelope, JSON_OPTIONS).alias("_n_env")]
    if typed_columns or payload_typed:
        parses.append(F.from_json(text_of_line, _envelope(_image_struct(typed_columns),
                                                          _image_struct(payload_typed, epoch_types) if branches
                                                          else None), JSON_OPTIONS).alias(_TYPED))
    frame = frame.select("*", *parses)
    plain = F.col("_n_branch") == -1
    op = op_map[F.lower(F.when(plain, F.col("_n_env.op")).otherwise(F.col("_n_env.payload.op")))]
    before = F.when(plain, F.col("_n_env.before")).otherwise(F.col("_n_env.payload.before"))
    after = F.when(plain, F.col("_n_env.after")).otherwise(F.col("_n_env.payload.after"))
    frame = frame.select("*", op.alias(_OP_TEXT), F.when(op == F.lit(DELETE), before).otherwise(after).alias("_n_map"))
    return frame, typed_columns, payload_typed


@dataclass(frozen=True, eq=False)  # Columns do not compare as values
class _Arm:
    """One way a line is read: where ``condition`` holds, each field decoded as ``decodings`` says (None: the
    Python rules decide every such line), the typed read of the ``typed`` columns found under ``typed_at``."""

    condition: Column
    decodings: dict[str, FieldDecoding] | None
    typed_at: str
    typed: Sequence[TargetColumn]


def _plain_arm(typed_columns: Sequence[TargetColumn]) -> _Arm:
    """A line without a schema block: every field as it is (no decoding), typed reads at the top level."""
    return _Arm(F.col("_n_branch") == -1, {}, "", typed_columns)


def _branch_arms(i: int, branch: SchemaBranch, deleting: Column, payload_typed: Sequence[TargetColumn]
                 ) -> list[_Arm]:
    """A line of branch ``i``: a delete reads its before side, any other op its after side, each decoded as that
    side's schema says (``debezium.parse_line`` does the same); typed reads inside the payload."""
    on_branch = F.col("_n_branch") == i
    return [_Arm(on_branch & deleting, branch.before, "payload.", payload_typed),
            _Arm(on_branch & ~deleting, branch.after, "payload.", payload_typed)]


def _column_value(c: TargetColumn, arms: Sequence[_Arm], text: Column, deleting: Column, is_key: bool,
                  utc_session: bool) -> tuple[Column, Column]:
    """(value, ok) of one column: the value of the arm the line is read by, and whether it provably equals the
    Python rules' value. ``text``: the field's JSON text in the line's image."""
    exact = _exact_decimal(c, F.col("_n_text"))
    value: Column = F.lit(None)
    ok: Column = F.lit(False)
    for arm in reversed(arms):
        if arm.decodings is None:
            continue  # the Python rules decide every line of this side (ok stays false)
        typed = _typed_read(c, arm.typed_at, deleting) if c in arm.typed else F.lit(None)
        decoding = arm.decodings.get(c.name, FieldDecoding(Decoding.IDENTITY))
        arm_value, arm_ok = _decoded_value(c, decoding, typed, text, exact, utc_session)
        if not is_key and decoding.kind is Decoding.IDENTITY:
            arm_ok = deleting | arm_ok  # a delete matches on its key only (an identity value cannot fail)
        value = F.when(arm.condition, arm_value).otherwise(value)
        ok = F.when(arm.condition, arm_ok).otherwise(ok)
    if not is_key:
        value = F.when(~deleting, value)  # a delete matches on its key only
    return value, ok


def _typed_read(c: TargetColumn, typed_at: str, deleting: Column) -> Column:
    q = _quote(c.name)
    return F.when(deleting, F.col(f"{_TYPED}.{typed_at}before.{q}")).otherwise(F.col(f"{_TYPED}.{typed_at}after.{q}"))


def _null_reason(columns: Sequence[TargetColumn], values: Sequence[Column], keys: Sequence[str],
                 deleting: Column) -> Column:
    """The dead-letter reason the Python rules give a row by its values: a null key or required column (the
    first in schema order), or a delete on a table without keys; null when there is none."""
    reason: Column = F.lit(None).cast("string")
    reasons: list[tuple[Column, str]] = []
    for c, value in zip(columns, values, strict=True):
        is_key = c.name in keys
        needed = F.lit(True) if is_key else (~deleting if not c.nullable else F.lit(False))
        reasons.append((needed & value.isNull(), f"{'key' if is_key else 'required'} column {c.name} is null or "
                                                 "missing"))
    for condition, message in reversed(reasons):  # the first column in schema order names the reason
        reason = F.when(condition, F.lit(message)).otherwise(reason)
    if not keys:
        reason = F.coalesce(reason, F.when(deleting, F.lit("delete on a table without identifier columns "
                                                           "(append only)")))
    return reason


def _well_formed(image: Column) -> Column:
    """What the native reading needs to mirror the Python rules: a known op, one JSON object (Spark ignores
    text after ``}{``), an image, no duplicate key."""
    keys_seen = F.map_keys(image)
    return (F.col(_OP_TEXT).isNotNull() & ~F.col("_n_text").rlike(r"\}\s*\{") & image.isNotNull()
            & (F.size(keys_seen) == F.size(F.array_distinct(keys_seen))))


def _shape(branches: Sequence[SchemaBranch], columns: Sequence[TargetColumn], image: Column,
           deleting: Column) -> Column:
    """The line is plain (no wrapper, no schema key) or written exactly as one of ``branches``."""
    raw = F.col("raw")
    shape = ((F.col("_n_branch") == -1) & F.col("_n_env.payload").isNull() & F.col("_n_env.schema").isNull()
             & ~raw.contains(_PAYLOAD_KEY))
    target_names = {c.name for c in columns}
    for i, b in enumerate(branches):
        shape = shape | _branch_shape(i, b, target_names, image, deleting)
    return shape


def _branch_shape(i: int, branch: SchemaBranch, target_names: set[str], image: Column, deleting: Column) -> Column:
    """A line of branch ``i`` with exactly one "schema" and one "payload" key (a second one would win in both
    readers, but is not worth proving), and no schema-decoded field outside the table (its decoding could fail)."""
    raw = F.col("raw")
    start = len(branch.prefix)
    sides: Column = F.lit(False)
    for side, decodings in ((deleting, branch.before), (~deleting, branch.after)):
        if decodings is None:
            continue
        others = [name for name, d in decodings.items() if name not in target_names and d.kind is not Decoding.IDENTITY]
        sides = sides | (side & _all_null(image, others))
    return ((F.col("_n_branch") == i) & (F.locate(_SCHEMA_KEY, raw, start + 1) == 0)
            & (F.locate(_PAYLOAD_KEY, raw, start + len(_PAYLOAD_KEY) + 1) == 0)
            & F.col("_n_env.payload").isNotNull() & sides)


def _all_null(image: Column, names: Sequence[str]) -> Column:
    condition: Column = F.lit(True)
    for name in names:
        condition = condition & image[F.lit(name)].isNull()
    return condition


def split(classified: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(native rows, lines for the Python rules) of a *materialised* :func:`coerce_lines` frame.

    Materialise (persist) it first: a filter on the flag would otherwise be pushed below the projection
    and repeat every JSON parse once per reference.
    """
    native = classified.where(F.col(FAST)).drop(FAST, "file_index")
    rest = classified.where(~F.col(FAST)).select("file_index", F.col(SOURCE_FILE).alias("source_file"),
                                                 F.col(SOURCE_OFFSET).alias("source_offset"),
                                                 F.col(RAW).alias("raw"))
    return native, rest


def columns_of(schema: T.StructType) -> list[TargetColumn]:
    return [TargetColumn(f.name, f.dataType, f.nullable) for f in schema.fields]


def utc(spark: Any) -> bool:
    return str(spark.conf.get("spark.sql.session.timeZone", "")).upper() in ("UTC", "Z", "ETC/UTC", "+00:00")
