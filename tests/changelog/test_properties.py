"""Property-based differential tests of the changelog engine on real Iceberg tables (Hypothesis).

Random schemas: names Spark would parse (dots, spaces, backticks, unicode), primitive types (decimal up
to 38 digits, date, timestamp with and without zone, binary, float/double, boolean) and nested
struct/list/map. Random workloads on copy-on-write or merge-on-read tables, format v2 or v3: inserts,
MERGE (delete/update/insert), UPDATE to NULL, key moves, no-op rewrites, DELETE, compaction, and for
keyless tables duplicate rows. Oracles:

(a) replaying each snapshot's change rows onto the parent's time-travel state gives the snapshot's
    state (v3: row lineage columns included), and every row carries its snapshot's commit time;
(b) copy-on-write v2 with keys: Iceberg's create_changelog_view(compute_updates => true) gives the same rows;
(c) net changes over a random range replay the range's start state onto its end state;
(d) copy-on-write v2 without keys: Iceberg's create_changelog_view(net_changes => true) gives the same
    rows, credited to the same snapshots.

The default run draws two examples per table kind (about 100 s on an idle 2-core machine). The first is
Hypothesis' simplest draw, which the strategies make rich (special names, decimal(38,10), nested
struct/list, timestamp, map or binary; MERGE, key move, no-op rewrite, delete); the second is random.
``-m slow`` draws 15 random examples per kind (about 12 minutes).
"""

import datetime as dt
import decimal
import itertools
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from icecdc_dagster import changelog
from icecdc_dagster.batch import (
    CHANGE_TYPE,
    COMMIT_SNAPSHOT_ID,
    COMMIT_TIMESTAMP,
    DELETE,
    INSERT,
    UPDATE_AFTER,
    UPDATE_BEFORE,
)
from icecdc_dagster.column_names import quote
from tests.changelog.workload import apply_changes, freeze, mode_properties, rows_at

KEY_NAMES = ["the id", "k.ey", "ключ", "id"]
VALUE_NAMES = ["the.data", "a`b", "ünï côde", "sp ace", "名前", "v", "x.y.z", "UPPER", "c-d", "_x"]
FIELD_NAMES = ["x.y", "z w", "a`b", "ñ", "f"]
OPERATIONS = ["merge", "duplicate", "move_key", "noop", "delete", "compact", "set_null", "insert"]
TIME_MIN, TIME_MAX = dt.datetime(1900, 1, 1), dt.datetime(2200, 12, 31)

RICH_TYPES = [
    T.DecimalType(38, 10),
    T.StructType([T.StructField("x.y", T.IntegerType()), T.StructField("z w", T.ArrayType(T.StringType()))]),
    T.TimestampType(),
    T.MapType(T.StringType(), T.DecimalType(9, 2)),
    T.BinaryType(),
    T.DateType(),
    T.TimestampNTZType(),
    T.DoubleType(),
]
PRIMITIVES = [T.IntegerType(), T.LongType(), T.StringType(), T.DoubleType(), T.FloatType(), T.BooleanType(),
              T.DateType(), T.TimestampType(), T.TimestampNTZType(), T.BinaryType()]


# --- random schemas and values -------------------------------------------------------------------

def decimal_types() -> st.SearchStrategy:
    return st.integers(1, 38).flatmap(lambda p: st.integers(0, min(p, 12)).map(lambda s: T.DecimalType(p, s)))


def data_types(allow_maps: bool) -> st.SearchStrategy:
    primitive = st.sampled_from(PRIMITIVES) | decimal_types()

    def nest(inner: st.SearchStrategy) -> st.SearchStrategy:
        struct = st.lists(st.tuples(st.sampled_from(FIELD_NAMES), inner), min_size=1, max_size=3,
                          unique_by=lambda f: f[0].lower()).map(
            lambda fields: T.StructType([T.StructField(n, t) for n, t in fields]))
        options = [struct, inner.map(T.ArrayType)]
        if allow_maps:
            options.append(st.tuples(st.sampled_from([T.StringType(), T.IntegerType()]), inner).map(
                lambda kv: T.MapType(kv[0], kv[1])))
        return st.one_of(*options)

    return st.recursive(primitive, nest, max_leaves=4)


def values(dtype: T.DataType) -> st.SearchStrategy:
    """Python values Spark writes exactly as given (nullable)."""
    return st.one_of(_values(dtype), st.none())


def _values(dtype: T.DataType) -> st.SearchStrategy:
    if isinstance(dtype, T.IntegerType):
        return st.integers(-2 ** 31, 2 ** 31 - 1)
    if isinstance(dtype, T.LongType):
        return st.integers(-2 ** 63, 2 ** 63 - 1)
    if isinstance(dtype, T.StringType):
        return st.text(max_size=6)
    if isinstance(dtype, T.DoubleType):
        return st.floats(allow_nan=False, allow_infinity=False)
    if isinstance(dtype, T.FloatType):
        return st.floats(allow_nan=False, allow_infinity=False, width=32)
    if isinstance(dtype, T.BooleanType):
        return st.booleans()
    if isinstance(dtype, T.DecimalType):
        # Unscaled integers, scaled exactly: st.decimals (and Python's default 28-digit context) would round
        # a 38-digit bound up to 10^28, one digit too many.
        unscaled = 10 ** dtype.precision - 1
        return st.integers(-unscaled, unscaled).map(lambda n: decimal.Decimal(f"{n}E-{dtype.scale}"))
    if isinstance(dtype, T.DateType):
        return st.dates(TIME_MIN.date(), TIME_MAX.date())
    if isinstance(dtype, T.TimestampType):
        return st.datetimes(TIME_MIN, TIME_MAX, timezones=st.just(dt.UTC))
    if isinstance(dtype, T.TimestampNTZType):
        return st.datetimes(TIME_MIN, TIME_MAX)
    if isinstance(dtype, T.BinaryType):
        return st.binary(max_size=5).map(bytearray)
    if isinstance(dtype, T.StructType):
        return st.tuples(*[values(f.dataType) for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return st.lists(values(dtype.elementType), max_size=3)
    if isinstance(dtype, T.MapType):
        return st.dictionaries(_values(dtype.keyType), values(dtype.valueType), max_size=2)
    raise AssertionError(f"no values for {dtype}")


def ddl(dtype: T.DataType) -> str:
    """Spark SQL type text with every struct field name quoted."""
    if isinstance(dtype, T.StructType):
        return "struct<" + ", ".join(f"{quote(f.name)}: {ddl(f.dataType)}" for f in dtype.fields) + ">"
    if isinstance(dtype, T.ArrayType):
        return f"array<{ddl(dtype.elementType)}>"
    if isinstance(dtype, T.MapType):
        return f"map<{ddl(dtype.keyType)}, {ddl(dtype.valueType)}>"
    return dtype.simpleString()


def has(dtype: T.DataType, kind: type) -> bool:
    if isinstance(dtype, kind):
        return True
    if isinstance(dtype, T.StructType):
        return any(has(f.dataType, kind) for f in dtype.fields)
    if isinstance(dtype, T.ArrayType):
        return has(dtype.elementType, kind)
    if isinstance(dtype, T.MapType):
        return has(dtype.keyType, kind) or has(dtype.valueType, kind)
    return False


@dataclass(frozen=True)
class Table:
    version: int
    mode: str
    keyed: bool
    key: str
    key_type: T.DataType
    columns: tuple[tuple[str, T.DataType], ...]  # value columns
    partition: str  # Spark PARTITIONED BY text, or ""

    @property
    def names(self) -> list[str]:
        return [self.key, *(n for n, _ in self.columns)]

    @property
    def spark_schema(self) -> T.StructType:
        return T.StructType([T.StructField(self.key, self.key_type, nullable=False),
                             *(T.StructField(n, t) for n, t in self.columns)])

    def literal(self, key) -> str:  # noqa: ANN001
        return str(key) if isinstance(self.key_type, T.LongType) else f"'{key}'"


@st.composite
def tables(draw, version: int, mode: str, keyed: bool, allow_maps: bool, allow_binary: bool) -> Table:  # noqa: ANN001
    key = draw(st.sampled_from(KEY_NAMES))
    key_type = draw(st.sampled_from([T.LongType(), T.StringType()]))
    names = draw(st.permutations([n for n in VALUE_NAMES if n.lower() != key.lower()]))[:draw(st.integers(4, 6))]
    allowed = lambda t: (allow_maps or not has(t, T.MapType)) and (allow_binary or not has(t, T.BinaryType))  # noqa: E731
    # The simplest draw takes the first rich types in order; others draw random (nested) types.
    rich = draw(st.permutations([t for t in RICH_TYPES if allowed(t)]))
    columns = tuple((n, draw(data_types(allow_maps).filter(allowed)) if draw(st.booleans()) else rich[i % len(rich)])
                    for i, n in enumerate(names))
    bucketable = [n for n, t in columns if isinstance(t, (T.IntegerType, T.LongType, T.StringType, T.DateType,
                                                          T.DecimalType))]
    partition = draw(st.sampled_from(["", f"bucket(3, {quote(key)})",
                                      *(f"bucket(2, {quote(n)})" for n in bucketable)]))
    return Table(version, mode, keyed, key, key_type, columns, partition)


@st.composite
def programs(draw, table: Table) -> list[tuple]:  # noqa: ANN001
    """An initial insert, then four or more operation kinds in random order (Hypothesis' simplest: the
    first four of OPERATIONS: merge, duplicate (keyless only), key move, no-op rewrite, delete)."""
    row = st.tuples(*[values(t) for _, t in table.columns])
    picks = st.lists(st.integers(0, 1000), min_size=1, max_size=3)
    kinds = [k for k in draw(st.permutations(OPERATIONS)) if table.keyed is False or k != "duplicate"]
    kinds = kinds[:draw(st.integers(4, len(kinds)))]
    program = [("insert", draw(st.lists(row, min_size=3, max_size=8)))]
    for kind in kinds:
        if kind == "insert":
            program.append((kind, draw(st.lists(row, min_size=1, max_size=4))))
        elif kind == "merge":
            program.append((kind, draw(picks), draw(st.lists(st.tuples(st.integers(0, 1000), row), min_size=1,
                                                            max_size=3)),
                            draw(st.lists(row, min_size=1, max_size=3))))
        elif kind in ("noop", "set_null"):
            program.append((kind, draw(picks), draw(st.integers(0, len(table.columns) - 1))))
        elif kind == "compact":
            program.append((kind,))
        else:  # move_key, delete, duplicate
            program.append((kind, draw(picks)))
    return program


# --- running a program on a real table -----------------------------------------------------------

_tables = itertools.count()


class Workload:
    """Runs operations on one fresh table; keeps the live keys (nothing else is modelled)."""

    def __init__(self, spark, catalog_name: str, table: Table):  # noqa: ANN001
        self.spark, self.catalog_name, self.table = spark, catalog_name, table
        self.name = f"db.p{next(_tables)}"
        self.ident = f"{catalog_name}.{self.name}"
        self.live: list = []
        self.next_key = 0
        columns = ", ".join([f"{quote(table.key)} {ddl(table.key_type)} NOT NULL",
                             *(f"{quote(n)} {ddl(t)}" for n, t in table.columns)])
        partition = f"PARTITIONED BY ({table.partition})" if table.partition else ""
        spark.sql(f"CREATE TABLE {self.ident} ({columns}) USING iceberg {partition} "
                  f"{mode_properties(table.version, table.mode)}")

    def new_key(self):  # noqa: ANN201
        self.next_key += 1
        return self.next_key if isinstance(self.table.key_type, T.LongType) else f"key.{self.next_key} ü"

    def chosen(self, picks: list[int]) -> list:
        return sorted({self.live[p % len(self.live)] for p in picks}, key=str) if self.live else []

    def where(self, keys: list) -> str:
        return f"{quote(self.table.key)} IN ({', '.join(self.table.literal(k) for k in keys)})"

    def frame(self, rows: list[tuple], extra: T.StructField | None = None):  # noqa: ANN201
        schema = self.table.spark_schema
        if extra is not None:
            schema = T.StructType([*schema.fields, extra])
        return self.spark.createDataFrame(rows, schema)

    def run(self, step: tuple) -> None:
        kind, args, t, q = step[0], step[1:], self.table, quote
        if kind == "insert":
            keys = [self.new_key() for _ in args[0]]
            self.frame([(k, *r) for k, r in zip(keys, args[0])]).writeTo(self.ident).append()
            self.live += keys
        elif kind == "compact":
            self.spark.sql(f"CALL {self.catalog_name}.system.rewrite_data_files(table => '{self.name}', "
                           f"options => map('rewrite-all', 'true'))")
        elif not self.live:
            return
        elif kind == "merge":
            deletes = self.chosen(args[0])
            updates = {self.live[(p + 1) % len(self.live)]: r for p, r in args[1]}
            updates = {k: r for k, r in updates.items() if k not in deletes}
            inserts = [(self.new_key(), r) for r in args[2]]
            null_row = tuple(None for _ in t.columns)
            source = ([(k, *null_row, "d") for k in deletes] + [(k, *r, "u") for k, r in updates.items()]
                      + [(k, *r, "i") for k, r in inserts])
            view = f"merge_source_{abs(hash(self.ident))}"
            self.frame(source, T.StructField("__op", T.StringType())).createOrReplaceTempView(view)
            sets = ", ".join(f"t.{q(n)} = s.{q(n)}" for n, _ in t.columns)
            names = ", ".join(q(n) for n in t.names)
            self.spark.sql(
                f"MERGE INTO {self.ident} t USING {view} s ON t.{q(t.key)} = s.{q(t.key)} "
                f"WHEN MATCHED AND s.__op = 'd' THEN DELETE WHEN MATCHED THEN UPDATE SET {sets} "
                f"WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({', '.join('s.' + q(n) for n in t.names)})")
            self.live = [k for k in self.live if k not in deletes] + [k for k, _ in inserts]
        elif kind in ("noop", "set_null"):
            column = q(t.columns[args[1]][0])
            value = column if kind == "noop" else "NULL"
            self.spark.sql(f"UPDATE {self.ident} SET {column} = {value} WHERE {self.where(self.chosen(args[0]))}")
        elif kind == "move_key":
            old, new = self.chosen(args[0])[0], self.new_key()
            self.spark.sql(f"UPDATE {self.ident} SET {q(t.key)} = {t.literal(new)} WHERE {self.where([old])}")
            self.live = [new if k == old else k for k in self.live]
        elif kind == "delete":
            gone = self.chosen(args[0])
            self.spark.sql(f"DELETE FROM {self.ident} WHERE {self.where(gone)}")
            self.live = [k for k in self.live if k not in gone]
        elif kind == "duplicate":
            keys = self.chosen(args[0])
            self.spark.sql(f"INSERT INTO {self.ident} SELECT * FROM {self.ident} WHERE {self.where(keys)}")
            self.live += keys


# --- oracles -----------------------------------------------------------------------------------

def compared_columns(table: Table) -> list[str]:
    return table.names + (["_row_id", "_last_updated_sequence_number"] if table.version >= 3 else [])


def view_rows(spark, catalog_name: str, name: str, columns: list[str], start: int | None, end: int,  # noqa: ANN001
              options: str) -> Counter:
    view = f"pv_{abs(hash((name, start, end, options)))}"
    start_option = f"'start-snapshot-id', '{start}', " if start is not None else ""
    spark.sql(f"CALL {catalog_name}.system.create_changelog_view(table => '{name}', changelog_view => '{view}', "
              f"options => map({start_option}'end-snapshot-id', '{end}'), {options})")
    selected = ", ".join(quote(c) for c in [*columns, CHANGE_TYPE, COMMIT_SNAPSHOT_ID])
    return Counter(freeze(tuple(r)) for r in spark.sql(f"SELECT {selected} FROM {view}").collect())


def as_counter(rows: list, columns: list[str]) -> Counter:
    return Counter(freeze(tuple(r[c] for c in [*columns, CHANGE_TYPE, COMMIT_SNAPSHOT_ID])) for r in rows)


def check_table(spark, catalog, catalog_name: str, data, table: Table) -> None:  # noqa: ANN001
    workload = Workload(spark, catalog_name, table)
    for step in data.draw(programs(table), label="program"):
        workload.run(step)
    source = catalog.load_table(workload.name)
    plans = changelog.snapshots_after(source, None)
    keys = (table.key,) if table.keyed else ()
    columns = compared_columns(table)
    states: dict = {}

    def state(snapshot_id: int | None) -> Counter:
        if snapshot_id not in states:
            states[snapshot_id] = rows_at(spark, workload.ident, snapshot_id, columns)
        return states[snapshot_id]

    for plan in plans:  # (a) replay, commit time; (b) Iceberg's view on CoW v2 with keys
        rows = changelog.changes(spark, catalog_name, source, plan.snapshot_id, keys).rows.collect()
        where = f"{plan.operation} snapshot {plan.snapshot_id} of {table}"
        assert apply_changes(state(plan.parent_id), rows, columns) == state(plan.snapshot_id), where
        assert all(round(r[COMMIT_TIMESTAMP].timestamp() * 1000) == plan.committed_at_ms for r in rows), where
        if keys or table.version >= 3:
            per_key = Counter((freeze(r[keys[0] if keys else "_row_id"]), r[CHANGE_TYPE]) for r in rows)
            assert max(per_key.values(), default=1) == 1, where
        if table.mode == "copy-on-write" and table.version == 2 and keys:
            expected = view_rows(spark, catalog_name, workload.name, table.names, plan.parent_id, plan.snapshot_id,
                                 f"compute_updates => true, identifier_columns => array('{quote(table.key)}')")
            assert as_counter(rows, table.names) == expected, where

    ids = [p.snapshot_id for p in plans]
    first = data.draw(st.integers(-1, len(ids) - 2), label="range start index")
    last = data.draw(st.integers(first + 1, len(ids) - 1), label="range end index")
    start, end = (ids[first] if first >= 0 else None), ids[last]
    net = changelog.changes(spark, catalog_name, source, (start, end), keys, net=True).rows.collect()
    # (c) net changes replay the range; at most one before and one after image per key
    assert apply_changes(state(start), net, columns) == state(end), f"net {start}..{end} of {table}"
    if keys:
        assert max(Counter((freeze(r[table.key]), r[CHANGE_TYPE]) for r in net).values(), default=1) == 1
        assert {r[CHANGE_TYPE] for r in net} <= {INSERT, DELETE, UPDATE_BEFORE, UPDATE_AFTER}
    if table.mode == "copy-on-write" and table.version == 2 and not keys:  # (d) Iceberg's keyless net view
        expected = view_rows(spark, catalog_name, workload.name, table.names, start, end, "net_changes => true")
        assert as_counter(net, table.names) == expected, f"net {start}..{end} of {table}"


# Where Iceberg's view is the oracle: no binary (its changelog iterators compare byte[] by reference, so a
# row with a binary value rewritten unchanged stays a DELETE + INSERT there; we cancel it), and without
# keys no maps (the view refuses unorderable columns without identifier columns).
KINDS = [  # version, mode, keyed, maps allowed, binary allowed
    pytest.param(2, "copy-on-write", True, True, False, id="cow-v2-keys"),
    pytest.param(2, "copy-on-write", False, False, False, id="cow-v2-keyless"),
    pytest.param(2, "merge-on-read", True, True, True, id="mor-v2-keys"),
    pytest.param(2, "merge-on-read", False, True, True, id="mor-v2-keyless"),
    pytest.param(3, "copy-on-write", False, True, True, id="cow-v3-row-id"),
    pytest.param(3, "merge-on-read", True, True, True, id="mor-v3-keys"),
]
COMMON = dict(deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large, HealthCheck.filter_too_much])


@pytest.mark.parametrize("version,mode,keyed,allow_maps,allow_binary", [  # the v2 merge-on-read and keyless kinds: -m slow, and the deep run
    p if p.id not in ("cow-v2-keyless", "mor-v2-keyless", "mor-v2-keys") else pytest.param(*p.values, marks=pytest.mark.slow, id=p.id)
    for p in KINDS])
@settings(max_examples=2, **COMMON)
@given(data=st.data())
def test_changes_replay_and_match_iceberg(spark, catalog, catalog_settings, version, mode, keyed, allow_maps,
                                          allow_binary, data):
    table = data.draw(tables(version, mode, keyed, allow_maps, allow_binary), label="table")
    check_table(spark, catalog, catalog_settings.name, data, table)


@pytest.mark.slow
@pytest.mark.parametrize("version,mode,keyed,allow_maps,allow_binary", KINDS)
@settings(max_examples=15, derandomize=False, **COMMON)
@given(data=st.data())
def test_changes_replay_and_match_iceberg_deep(spark, catalog, catalog_settings, version, mode, keyed, allow_maps,
                                               allow_binary, data):
    table = data.draw(tables(version, mode, keyed, allow_maps, allow_binary), label="table")
    check_table(spark, catalog, catalog_settings.name, data, table)
