"""The native reader gives exactly the rows the Python rules give, line by line (property-based).

The oracle is the Python rules themselves (``debezium.parse_line`` + ``coercion.coerce``, the path every
line took before the native reader): random lines — values of every token kind for columns of every
primitive type, numbers written in many forms (fractions beyond the column's scale, exponents, 2^53+1,
leading zeros, numeric and ISO strings, base64 and not), duplicate keys, unknown fields, single quotes,
two objects or other text after the object on a line, wrapped payloads, tombstones and broken JSON — are typed by
``native.coerce_lines`` + the Python rules for the lines it routes, and compared with the Python rules
applied to every line (values, op, order, dead-letter reason, counted rules). A native-path batch must
also route the plain lines natively (the point of it): every random batch carries a plain line that must
take the native path, and every line is accounted for on exactly one path.
"""

import base64
import datetime
import json
import random
import uuid
from collections.abc import Iterator
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.ingest import debezium, landing, landing_lines, native
from icecdc_dagster.ingest import schema_inference as si
from icecdc_dagster.ingest.coercion import IGNORED_FIELDS
from icecdc_dagster.ingest.columns import NOTES, RAW, REASON, SOURCE_OFFSET, TOMBSTONE, WIDEN
from icecdc_dagster.ingest.line_parsing import ORDER_FILE_SHIFT
from icecdc_dagster.ingest.native.line_typer import TALLY_SLOTS
from icecdc_dagster.ingest.targets import PYTHON_RULES, python_partition, rows_schema
from icecdc_dagster.writer import OP_COLUMN

SCHEMA = T.StructType([
    T.StructField("id", T.LongType(), False), T.StructField("s", T.StringType()), T.StructField("d", T.DoubleType()),
    T.StructField("dec", T.DecimalType(10, 2)), T.StructField("big", T.DecimalType(38, 6)),
    T.StructField("b", T.BooleanType()), T.StructField("day", T.DateType()), T.StructField("ts", T.TimestampType()),
    T.StructField("ntz", T.TimestampNTZType()), T.StructField("bin", T.BinaryType()),
    T.StructField("i", T.IntegerType()), T.StructField("f", T.FloatType()),
    T.StructField("req", T.StringType(), False)])
KEYS = ("id",)

# JSON token texts, written as a producer might (the text is put into the line verbatim).
numbers = st.sampled_from([
    "0", "-0", "7", "-12", "007", "1.5", "1.50", "12.345", "-0.01", "1e2", "1E-2", "2.5e+3", "9007199254740993",
    "123456789012345678", "99999999.99", "100000000.00", "0.1234567890123456789012345678901234567",
    "12345678901234567890123456789012.123456", "2147483648", "-2147483649", "1700000000000", "1700000000123",
    "170000000000000000", "20200101", "3.4028235e38", "1e400", "NaN", "-Infinity", "1.0",
    "-9223372036854775808", "9223372036854775808", "9007199254740992", "-62135596800000", "-62135596800001",
    "253402300799999", "253402300800000", "2932897", "-719162", "1e-400", "0e-5", "-0.0"])
strings = st.sampled_from([
    "", "abc", " x ", "12", "1.50", "1,000.5", "true", "TRUE", " true", "2024-02-29", "2023-02-29", "2024-1-1",
    "20240101", "2024-02-29T12:34:56", "2024-02-29 12:34:56.123456", "2024-02-29T12:34:56.1234567Z",
    "2024-02-29T12:34:56+05:30", "2024-02-29T12:34:56Z", "2024-02-29T24:00:00", "1700000000000", "aGVsbG8=",
    "aGVsbG8", "YQ==", "{not json", "[1]", "NaN", "Infinity", "-1e5", "é\\u00e9", "tab\\there", "a\\\"b",
    "\\ud800", "x\\udc00", "\\ud83d\\ude00", "😀", "QR==", "YR=", "A===", "0000-01-01", "0001-01-01T00:00:00+01:00",
    "2024-03-01T10:00:00+18:30", "2024-03-01T10:00:00.5-03:00", "2024-03-01t10:00:00", "2024-03-01T10:00:00z",
    "9999-12-31T23:59:59.999999-01:00", "2024-03-01T10:00:00+05:60", "-12", "12345678901234567890", "1.5e3"])
tokens = st.one_of(numbers, strings.map(lambda s: f'"{s}"'),
                   st.sampled_from(["true", "false", "null", "{}", '{"a": 1.10}', "[1, 2.50]", "[]"]))
fields = st.dictionaries(st.sampled_from([f.name for f in SCHEMA.fields] + ["extra", "id"]), tokens, max_size=9)


@st.composite
def lines(draw: st.DrawFn) -> str:
    image = {"id": draw(st.sampled_from(["1", "2", "3", '"4"', "null", "5.0"])), "req": '"r"', **draw(fields)}
    if draw(st.booleans()):
        image["req"] = draw(tokens)
    body = ", ".join(f'"{k}": {v}' for k, v in image.items())
    if draw(st.integers(0, 9)) == 0:
        body += f', "id": {draw(st.sampled_from(["8", "null"]))}'  # a duplicate key: the last one wins
    op = draw(st.sampled_from(['"c"', '"r"', '"u"', '"d"', '"U"', '"x"', "1", "null"]))
    side = "before" if op in ('"d"',) else "after"
    shape = draw(st.integers(0, 14))
    if shape == 0:
        return draw(st.sampled_from(["", "null", " null ", "{", '{"op": "c", "after": {"id": 1}', "[1]", '"s"',
                                     "{'op': 'c', 'after': {'id': 1, 'req': 'r'}}"]))
    if shape == 1:
        return f'{{"payload": {{"op": {op}, "{side}": {{{body}}}}}}}'
    if shape == 2:
        return f'{{"payload": null, "op": {op}, "{side}": {{{body}}}}}'
    if shape == 3:  # text after the object: Spark's reader ignores it, Python's json refuses the line
        after = draw(st.sampled_from(['{"op": "c"}', " {}", "x", " 5", ",", "]", "}", "],[1", ', {"a": 1}', "\f{}",
                                      " ", "\t"]))
        return f'{{"op": {op}, "{side}": {{{body}}}}}{after}'
    if shape == 4:
        return f'{{"op": {op}, "{side}": null}}'
    if shape in (5, 6):  # Debezium's order: both images first, the op last
        other = draw(st.sampled_from(["null", f"{{{body}}}", '{"id": 9, "req": 1.5, "extra": {"a": 1, "a": 2}}']))
        images = {side: f"{{{body}}}", "after" if side == "before" else "before": other}
        return (f'{{"before": {images["before"]}, "after": {images["after"]}, "source": {{"table": "t"}}, '
                f'"op": {op}, "ts_ms": 1}}')
    return f'{{"op": {op}, "before": null, "{side}": {{{body}}}, "source": {{"table": "t"}}}}'


class _Line:
    def __init__(self, offset: int, raw: str, uri: str) -> None:
        self.file_index, self.source_file, self.source_offset, self.raw = 0, uri, offset, raw


def _by_python_rules(raws: list[str], uri: str, schema: T.StructType) -> Iterator[tuple]:
    columns = [(f.name, f.dataType.json(), f.nullable) for f in schema.fields]
    offsets = _offsets(raws)
    rows = python_partition(columns, KEYS, set(schema.names), False)(
        _Line(o, r, uri) for o, r in zip(offsets, raws, strict=True))
    notes_at = len(schema.fields) + 6
    for row in rows:
        notes = {k: v for k, v in row[notes_at].items() if k != PYTHON_RULES}
        yield (*row[:notes_at], notes, *row[notes_at + 1:])


def _offsets(raws: list[str]) -> list[int]:
    """The text reader's position keys (``landing_lines``): a test file is one split, so each line's index."""
    return list(range(len(raws)))


class Routing(NamedTuple):
    fast: int                   # lines typed by the native reader
    routed: int                 # lines left to the Python rules
    native_offsets: set[int]    # position keys of the native lines (to name which line went where)


def _compare(spark, tmp_path, raws: list[str], schema: T.StructType = SCHEMA,
             branches: list[native.SchemaBranch] | None = None, in_java: bool = True) -> Routing:
    path = tmp_path / f"{uuid.uuid4().hex}.json"
    path.write_text("\n".join(raws) + "\n")
    uri = str(path)
    if branches is None:  # every schema block of the lines becomes a branch (a batch samples a few lines per file)
        branches = list({b.prefix: b for b in map(native.schema_branch, raws) if b is not None}.values())
    typed = native.coerce_lines(landing_lines.lines(spark, landing.describe([uri])), native.columns_of(schema),
                                KEYS, schema.names, native.utc(spark), ORDER_FILE_SHIFT, branches, in_java=in_java)
    classified = typed.frame.persist()
    typed_by = classified._jdf.queryExecution().analyzed().toString()  # the JVM typer's rows: one mapped scan
    assert typed_by.startswith("LogicalRDD") == (in_java and not branches), "the typing asked for is the one planned"
    assert (typed.tally is not None) == typed_by.startswith("LogicalRDD"), "the JVM typer, and only it, tallies"
    try:
        aggregated = _figures(classified)  # the rows' first computation (then cached): the typer counts it once
        assert typed.tally is None or typed.tally.figures() == aggregated, "the tally is the figures' aggregate"
        assert typed.tally is None or typed.tally.ranges() == _ranges(classified, KEYS), "and its key range"
        fast, routed = native.split(classified)
        columns = [(f.name, f.dataType.json(), f.nullable) for f in schema.fields]
        slow = spark.createDataFrame(routed.rdd.mapPartitions(python_partition(columns, KEYS, set(schema.names),
                                                                                False)), rows_schema(schema.fields))
        strip = F.map_filter(NOTES, lambda k, _: k != PYTHON_RULES).alias(NOTES)
        kept = [F.col("`" + c.replace("`", "``") + "`") for c in fast.columns if c not in (NOTES, WIDEN)]
        got = fast.unionByName(slow).select(*kept, strip)
        expected = spark.createDataFrame(list(_by_python_rules(raws, uri, schema)), rows_schema(schema.fields)).select(
            *kept, NOTES)
        # maps are not comparable in Spark: compare their entries as sorted arrays; the raw line is kept
        # only where something reads it (dead letters, lines for the Python rules)
        got, expected = (df.withColumn(NOTES, F.array_sort(F.map_entries(NOTES)))
                         .withColumn(RAW, F.when(F.col(REASON).isNotNull(), F.col(RAW))) for df in (got, expected))
        missing = expected.exceptAll(got).orderBy(SOURCE_OFFSET).collect()
        extra = got.exceptAll(expected).orderBy(SOURCE_OFFSET).collect()
        assert not missing and not extra, f"Python rules {missing[:3]} vs native {extra[:3]}"
        offsets = {r[0] for r in fast.select(SOURCE_OFFSET).collect()}   # test oracle: a few dozen lines
        return Routing(len(offsets), routed.count(), offsets)
    finally:
        classified.unpersist()


def _figures(frame) -> dict[str, int]:
    """What the typer's tally counts, aggregated over its rows (no extra column here: none set)."""
    fast = F.col(native.FAST)
    row = frame.agg(F.sum(fast.cast("long")), F.sum((fast & (F.col(OP_COLUMN) == TOMBSTONE)).cast("long")),
                    F.sum((fast & F.col(REASON).isNotNull()).cast("long")),
                    F.sum(F.when(fast, F.coalesce(F.col(NOTES)[IGNORED_FIELDS], F.lit(0)))),
                    F.sum((~fast).cast("long"))).first()
    return dict(zip(TALLY_SLOTS, [*(int(v or 0) for v in row), 0], strict=True))


def _ranges(frame, keys) -> dict[str, tuple]:
    """Spark's min and max of each key over the rows typed whole (a key none of them holds left out)."""
    fast = F.col(native.FAST)
    row = frame.agg(*[f(F.when(fast, F.col(k))) for k in keys for f in (F.min, F.max)]).first()
    return {k: (row[2 * i], row[2 * i + 1]) for i, k in enumerate(keys) if row[2 * i] is not None}


def test_the_tally_keeps_the_key_range_spark_orders(spark, tmp_path):
    """String keys by their UTF-8 bytes (as Spark's min/max; not Java's UTF-16 order), date keys as dates;
    a line left to the Python rules or dead-lettered widens nothing."""
    schema = T.StructType([T.StructField("k", T.StringType(), False), T.StructField("day", T.DateType(), False),
                           T.StructField("v", T.LongType())])
    keys = ("k", "day")
    texts = ["zzz", "\uffff", "\U0001F600", "zz", "Z", "ab"]  # U+FFFF sorts below U+1F600 in UTF-8, not in UTF-16
    raws = [json.dumps({"op": "c", "after": {"k": k, "day": f"2024-0{1 + i}-1{i}", "v": i}})
            for i, k in enumerate(texts)]
    raws[0] = raws[0].replace('"v": 0', '"v": "not a number"')  # not typed whole: no range from it ("zzz")
    raws.append(json.dumps({"op": "c", "after": {"k": "\u0000", "v": 1}}))  # no day: a dead letter, no range
    path = tmp_path / "keys.json"
    path.write_text("\n".join(raws) + "\n")
    typed = native.coerce_lines(landing_lines.lines(spark, landing.describe([str(path)])), native.columns_of(schema),
                                keys, schema.names, native.utc(spark), ORDER_FILE_SHIFT)
    classified = typed.frame.persist()
    try:
        expected = _ranges(classified, keys)
        assert typed.tally is not None and typed.tally.ranges() == expected
        assert expected["k"] == ("Z", "\U0001F600") and expected["day"] == (datetime.date(2024, 2, 11),
                                                                            datetime.date(2024, 6, 15))
    finally:
        classified.unpersist()


# A line the native reader must type (every column kind it decodes, written plainly).
PLAIN = json.dumps({"op": "u", "before": None, "after": {
    "id": 42, "s": "plain", "d": 2.5, "dec": "12.34", "big": 7, "b": True, "day": "2024-03-01",
    "ts": "2024-03-01T10:00:00.5+02:00", "ntz": 1700000000000, "bin": "aGk=", "i": 3, "req": "r"}})


def _with_plain_line(raws: list[str], at: int, plain: str = PLAIN) -> tuple[list[str], int]:
    """``raws`` with ``plain`` inserted at ``at``, and that line's position key."""
    at = min(at, len(raws))
    raws = [*raws[:at], plain, *raws[at:]]
    return raws, _offsets(raws)[at]


def _assert_routing(routing: Routing, raws: list[str], plain_offset: int) -> None:
    assert routing.fast + routing.routed == len(raws), routing      # each line on exactly one path
    assert plain_offset in routing.native_offsets, routing          # the plain line really went native


# Each line is typed on its own, so what the default run needs is many random lines, not many batches: a
# batch costs a handful of Spark jobs whatever its size, so few large batches (CI time, issue 28).
# Both typings of plain lines: the Java parser (``native.line_typer``) and Spark expressions (a machine without a
# JDK's javac, and every line of a batch with schema blocks).
TYPINGS = pytest.mark.parametrize("in_java", [True, False], ids=["java", "expressions"])


@TYPINGS
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(lines(), min_size=1, max_size=180), st.integers(0, 180))
def test_native_rows_equal_the_python_rules(spark, tmp_path, in_java, raws, at):
    raws, plain_offset = _with_plain_line(raws, at)
    _assert_routing(_compare(spark, tmp_path, raws, in_java=in_java), raws, plain_offset)


@pytest.mark.slow
@TYPINGS
@settings(max_examples=150, deadline=None, derandomize=False, suppress_health_check=list(HealthCheck))
@given(st.lists(lines(), min_size=1, max_size=200), st.integers(0, 200))
def test_native_rows_equal_the_python_rules_deep(spark, tmp_path, in_java, raws, at):
    raws, plain_offset = _with_plain_line(raws, at)
    _assert_routing(_compare(spark, tmp_path, raws, in_java=in_java), raws, plain_offset)


@TYPINGS
def test_plain_lines_take_the_native_path_and_odd_ones_do_not(spark, tmp_path, in_java):
    rng = random.Random(5)
    plain = [json.dumps({"op": rng.choice("cud"), "before": {"id": i, "req": "r"}, "after": {
        "id": i, "s": f"name [{i}]" if i % 2 else f"name {i}", "d": rng.random() * 100, "dec": f"{rng.randint(0, 10**6) / 100:.2f}",
        "big": rng.randint(-10**9, 10**9), "b": rng.random() < 0.5, "day": "2024-03-01",
        "ts": "2024-03-01T10:00:00.5+02:00", "ntz": 1700000000000 + i, "bin": "aGk=", "i": i, "req": "r"}})
        for i in range(200)]
    odd = ['{"op": "c", "after": {"id": 1, "req": "r", "s": 12}}',         # a number into a string column
           '{"op": "c", "after": {"id": 1, "req": "r", "dec": 1.234}}',    # more digits than the scale
           '{"op": "c", "after": {"id": 1, "req": "r", "f": 1.5}}',        # float: narrowed by the Python rules
           '{"op": "c", "after": {"id": " 1", "req": "r"}}',                # a key with spaces (Python strips)
           '{"op": "c", "after": {"id": 1, "req": "r"}}]',                  # text after the object: Spark
           '{"op": "c", "after": {"id": 1, "req": "r"}}}',                  # ignores it, Python refuses it
           '{"op": "c", "after": {"id": 1, "req": "r"}} x']
    fast, routed, native_offsets = _compare(spark, tmp_path, plain + odd, in_java=in_java)
    assert (fast, routed) == (len(plain), len(odd))
    assert native_offsets == set(_offsets(plain + odd)[:len(plain)])     # exactly the plain lines


@TYPINGS
def test_odd_column_names_and_exact_key_names(spark, tmp_path, in_java):
    """Dots, spaces, backticks and unicode in column names; keys match by their exact name only."""
    schema = T.StructType([T.StructField("id", T.LongType(), False), T.StructField("a.b", T.StringType()),
                           T.StructField("sp ace", T.DecimalType(6, 2)), T.StructField("q`uote", T.LongType()),
                           T.StructField("prix €", T.DoubleType())])
    raws = ['{"op": "c", "after": {"id": 1, "a.b": "x", "sp ace": "1.25", "q`uote": 3, "prix €": 2.5}}',
            '{"op": "c", "after": {"id": 2, "ID": 9, "A.B": "y", "sp ace": 1.255}}',
            '{"op": "u", "after": {"id": 3, "sp\\u0020ace": 1.5, "q`uote": 1.5}}',
            '{"op": "d", "before": {"id": 4, "a.b": "gone"}}']
    fast, routed, _ = _compare(spark, tmp_path, raws, schema, in_java=in_java)
    assert fast >= 2 and routed >= 1


# --- Lines with a Connect schema block (JsonConverter schemas.enable=true), as Debezium writes them ------

DECIMAL = "org.apache.kafka.connect.data.Decimal"


def _decimal_schema(scale: str) -> dict:
    return {"type": "bytes", "optional": True, "name": DECIMAL, "version": 1,
            "parameters": {"scale": scale, "connect.decimal.precision": "10"}}


# Field schemas a producer writes (and some it should not): every logical type the Python rules decode.
field_schemas = st.sampled_from([
    None, {"type": "int64"}, {"type": "int32", "optional": False}, {"type": "string"}, {"type": "double"},
    {"type": "boolean"}, {"type": "bytes"}, {"type": "float"},
    _decimal_schema("2"), _decimal_schema("0"), _decimal_schema("3"), _decimal_schema("6"), _decimal_schema("8"),
    _decimal_schema(" 2"), {"type": "string", "name": DECIMAL, "parameters": {"scale": "2"}},
    {"type": "int32", "name": "io.debezium.time.Date"}, {"type": "int32", "name": "org.apache.kafka.connect.data.Date"},
    {"type": "int64", "name": "io.debezium.time.Timestamp"}, {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
    {"type": "int64", "name": "io.debezium.time.NanoTimestamp"},
    {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
    {"type": "string", "name": "io.debezium.time.IsoTimestamp"}, {"type": "int64", "name": "io.debezium.time.MicroTime"},
    {"type": "string", "name": "io.debezium.data.Uuid"}, {"type": "bytes", "name": "io.debezium.data.Bits"},
    {"type": "string", "name": "io.debezium.data.Json"}, {"type": "int32", "name": "io.debezium.time.Year"},
    {"type": "struct", "fields": [{"type": "int32", "field": "x"}]}, {"type": "int128"}])



def test_one_table_of_logical_decodings():
    """``debezium.LOGICAL_DECODINGS`` is what both sides dispatch on: each entry has an Iceberg type, and the
    native reader has a twin exactly for the entries marked native (a missing twin would route silently)."""
    assert set(debezium.LOGICAL_DECODINGS) <= set(si.LOGICAL_TYPES)
    for name, entry in debezium.LOGICAL_DECODINGS.items():
        physical = "bytes" if entry.kind is debezium.Logical.DECIMAL else "int64"
        kind = native.field_decoding({"type": physical, "name": name}).kind
        assert (kind is not native.Decoding.OTHER) == entry.native, name
        if entry.native:
            assert kind.value is entry.kind, name

def _base64_of(n: int) -> str:
    """A Connect Decimal's unscaled value as JsonConverter writes it (minimal two's-complement bytes)."""
    return '"' + base64.b64encode(n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True)).decode() + '"'


schema_tokens = st.one_of(
    tokens,
    st.integers(-(10 ** 20), 10 ** 20).map(_base64_of),                      # Connect Decimal unscaled values
    st.sampled_from([0, 1, -1, 1234, -1234, 120000, 99999999, 10**10, 2**63 - 1, -(2**63)]).map(_base64_of),
    st.just('""'),                                                             # no bytes: unscaled 0
    st.sampled_from(["19000", "-719162", "-719163", "2932896", "2932897", "1700000000123", "1700000000123456",
                     "1700000000123456000", "1700000000123456789", "-62135596800000", "-62135596800001",
                     "253402300799999", "253402300800000", "9223372036854775807", '"1700000000123"', "1.5e3"]),
    st.sampled_from(['"2024-02-29T12:34:56Z"', '"2024-02-29T12:34:56.123456+02:00"', '"2024-02-29 12:34:56-05:00"',
                     '"2024-02-29T12:34:56"', '"2024-02-29T12:34:56.123456789Z"', '"2024-02-30T12:00:00Z"',
                     '"0001-01-01T00:00:00Z"', '"9999-12-31T23:59:59.999999-01:00"']))


@st.composite
def schema_blocks(draw: st.DrawFn) -> dict:
    names = [f.name for f in SCHEMA.fields] + ["extra", "when"]

    def image() -> dict:
        picked = draw(st.dictionaries(st.sampled_from(names), field_schemas, max_size=len(names)))
        return {"type": "struct", "optional": True, "name": "srv.db.t.Value",
                "fields": [{**f, "field": n} for n, f in picked.items() if f is not None]}
    after = image()
    before = after if draw(st.booleans()) else image()
    sides = [{**before, "field": "before"}, {**after, "field": "after"}]
    if draw(st.integers(0, 5)) == 0:
        sides = sides[1:]  # no "before" schema: a delete's image is read as is
    return {"type": "struct", "name": "srv.db.t.Envelope", "optional": False,
            "fields": [*sides, {"type": "string", "optional": False, "field": "op"},
                       {"type": "int64", "optional": True, "field": "ts_ms"}]}


@st.composite
def schema_lines(draw: st.DrawFn, blocks: list[str]) -> str:
    block = draw(st.sampled_from(blocks))
    names = [f.name for f in SCHEMA.fields] + ["extra", "when"]
    image = {"id": draw(st.sampled_from(["1", "2", "3", '"4"', "null"])), "req": '"r"',
             **draw(st.dictionaries(st.sampled_from(names), schema_tokens, max_size=8))}
    body = ", ".join(f'"{k}": {v}' for k, v in image.items())
    op = draw(st.sampled_from(['"c"', '"r"', '"u"', '"d"', '"x"', "null"]))
    side = "before" if op == '"d"' else "after"
    other = "after" if side == "before" else "before"
    payload = f'{{"{other}": null, "{side}": {{{body}}}, "source": {{"table": "t"}}, "op": {op}, "ts_ms": 1}}'
    odd_shapes = [f'{{"schema": {block}, "payload": {payload}, "schema": null}}',   # a second schema key
                  f'{{"schema": {block}, "payload": {payload}, "payload": null}}',  # the last payload wins
                  f'{{"schema": null, "payload": {payload}}}', f'{{"schema": {block}, "payload": null}}',
                  f'{{"payload": {payload}, "schema": {block}}}']
    shape = draw(st.integers(0, 11))
    return odd_shapes[shape] if shape < len(odd_shapes) else f'{{"schema": {block}, "payload": {payload}}}'


@st.composite
def schema_batches(draw: st.DrawFn, max_blocks: int = 2, max_lines: int = 40) -> list[str]:
    blocks = [json.dumps(b, separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
              for b in draw(st.lists(schema_blocks(), min_size=1, max_size=max_blocks))]
    return draw(st.lists(schema_lines(blocks), min_size=1, max_size=max_lines))


# A line with a schema block of its own that the native reader must decode (int64 key, string).
PLAIN_WITH_SCHEMA = json.dumps({"schema": {"type": "struct", "name": "srv.db.t.Envelope", "optional": False, "fields": [
    {"type": "struct", "optional": True, "field": "after", "fields": [
        {"type": "int64", "optional": False, "field": "id"}, {"type": "string", "optional": False, "field": "req"},
        {"type": "string", "optional": True, "field": "s"}]},
    {"type": "string", "optional": False, "field": "op"}]},
    "payload": {"op": "c", "after": {"id": 42, "req": "r", "s": "plain"}}})


# As above: as many blocks and lines as 15 small batches, in 5 (each block is its own branch).
@pytest.mark.long
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema_batches(max_blocks=6, max_lines=120), st.integers(0, 120))
def test_schema_block_lines_equal_the_python_rules(spark, tmp_path, raws, at):
    raws, plain_offset = _with_plain_line(raws, at, PLAIN_WITH_SCHEMA)
    _assert_routing(_compare(spark, tmp_path, raws), raws, plain_offset)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, derandomize=False, suppress_health_check=list(HealthCheck))
@given(schema_batches(), st.integers(0, 40))
def test_schema_block_lines_equal_the_python_rules_deep(spark, tmp_path, raws, at):
    raws, plain_offset = _with_plain_line(raws, at, PLAIN_WITH_SCHEMA)
    _assert_routing(_compare(spark, tmp_path, raws), raws, plain_offset)


def test_debezium_schema_block_lines_take_the_native_path(spark, tmp_path):
    """Lines as Debezium's JsonConverter writes them (schemas.enable=true; Decimal as bytes, Date as days,
    MicroTimestamp, ZonedTimestamp, bytes): decoded natively, equal to the Python rules; a line with a block
    not sampled, or a value that would lose digits, is routed."""
    value = {"type": "struct", "optional": True, "name": "dbserver1.inventory.t.Value", "fields": [
        {"type": "int64", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "s"},
        {"type": "double", "optional": True, "field": "d"}, {**_decimal_schema("2"), "field": "dec"},
        {**_decimal_schema("4"), "field": "big"}, {"type": "boolean", "optional": True, "field": "b"},
        {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "day"},
        {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1, "field": "ts"},
        {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "ntz"},
        {"type": "bytes", "optional": True, "field": "bin"}, {"type": "int32", "optional": True, "field": "i"},
        {"type": "string", "optional": False, "field": "req"}]}
    envelope = {"type": "struct", "optional": False, "name": "dbserver1.inventory.t.Envelope", "version": 1, "fields": [
        {**value, "field": "before"}, {**value, "field": "after"},
        {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source", "field": "source",
         "fields": [{"type": "string", "optional": False, "field": "table"}]},
        {"type": "string", "optional": False, "field": "op"}, {"type": "int64", "optional": True, "field": "ts_ms"}]}
    rng = random.Random(7)

    def row(i: int) -> dict:
        return {"id": i, "s": f"name {i}", "d": rng.random() * 100, "dec": json.loads(_base64_of(rng.randint(-10**8, 10**8))),
                "big": json.loads(_base64_of(rng.randint(-10**15, 10**15))), "b": rng.random() < 0.5, "day": 19000 + i,
                "ts": "2024-03-01T10:00:00.5+02:00", "ntz": 1700000000000000 + i, "bin": "aGk=", "i": i, "req": "r"}
    plain = []
    for i in range(200):
        op = rng.choice("crud")
        before, after = (row(i), None) if op == "d" else (None if op in "cr" else row(i), row(i))
        plain.append(json.dumps({"schema": envelope, "payload": {"before": before, "after": after, "op": op,
                                                                 "source": {"table": "t"}, "ts_ms": 1}}))
    changed = {**envelope, "name": "dbserver1.inventory.t.Envelope2"}
    odd = [json.dumps({"schema": changed, "payload": {"after": row(500), "op": "c"}}),       # a block not sampled
           json.dumps({"schema": envelope, "payload": {"after": {**row(501), "dec": json.loads(_base64_of(2**70))},
                                                       "op": "c"}}),                          # more than 8 bytes
           json.dumps({"schema": envelope, "payload": {"after": {**row(502), "ntz": "1700000000000000"},
                                                       "op": "c"}}),                          # an epoch as a string
           json.dumps({"schema": envelope, "payload": {"after": {**row(503), "dec": 0}, "op": "c"}}),  # not base64
           json.dumps({"schema": envelope, "payload": {"after": {**row(504), "dec": "abc"}, "op": "c"}})]
    path = tmp_path / "lines.json"
    path.write_text("\n".join(plain + odd) + "\n")
    branches = native.sample_branches(landing.describe([str(path)]))
    assert [b.prefix for b in branches] == [plain[0].split('"payload"', 1)[0]]
    assert branches[0].after is not None and branches[0].after["dec"] == native.FieldDecoding(native.Decoding.DECIMAL, 2)
    fast, routed, native_offsets = _compare(spark, tmp_path, plain + odd, branches=branches)
    assert (fast, routed) == (len(plain), len(odd))
    assert native_offsets == set(_offsets(plain + odd)[:len(plain)])


def test_a_malformed_schema_block_is_not_a_branch_and_its_lines_dead_letter(spark, tmp_path):
    """A block the rules cannot read (here a field name that is a list) first in the file: sampling it must not
    fail the batch; its lines take the Python rules and become dead letters, the well-formed lines stay native."""
    good = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"type": "int64", "optional": False, "field": "id"}, {"type": "string", "optional": False, "field": "req"}]}]}
    bad = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"type": "int64", "optional": False, "field": ["id"]}]}]}
    lines = [json.dumps({"schema": bad, "payload": {"op": "c", "after": {"id": 1, "req": "r"}}})]
    lines += [json.dumps({"schema": good, "payload": {"op": "c", "after": {"id": i, "req": "r"}}}) for i in range(2, 6)]
    assert native.schema_branch(lines[0]) is None and native.schema_branch(lines[1]) is not None
    path = tmp_path / "lines.json"
    path.write_text("\n".join(lines) + "\n")
    branches = native.sample_branches(landing.describe([str(path)]))
    assert [b.prefix for b in branches] == [lines[1].split('"payload"', 1)[0]]
    assert _compare(spark, tmp_path, lines, branches=branches)[:2] == (4, 1)
