"""A batch's lines typed natively, each flagged :data:`FAST` when the native row is the Python rules' row;
:func:`split` parts the native rows from the lines the Python rules must take."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.ingest.coercion import IGNORED_FIELDS
from icecdc_dagster.ingest.columns import NOTES, RAW, REASON, SOURCE_FILE, SOURCE_OFFSET, TOMBSTONE, WIDEN
from icecdc_dagster.ingest.debezium import DELETE, INSERT, OPS
from icecdc_dagster.ingest.native import line_typer
from icecdc_dagster.ingest.native.column_rules import TargetColumn, decimal_is_exact, decoded_value
from icecdc_dagster.ingest.native.schema_blocks import PAYLOAD_KEY, Decoding, FieldDecoding, SchemaBranch
from icecdc_dagster.writer import OP_COLUMN, OP_DELETE, OP_INSERT, OP_UPSERT, ORDER_COLUMN

# Spark's JSON reader, as strict as Python's json where it can be.
JSON_OPTIONS = {"allowSingleQuotes": "false", "allowNumericLeadingZeros": "false",
                "allowUnquotedControlChars": "false", "allowBackslashEscapingAnyCharacter": "false",
                "allowUnquotedFieldNames": "false", "allowComments": "false", "mode": "PERMISSIVE"}
FAST = "_icecdc_fast"
_OP_TEXT, _TYPED, _READING, _IN_ARRAY = "_n_op", "_n_typed", "_n_reading", "_n_in_array"
_FAST_VALUES, _REASON_TEXT = "_n_fast", "_n_reason"
_SCHEMA_KEY = '"schema"'
# A plain line must not hold the payload key anywhere. Searched without its opening quote: the search tries a
# match at every occurrence of the first byte, and a quote opens every name and string of a line (a word that
# holds the key's text is routed too, which is always safe).
_PAYLOAD_WORD = PAYLOAD_KEY[1:]


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


@dataclass(frozen=True)
class TypedLines:
    """:func:`coerce_lines`' rows, planned, not computed; ``tally``: what the JVM typer counts while it makes them
    (None where Spark expressions type the lines)."""

    frame: DataFrame
    tally: line_typer.LineTally | None = None


def coerce_lines(lines: DataFrame, columns: Sequence[TargetColumn], keys: Sequence[str], known: Sequence[str],
                 utc_session: bool, order_file_shift: int, branches: Sequence[SchemaBranch] = (),
                 extra: Sequence[Column] = (), in_java: bool = True) -> TypedLines:
    """``lines`` typed natively, each with the flag :data:`FAST` (the native row is the Python rules' row).

    Rows carry the table's columns plus op, order, reason (null or a key/required-null reason),
    raw, source position and notes (``ignored_fields``), as the Python rules would produce them.
    ``branches``: schema blocks (:func:`sample_branches`) whose lines are decoded natively too.
    ``extra``: more columns over the line (``raw``, ``file_index``, ``source_offset``), kept as given.
    Plain lines are typed by :mod:`line_typer` (one parse, each value typed as read); with ``branches``,
    ``in_java=False`` or where its class cannot be built (no JDK's javac), by Spark expressions.
    """
    in_java = in_java and not branches
    typer = line_typer.typer(lines.sparkSession, columns, keys, known) if in_java else None
    if typer is not None:
        return TypedLines(*_typed_in_java(lines, typer, columns, keys, order_file_shift, extra))
    frame, typed_columns, payload_typed = _parsed_lines(lines, columns, branches)
    deleting = F.col(_OP_TEXT) == F.lit(DELETE)
    image = F.col("_n_map")
    frame = frame.select("*", _reading_index(deleting).alias(_READING))
    values: list[Column] = []
    fast = _well_formed(image) & _shape(branches, columns, image, deleting)
    for c in columns:
        readings = _readings(c, branches, typed_columns, payload_typed)
        value, ok = _column_value(c, readings, image[F.lit(c.name)], deleting, c.name in keys, utc_session)
        values.append(value)
        fast = fast & ok
    # Staged: each column's value and the row's flag are computed once and read by name below (the reason
    # reads every value and every output column reads the reason: inlined, the plan would grow with the
    # square of the columns and each value would be evaluated once per reference).
    names = [f"_n_v{i}" for i in range(len(columns))]
    frame = frame.select("*", *[v.alias(n) for v, n in zip(values, names, strict=True)],
                         F.coalesce(fast, F.lit(False)).alias(_FAST_VALUES))  # never null: a null flag drops the line
    values = [F.col(n) for n in names]
    # Python's rule: a blank line or JSON null. Only a line without an op can be one, so only those are trimmed
    # (trimming copies the line).
    tombstone = F.col(_OP_TEXT).isNull() & F.trim(F.col("raw")).isin("", "null")
    frame = frame.select("*", F.when(~tombstone, _null_reason(columns, values, keys, deleting)).alias(_REASON_TEXT))
    known_keys = F.array(*[F.lit(k) for k in known]) if known else F.array().cast("array<string>")
    ignored = F.size(F.array_except(F.map_keys(image), known_keys)).cast("long")
    return TypedLines(frame.select(*_rows(columns, values, F.col(_OP_TEXT), tombstone,
                                          tombstone | F.col(_FAST_VALUES), ignored, order_file_shift), *extra))


def _typed_in_java(lines: DataFrame, typer: Any, columns: Sequence[TargetColumn], keys: Sequence[str],
                   order_file_shift: int, extra: Sequence[Column]) -> tuple[DataFrame, line_typer.LineTally]:
    """:func:`coerce_lines` by :mod:`line_typer` (plain lines): one parse per line, each value typed as read, the
    rows of :func:`_rows` made in the JVM (the plan is one scan mapped by the typer: every later step of the batch
    plans it cheaply)."""
    source = lines.select("file_index", "source_file", "source_offset", "raw", *extra) if extra else lines
    added = source.schema.fields[4:] if extra else []  # each plan step and schema read is a JVM round trip
    out = T.StructType([*(T.StructField(c.name, c.dtype) for c in columns), *_ROW_FIELDS, *added])
    return line_typer.typed_rows(source, typer, columns, keys, out, order_file_shift, _WORDS)


# What _rows projects after the values, in its order and types; and the words the JVM rows are made of (the op
# names of debezium, our op column's values, the notes' key, the reasons' texts of _null_reason).
_ROW_FIELDS = (T.StructField(OP_COLUMN, T.StringType()), T.StructField(ORDER_COLUMN, T.LongType()),
               T.StructField(REASON, T.StringType()), T.StructField(RAW, T.StringType()),
               T.StructField(SOURCE_FILE, T.StringType()), T.StructField(SOURCE_OFFSET, T.LongType()),
               T.StructField(NOTES, T.MapType(T.StringType(), T.LongType())),
               T.StructField(WIDEN, T.MapType(T.StringType(), T.StringType())),
               T.StructField("file_index", T.LongType()), T.StructField(FAST, T.BooleanType(), False))
_KEY_NULL, _REQUIRED_NULL, _NULL_WORDS = "key", "required", "is null or missing"
_KEYLESS_DELETE = "delete on a table without identifier columns (append only)"
_WORDS = (INSERT, DELETE, TOMBSTONE, OP_INSERT, OP_DELETE, OP_UPSERT, IGNORED_FIELDS, _KEY_NULL, _REQUIRED_NULL,
          _NULL_WORDS, _KEYLESS_DELETE)


def _rows(columns: Sequence[TargetColumn], values: Sequence[Column], op: Column, tombstone: Column, fast: Column,
          ignored: Column, order_file_shift: int) -> list[Column]:
    """The projection of the typed rows as the Python rules give them (their reason read from
    :data:`_REASON_TEXT`), each flagged :data:`FAST`. ``op``: the line's op (``debezium.INSERT`` / ``UPDATE`` /
    ``DELETE``); ``ignored``: the count of image fields the table does not know."""
    raw, reason = F.col("raw"), F.col(_REASON_TEXT)
    ops_out = F.when(tombstone, F.lit(TOMBSTONE)).when(op == F.lit(INSERT), F.lit(OP_INSERT)).when(
        op == F.lit(DELETE), F.lit(OP_DELETE)).otherwise(F.lit(OP_UPSERT))
    empty_notes = F.create_map().cast("map<string,bigint>")
    return [
        *[F.when(reason.isNull(), v.cast(c.dtype).alias(c.name)).alias(c.name)
          for v, c in zip(values, columns, strict=True)],
        ops_out.alias(OP_COLUMN),
        (F.col("file_index") * F.lit(order_file_shift) + F.col("source_offset")).alias(ORDER_COLUMN),
        # the raw line is kept only where it is needed: dead letters and the Python rules (a smaller cache)
        reason.alias(REASON), F.when(reason.isNotNull() | ~fast, raw).alias(RAW),
        F.col("source_file").alias(SOURCE_FILE), F.col("source_offset").alias(SOURCE_OFFSET),
        F.when(reason.isNull() & (ignored > 0), F.create_map(F.lit(IGNORED_FIELDS), ignored))
        .otherwise(empty_notes).alias(NOTES),
        F.lit(None).cast("map<string,string>").alias(WIDEN), F.col("file_index"), fast.alias(FAST)]


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
        branch_index = F.when(raw.startswith(b.prefix + PAYLOAD_KEY), F.lit(i)).otherwise(branch_index)
        parsed_text = F.when(F.col("_n_branch") == i,
                             F.concat(F.lit("{"), F.substring(raw, len(b.prefix) + 1, 1 << 30))).otherwise(parsed_text)
    frame = lines.select("file_index", "source_file", "source_offset", "raw", branch_index.alias("_n_branch"))
    frame = frame.select("*", parsed_text.alias("_n_text"))
    text_of_line = F.col("_n_text")
    parses = [F.from_json(F.concat(F.lit("["), text_of_line, F.lit("]")), T.ArrayType(envelope), JSON_OPTIONS
                          ).alias(_IN_ARRAY)]
    if typed_columns or payload_typed:
        parses.append(F.from_json(text_of_line, _envelope(_image_struct(typed_columns),
                                                          _image_struct(payload_typed, epoch_types) if branches
                                                          else None), JSON_OPTIONS).alias(_TYPED))
    frame = frame.select("*", *parses)
    frame = frame.select("*", _one_value(text_of_line).alias("_n_env"))
    plain = F.col("_n_branch") == -1
    op = op_map[F.lower(F.when(plain, F.col("_n_env.op")).otherwise(F.col("_n_env.payload.op")))]
    before = F.when(plain, F.col("_n_env.before")).otherwise(F.col("_n_env.payload.before"))
    after = F.when(plain, F.col("_n_env.after")).otherwise(F.col("_n_env.payload.after"))
    frame = frame.select("*", op.alias(_OP_TEXT), F.when(op == F.lit(DELETE), before).otherwise(after).alias("_n_map"))
    return frame, typed_columns, payload_typed


def _one_value(text: Column) -> Column:
    """The line's envelope where the line is one JSON value and nothing after it (else null: such a line is
    routed to the Python rules, whose ``json.loads`` refuses it).

    Spark's JSON reader stops at the end of the first value and ignores whatever follows (``{...}x``,
    ``{...}}``, ``{...}{...}``). So the line is read as the one element of ``[`` line ``]``: text after the
    value either breaks that array or adds an element, unless it starts with ``]`` (closing the array early).
    Only a line holding a ``]`` needs the second look: inside ``{"k":`` line ``}`` a value followed by ``]``
    is an error."""
    in_array = F.col(_IN_ARRAY)
    one = F.size(in_array) == 1
    closed_early = F.from_json(F.concat(F.lit('{"k":'), text, F.lit("}")), "k string", JSON_OPTIONS)["k"].isNull()
    return F.when(one & (~text.contains("]") | ~closed_early), in_array[0])


def _reading_index(deleting: Column) -> Column:
    """Which way a line is read: -1 a plain line; ``2 i`` a delete of branch ``i`` (its before side), ``2 i + 1``
    any other op of branch ``i`` (its after side), as ``debezium.parse_line`` reads them; null without an op."""
    branch = F.col("_n_branch")
    return (F.when(branch == -1, F.lit(-1)).when(deleting, branch * 2)
            .when(~deleting, branch * 2 + 1))


@dataclass(frozen=True)
class _Reading:
    """One way a column's field is read: decoded as ``decoding``, its typed read under ``typed_at`` (None: the
    column has no typed read)."""

    decoding: FieldDecoding
    typed_at: str | None


def _readings(c: TargetColumn, branches: Sequence[SchemaBranch], typed_columns: Sequence[TargetColumn],
              payload_typed: Sequence[TargetColumn]) -> dict[_Reading, list[int]]:
    """The distinct readings of column ``c``, each with the :func:`_reading_index` values of the lines it reads.

    Branches mostly decode a field alike, so a column needs one expression per distinct decoding, not one per
    branch and side. A side whose decodings are None (the Python rules decide every such line) has no reading:
    its lines are never ok here.
    """
    identity = FieldDecoding(Decoding.IDENTITY)
    readings: dict[_Reading, list[int]] = {_Reading(identity, "" if c in typed_columns else None): [-1]}
    for i, branch in enumerate(branches):
        for index, decodings in ((2 * i, branch.before), (2 * i + 1, branch.after)):
            if decodings is not None:
                at = "payload." if c in payload_typed else None
                readings.setdefault(_Reading(decodings.get(c.name, identity), at), []).append(index)
    return readings


def _column_value(c: TargetColumn, readings: dict[_Reading, list[int]], text: Column, deleting: Column,
                  is_key: bool, utc_session: bool) -> tuple[Column, Column]:
    """(value, ok) of one column: the value of the reading the line takes, and whether it provably equals the
    Python rules' value. ``text``: the field's JSON text in the line's image."""
    exact = decimal_is_exact(c, F.col("_n_text"))
    value: Column = F.lit(None)
    ok: Column = F.lit(False)
    for reading, indexes in reversed(list(readings.items())):
        typed = F.lit(None) if reading.typed_at is None else _typed_read(c, reading.typed_at, deleting)
        reading_value, reading_ok = decoded_value(c, reading.decoding, typed, text, exact, utc_session)
        if not is_key and reading.decoding.kind is Decoding.IDENTITY:
            reading_ok = deleting | reading_ok  # a delete matches on its key only (an identity value cannot fail)
        taken = F.col(_READING) == F.lit(indexes[0]) if len(indexes) == 1 else F.col(_READING).isin(*indexes)
        value = F.when(taken, reading_value).otherwise(value)
        ok = F.when(taken, reading_ok).otherwise(ok)
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
        reasons.append((needed & value.isNull(), f"{_KEY_NULL if is_key else _REQUIRED_NULL} column {c.name} "
                                                 f"{_NULL_WORDS}"))
    for condition, message in reversed(reasons):  # the first column in schema order names the reason
        reason = F.when(condition, F.lit(message)).otherwise(reason)
    if not keys:
        reason = F.coalesce(reason, F.when(deleting, F.lit(_KEYLESS_DELETE)))
    return reason


def _well_formed(image: Column) -> Column:
    """What the native reading needs to mirror the Python rules: a known op, one JSON object (Spark ignores
    text after ``}{``), an image, no duplicate key."""
    keys_seen = F.map_keys(image)
    return (F.col(_OP_TEXT).isNotNull() & image.isNotNull()
            & (F.size(keys_seen) == F.size(F.array_distinct(keys_seen))))


def _shape(branches: Sequence[SchemaBranch], columns: Sequence[TargetColumn], image: Column,
           deleting: Column) -> Column:
    """The line is plain (no wrapper, no schema key) or written exactly as one of ``branches``."""
    raw = F.col("raw")
    shape = ((F.col("_n_branch") == -1) & F.col("_n_env.payload").isNull() & F.col("_n_env.schema").isNull()
             & ~raw.contains(_PAYLOAD_WORD))
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
            & (F.locate(PAYLOAD_KEY, raw, start + len(PAYLOAD_KEY) + 1) == 0)
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
