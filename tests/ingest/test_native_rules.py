"""The native reader gives exactly the rows the Python rules give, line by line (property-based).

The oracle is the Python rules themselves (``debezium.parse_line`` + ``coercion.coerce``, the path every
line took before the native reader): random lines — values of every token kind for columns of every
primitive type, numbers written in many forms (fractions beyond the column's scale, exponents, 2^53+1,
leading zeros, numeric and ISO strings, base64 and not), duplicate keys, unknown fields, single quotes,
two objects on a line, wrapped payloads, tombstones and broken JSON — are typed by
``native.coerce_lines`` + the Python rules for the lines it routes, and compared with the Python rules
applied to every line (values, op, order, dead-letter reason, counted rules). A native-path batch must
also route the plain lines natively (the point of it), which the second test checks.
"""

import json
import random
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.ingest import landing, native
from icecdc_dagster.ingest.pipeline import (NOTES, ORDER_FILE_SHIFT, PYTHON_RULES, RAW, REASON, SOURCE_OFFSET, WIDEN,
                                            _python_partition, _rows_schema)

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
    "170000000000000000", "20200101", "3.4028235e38", "1e400", "NaN", "-Infinity", "1.0"])
strings = st.sampled_from([
    "", "abc", " x ", "12", "1.50", "1,000.5", "true", "TRUE", " true", "2024-02-29", "2023-02-29", "2024-1-1",
    "20240101", "2024-02-29T12:34:56", "2024-02-29 12:34:56.123456", "2024-02-29T12:34:56.1234567Z",
    "2024-02-29T12:34:56+05:30", "2024-02-29T12:34:56Z", "2024-02-29T24:00:00", "1700000000000", "aGVsbG8=",
    "aGVsbG8", "YQ==", "{not json", "[1]", "NaN", "Infinity", "-1e5", "é\\u00e9", "tab\\there", "a\\\"b"])
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
    if shape == 3:
        return f'{{"op": {op}, "{side}": {{{body}}}}}{{"op": "c"}}'
    if shape == 4:
        return f'{{"op": {op}, "{side}": null}}'
    return f'{{"op": {op}, "before": null, "{side}": {{{body}}}, "source": {{"table": "t"}}}}'


class _Line:
    def __init__(self, offset: int, raw: str, uri: str) -> None:
        self.file_index, self.source_file, self.source_offset, self.raw = 0, uri, offset, raw


def _by_python_rules(raws: list[str], uri: str, schema: T.StructType) -> Iterator[tuple]:
    columns = [(f.name, f.dataType.json(), f.nullable) for f in schema.fields]
    offsets = _offsets(raws)
    rows = _python_partition(columns, KEYS, set(schema.names), False)(
        _Line(o, r, uri) for o, r in zip(offsets, raws, strict=True))
    notes_at = len(schema.fields) + 6
    for row in rows:
        notes = {k: v for k, v in row[notes_at].items() if k != PYTHON_RULES}
        yield (*row[:notes_at], notes, *row[notes_at + 1:])


def _offsets(raws: list[str]) -> list[int]:
    out, at = [], 0
    for raw in raws:
        out.append(at)
        at += len(raw.encode()) + 1
    return out


def _compare(spark, tmp_path, raws: list[str], schema: T.StructType = SCHEMA) -> tuple[int, int]:
    path = tmp_path / f"{uuid.uuid4().hex}.json"
    path.write_text("\n".join(raws) + "\n")
    uri = str(path)
    classified = native.coerce_lines(native.lines_frame(spark, landing.describe([uri])), native.columns_of(schema),
                                     KEYS, schema.names, native.utc(spark), ORDER_FILE_SHIFT).persist()
    try:
        fast, routed = native.split(classified)
        columns = [(f.name, f.dataType.json(), f.nullable) for f in schema.fields]
        slow = spark.createDataFrame(routed.rdd.mapPartitions(_python_partition(columns, KEYS, set(schema.names),
                                                                                False)), _rows_schema(schema.fields))
        strip = F.map_filter(NOTES, lambda k, _: k != PYTHON_RULES).alias(NOTES)
        kept = [F.col("`" + c.replace("`", "``") + "`") for c in fast.columns if c not in (NOTES, WIDEN)]
        got = fast.unionByName(slow).select(*kept, strip)
        expected = spark.createDataFrame(list(_by_python_rules(raws, uri, schema)), _rows_schema(schema.fields)).select(
            *kept, NOTES)
        # maps are not comparable in Spark: compare their entries as sorted arrays; the raw line is kept
        # only where something reads it (dead letters, lines for the Python rules)
        got, expected = (df.withColumn(NOTES, F.array_sort(F.map_entries(NOTES)))
                         .withColumn(RAW, F.when(F.col(REASON).isNotNull(), F.col(RAW))) for df in (got, expected))
        missing = expected.exceptAll(got).orderBy(SOURCE_OFFSET).collect()
        extra = got.exceptAll(expected).orderBy(SOURCE_OFFSET).collect()
        assert not missing and not extra, f"Python rules {missing[:3]} vs native {extra[:3]}"
        return fast.count(), routed.count()
    finally:
        classified.unpersist()


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(lines(), min_size=1, max_size=60))
def test_native_rows_equal_the_python_rules(spark, tmp_path, raws):
    _compare(spark, tmp_path, raws)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(lines(), min_size=1, max_size=200))
def test_native_rows_equal_the_python_rules_deep(spark, tmp_path, raws):
    _compare(spark, tmp_path, raws)


def test_plain_lines_take_the_native_path_and_odd_ones_do_not(spark, tmp_path):
    rng = random.Random(5)
    plain = [json.dumps({"op": rng.choice("cud"), "before": {"id": i, "req": "r"}, "after": {
        "id": i, "s": f"name {i}", "d": rng.random() * 100, "dec": f"{rng.randint(0, 10**6) / 100:.2f}",
        "big": rng.randint(-10**9, 10**9), "b": rng.random() < 0.5, "day": "2024-03-01",
        "ts": "2024-03-01T10:00:00.5+02:00", "ntz": 1700000000000 + i, "bin": "aGk=", "i": i, "req": "r"}})
        for i in range(200)]
    odd = ['{"op": "c", "after": {"id": 1, "req": "r", "s": 12}}',         # a number into a string column
           '{"op": "c", "after": {"id": 1, "req": "r", "dec": 1.234}}',    # more digits than the scale
           '{"op": "c", "after": {"id": 1, "req": "r", "f": 1.5}}',        # float: narrowed by the Python rules
           '{"op": "c", "after": {"id": " 1", "req": "r"}}']                # a key with spaces (Python strips)
    fast, routed = _compare(spark, tmp_path, plain + odd)
    assert (fast, routed) == (len(plain), len(odd))


def test_odd_column_names_and_exact_key_names(spark, tmp_path):
    """Dots, spaces, backticks and unicode in column names; keys match by their exact name only."""
    schema = T.StructType([T.StructField("id", T.LongType(), False), T.StructField("a.b", T.StringType()),
                           T.StructField("sp ace", T.DecimalType(6, 2)), T.StructField("q`uote", T.LongType()),
                           T.StructField("prix €", T.DoubleType())])
    raws = ['{"op": "c", "after": {"id": 1, "a.b": "x", "sp ace": "1.25", "q`uote": 3, "prix €": 2.5}}',
            '{"op": "c", "after": {"id": 2, "ID": 9, "A.B": "y", "sp ace": 1.255}}',
            '{"op": "u", "after": {"id": 3, "sp\\u0020ace": 1.5, "q`uote": 1.5}}',
            '{"op": "d", "before": {"id": 4, "a.b": "gone"}}']
    fast, routed = _compare(spark, tmp_path, raws, schema)
    assert fast >= 2 and routed >= 1
