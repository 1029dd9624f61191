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

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.ingest import landing
from icecdc_dagster.ingest.debezium import _OPS, DELETE, INSERT

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


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _image_struct(columns: Sequence[TargetColumn]) -> T.StructType:
    """The typed read of the columns whose JSON text is not enough (decimal, binary)."""
    return T.StructType([T.StructField(c.name, c.dtype, True) for c in columns])


def _envelope(image: T.StructType) -> T.StructType:
    return T.StructType([T.StructField("before", image), T.StructField("after", image)])


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
        value = instant.cast("timestamp_ntz") if isinstance(dtype, T.TimestampNTZType) else instant
        ok = value.isNotNull()
    elif isinstance(dtype, T.BinaryType):
        value = F.when(text.rlike(_BASE64), F.unbase64(text))
        ok = typed.isNotNull() & value.isNotNull()  # typed: the token is a JSON string
    else:  # float (Python narrows twice), struct, list, map: the Python rules decide
        ok = F.lit(False)
    # the value only where the image has the field by its exact name (the map is exact; a struct field
    # read case-insensitively would not be)
    return F.when(text.isNotNull(), value), text.isNull() | ok


def coerce_lines(lines: DataFrame, columns: Sequence[TargetColumn], keys: Sequence[str], known: Sequence[str],
                 utc_session: bool, order_file_shift: int) -> DataFrame:
    """``lines`` typed natively, each with the flag :data:`FAST` (the native row is the Python rules' row).

    Rows carry the table's columns plus op, order, reason (null or a key/required-null reason),
    raw, source position and notes (``ignored_fields``), as the Python rules would produce them.
    """
    from icecdc_dagster.ingest import pipeline as p  # the column names the pipeline shares with the Python rules

    raw = F.col("raw")
    image_map = T.MapType(T.StringType(), T.StringType())
    envelope = T.StructType([T.StructField("schema", T.StringType()), T.StructField("payload", T.StringType()),
                             T.StructField("op", T.StringType()), T.StructField("before", image_map),
                             T.StructField("after", image_map)])
    op_map = F.create_map(*[x for k, v in _OPS.items() for x in (F.lit(k), F.lit(v))])
    # One JSON read gives the op, the wrappers and every field's text; a second, typed read only for the
    # columns whose text is not enough (decimals, binary).
    typed_columns = [c for c in columns if isinstance(c.dtype, (T.DecimalType, T.BinaryType))]
    parses = [F.from_json(raw, envelope, JSON_OPTIONS).alias("_n_env")]
    if typed_columns:
        parses.append(F.from_json(raw, _envelope(_image_struct(typed_columns)), JSON_OPTIONS)
                      .alias(_TYPED))
    frame = lines.select("file_index", "source_file", "source_offset", "raw", *parses)
    op = op_map[F.lower(F.col("_n_env.op"))]
    image = F.when(op == F.lit(DELETE), F.col("_n_env.before")).otherwise(F.col("_n_env.after"))
    frame = frame.select("*", op.alias(_OP_TEXT), image.alias("_n_map"))
    deleting = F.col(_OP_TEXT) == F.lit(DELETE)
    values: list[Column] = []
    oks: list[Column] = []
    reason: Column = F.lit(None).cast("string")
    reasons: list[tuple[Column, str]] = []
    for c in columns:
        q = _quote(c.name)
        typed = (F.when(deleting, F.col(f"{_TYPED}.before.{q}")).otherwise(F.col(f"{_TYPED}.after.{q}"))
                 if c in typed_columns else F.lit(None))
        value, ok = _native_value(c, typed, F.col("_n_map")[F.lit(c.name)], _exact_decimal(c, raw), utc_session)
        is_key = c.name in keys
        if not is_key:
            value = F.when(~deleting, value)  # a delete matches on its key only
            ok = deleting | ok
        values.append(value.cast(c.dtype).alias(c.name))
        oks.append(ok)
        needed = F.lit(True) if is_key else (~deleting if not c.nullable else F.lit(False))
        reasons.append((needed & value.isNull(), f"{'key' if is_key else 'required'} column {c.name} is null or "
                                                 "missing"))
    for condition, text in reversed(reasons):  # the first column in schema order names the reason
        reason = F.when(condition, F.lit(text)).otherwise(reason)
    if not keys:
        reason = F.coalesce(reason, F.when(deleting, F.lit("delete on a table without identifier columns "
                                                           "(append only)")))
    keys_seen = F.map_keys(F.col("_n_map"))
    fast = (F.col(_OP_TEXT).isNotNull() & F.col("_n_env.payload").isNull() & F.col("_n_env.schema").isNull()
            & ~raw.contains('"payload"') & ~raw.rlike(r"\}\s*\{")
            & F.col("_n_map").isNotNull() & (F.size(keys_seen) == F.size(F.array_distinct(keys_seen))))
    for ok in oks:
        fast = fast & ok
    tombstone = F.trim(raw).isin("", "null")  # Python's rule: a blank line or JSON null
    fast = tombstone | fast
    reason = F.when(~tombstone, reason)
    known_keys = F.array(*[F.lit(k) for k in known]) if known else F.array().cast("array<string>")
    ignored = F.size(F.array_except(keys_seen, known_keys)).cast("long")
    ops_out = F.when(tombstone, F.lit(p.TOMBSTONE)).when(F.col(_OP_TEXT) == F.lit(INSERT), F.lit(p.OP_INSERT)).when(
        deleting, F.lit(p.OP_DELETE)).otherwise(F.lit(p.OP_UPSERT))
    empty_notes = F.create_map().cast("map<string,bigint>")
    return frame.select(
        *[F.when(reason.isNull(), v).alias(c.name) for v, c in zip(values, columns, strict=True)],
        ops_out.alias(p.OP_COLUMN),
        (F.col("file_index") * F.lit(order_file_shift) + F.col("source_offset")).alias(p.ORDER_COLUMN),
        # the raw line is kept only where it is needed: dead letters and the Python rules (a smaller cache)
        reason.alias(p.REASON), F.when(reason.isNotNull() | ~fast, raw).alias(p.RAW),
        F.col("source_file").alias(p.SOURCE_FILE), F.col("source_offset").alias(p.SOURCE_OFFSET),
        F.when(reason.isNull() & (ignored > 0), F.create_map(F.lit(p.IGNORED_FIELDS), ignored))
        .otherwise(empty_notes).alias(p.NOTES),
        F.lit(None).cast("map<string,string>").alias(p.WIDEN), "file_index", fast.alias(FAST))


def split(classified: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(native rows, lines for the Python rules) of a *materialised* :func:`coerce_lines` frame.

    Materialise (persist) it first: a filter on the flag would otherwise be pushed below the projection
    and repeat every JSON parse once per reference.
    """
    from icecdc_dagster.ingest import pipeline as p

    native = classified.where(F.col(FAST)).drop(FAST, "file_index")
    rest = classified.where(~F.col(FAST)).select("file_index", F.col(p.SOURCE_FILE).alias("source_file"),
                                                 F.col(p.SOURCE_OFFSET).alias("source_offset"),
                                                 F.col(p.RAW).alias("raw"))
    return native, rest


def columns_of(schema: T.StructType) -> list[TargetColumn]:
    return [TargetColumn(f.name, f.dataType, f.nullable) for f in schema.fields]


def utc(spark: Any) -> bool:
    return str(spark.conf.get("spark.sql.session.timeZone", "")).upper() in ("UTC", "Z", "ETC/UTC", "+00:00")
