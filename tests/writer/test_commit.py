"""What one batch costs the target table and what it reports: counts read from the MERGE's own commit
(issue 12), checked against a model of the table over random batches, and the metadata commits a batch
makes. Real Spark, real Iceberg tables in a SQLite catalog; nothing mocked.

The model is the truth for the counts: the batch collapsed per key (last image wins), a last delete
of a key the table holds is ``deleted``, of an absent key ``delete_missing``, a last insert/upsert of
a held key ``updated`` (a re-delivered insert too), of an absent key ``inserted``. That is what the
former count (every batch key joined with the target's keys) computed; it is kept as the fallback."""

import datetime as dt
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icecdc_dagster.writer import merge
from icecdc_dagster.writer.exactly_once import (
    LEDGER_PROPERTY,
    LEDGER_SEALED_PREFIX,
    STAGING_BRANCH,
    decode_ledger,
    encode_ledger,
    java_table,
    ledger_entries,
    ledger_update,
)
from icecdc_dagster.writer.merge import (
    COUNTED_BY_JOIN,
    COUNTED_BY_SOURCE,
    OP_COLUMN,
    OP_DELETE,
    OP_INSERT,
    OP_UPSERT,
    ORDER_COLUMN,
    write_batch,
)

# (format version, write mode, delete granularity, keys only, switch to copy-on-write after the second batch)
TABLES = {
    "v2-cow": (2, "copy-on-write", None, False, False),
    "v2-mor": (2, "merge-on-read", None, False, False),  # Spark's default delete granularity: file
    "v2-mor-partition-granularity": (2, "merge-on-read", "partition", False, False),
    "v2-mor-keys-only": (2, "merge-on-read", None, True, False),
    "v2-mor-then-cow": (2, "merge-on-read", None, False, True),
    "v3-cow": (3, "copy-on-write", None, False, False),
    "v3-mor": (3, "merge-on-read", None, False, False),
}
KEYS = 12
_names = itertools.count()


def _create(spark, cat: str, kind: str) -> str:
    version, mode, granularity, keys_only, _ = TABLES[kind]
    name = f"{cat}.db.t{next(_names)}"
    props = {"format-version": str(version), "write.merge.mode": mode, "write.update.mode": mode,
             "write.delete.mode": mode}
    if granularity:
        props["write.delete.granularity"] = granularity
    columns = "id bigint NOT NULL" if keys_only else "id bigint NOT NULL, v string"
    tblprops = ", ".join(f"'{k}'='{v}'" for k, v in props.items())
    # two partitions: a MERGE touches some files and not others
    spark.sql(f"CREATE TABLE {name} ({columns}) USING iceberg PARTITIONED BY (bucket(2, id)) "
              f"TBLPROPERTIES ({tblprops})")
    return name


def _frame(spark, rows, keys_only: bool):
    if keys_only:
        return spark.createDataFrame([(k, op, i) for i, (k, op, _) in enumerate(rows)],
                                     f"id bigint, {OP_COLUMN} string, {ORDER_COLUMN} bigint")
    return spark.createDataFrame([(k, None if op == OP_DELETE else v, op, i) for i, (k, op, v) in enumerate(rows)],
                                 f"id bigint, v string, {OP_COLUMN} string, {ORDER_COLUMN} bigint")


def _expected(model: dict[int, str | None], rows) -> dict[str, int]:
    """The batch's counts from the model, and the model moved past the batch."""
    last: dict[int, tuple[str, str | None]] = {}
    for key, op, value in rows:
        last[key] = (op, value)
    counts: dict[str, int] = {}
    for key, (op, value) in last.items():
        held = key in model
        name = ("deleted" if held else "delete_missing") if op == OP_DELETE else ("updated" if held else "inserted")
        counts[name] = counts.get(name, 0) + 1
        if op == OP_DELETE:
            model.pop(key, None)
        else:
            model[key] = value
    return counts


def _assert_content(spark, table: str, model: dict[int, str | None], keys_only: bool) -> None:
    expected = _frame(spark, [(k, OP_UPSERT, v) for k, v in model.items()], keys_only).drop(OP_COLUMN, ORDER_COLUMN)
    actual = spark.table(table)
    assert actual.count() == len(model)
    assert actual.exceptAll(expected).count() == 0 and expected.exceptAll(actual).count() == 0


def _apply(spark, table: str, kind: str, batches) -> list[str]:
    """Write every batch, checking its counts against the model; returns how each batch was counted."""
    _, _, _, keys_only, switch = TABLES[kind]
    model: dict[int, str | None] = {}
    how = []
    for n, rows in enumerate(batches):
        if switch and n == 2:
            spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('write.merge.mode'='copy-on-write', "
                      "'write.update.mode'='copy-on-write', 'write.delete.mode'='copy-on-write')")
        want = _expected(model, rows)
        outcome = write_batch(spark, table, _frame(spark, rows, keys_only), ("id",), f"b{n}")
        assert outcome.counts == want, (kind, n, rows, outcome.counted_by)
        how.append(outcome.counted_by)
    _assert_content(spark, table, model, keys_only)
    return how


ops = st.sampled_from([OP_INSERT, OP_UPSERT, OP_DELETE])
batch_rows = st.lists(st.tuples(st.integers(0, KEYS - 1), ops, st.sampled_from(["a", "b", "c"])),
                      min_size=1, max_size=10)
# the first batch fills the table (so later ones update, delete and re-deliver held keys), then 1-3 random ones
batches = st.tuples(st.lists(st.tuples(st.integers(0, KEYS - 1), st.just(OP_INSERT), st.just("x")),
                             min_size=4, max_size=KEYS),
                    st.lists(batch_rows, min_size=1, max_size=3)).map(lambda t: [t[0], *t[1]])
COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}


@pytest.mark.parametrize("kind", sorted(TABLES))
@settings(max_examples=3, **COMMON)
@given(data=batches)
def test_counts_match_the_model(spark, catalog, catalog_settings, kind, data):
    _apply(spark, _create(spark, catalog_settings.name, kind), kind, data)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(TABLES))
@settings(max_examples=25, derandomize=False, **COMMON)
@given(data=batches)
def test_counts_match_the_model_deep(spark, catalog, catalog_settings, kind, data):
    _apply(spark, _create(spark, catalog_settings.name, kind), kind, data)


FILL = [(k, OP_INSERT, "x") for k in range(KEYS)]
# updates (touching every file of FILL), a re-delivered insert, an insert
UPSERTS = [(k, OP_UPSERT, "u") for k in range(6)] + [(6, OP_INSERT, "r"), (20, OP_UPSERT, "n")]
# a delete, a delete of an absent key, an update, an insert: all in FILL's files (they have deletes by now)
DELETES = [(7, OP_DELETE, None), (30, OP_DELETE, None), (8, OP_UPSERT, "u"), (40, OP_INSERT, "n")]


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_every_kind_is_counted_in_the_merges_own_job(spark, catalog, catalog_settings, kind):
    """Copy-on-write or merge-on-read, v2 or v3, delete files around or not: the counts come from the MERGE's
    source (each key's presence in the snapshot it merged into), never from a second read of the target."""
    table = _create(spark, catalog_settings.name, kind)
    assert _apply(spark, table, kind, [FILL, UPSERTS, DELETES, UPSERTS]) == [COUNTED_BY_SOURCE] * 4


@pytest.mark.parametrize("kind", ["v2-mor", "v3-cow", "v2-mor-keys-only"])
def test_matched_rows_are_counted_by_the_clauses_that_take_them(spark, catalog, catalog_settings, monkeypatch, kind):
    """A MERGE with an update clause counts the rows its delete and update clauses take (runtime/MergeTally.java):
    its source is not joined with the target's keys. A keys-only table (no update clause) still joins."""
    joined: list[str] = []
    original = merge._with_presence
    monkeypatch.setattr(merge, "_with_presence", lambda spark_, name, *a: joined.append(name) or original(
        spark_, name, *a))
    table = _create(spark, catalog_settings.name, kind)
    assert _apply(spark, table, kind, [FILL, UPSERTS, DELETES, UPSERTS]) == [COUNTED_BY_SOURCE] * 4
    keys_only = TABLES[kind][3]
    assert bool(joined) == keys_only, joined


def test_counts_fall_back_to_the_join_without_the_observation(spark, catalog, catalog_settings, monkeypatch):
    """When the MERGE's observed counts do not arrive, the batch's keys are joined with the merged-into snapshot."""
    monkeypatch.setattr(merge, "observation_values", lambda observed: None)  # as if it never arrived
    table = _create(spark, catalog_settings.name, "v2-mor")
    assert _apply(spark, table, "v2-mor", [FILL, UPSERTS, DELETES]) == [COUNTED_BY_JOIN] * 3


KEY_TYPES = {"bigint": lambda n: n, "string": lambda n: f"k{n:04d}",
             "date": lambda n: dt.date(2020, 1, 1) + dt.timedelta(days=n)}


@pytest.mark.parametrize("key_type", sorted(KEY_TYPES))
def test_keys_beyond_every_file_are_known_absent_without_reading_the_target(spark, catalog, catalog_settings,
                                                                            monkeypatch, key_type):
    """A batch whose key range no data file of the target can hold (new keys appended past the table's): every
    key is absent, told by the files' statistics, and the MERGE's source is not joined with the target. Where a
    file may hold one (its range overlaps, or it has no statistics) the join still tells; counts exact each time."""
    value = KEY_TYPES[key_type]
    name = f"{catalog_settings.name}.db.keys_{key_type}"
    spark.sql(f"CREATE TABLE {name} (id {key_type} NOT NULL, v string) USING iceberg "
              "TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='merge-on-read')")
    seen: list[bool] = []
    original = merge._reach
    monkeypatch.setattr(merge, "_reach", lambda *a: seen.append(original(*a).within) or original(*a))

    def write(rows, batch_id):
        frame = spark.createDataFrame([(value(k), None if op == OP_DELETE else "v", op, i)
                                       for i, (k, op) in enumerate(rows)],
                                      f"id {key_type}, v string, {OP_COLUMN} string, {ORDER_COLUMN} bigint")
        return write_batch(spark, name, frame, ("id",), batch_id)

    assert write([(k, OP_INSERT) for k in range(10)], "fill").counts == {"inserted": 10}
    appended = write([(20, OP_UPSERT), (21, OP_INSERT), (25, OP_DELETE)], "past")  # past every file's range
    assert appended.counts == {"inserted": 2, "delete_missing": 1} and appended.counted_by == COUNTED_BY_SOURCE
    inside = write([(5, OP_UPSERT), (21, OP_DELETE), (30, OP_UPSERT)], "inside")   # files overlap: the join
    assert inside.counts == {"updated": 1, "deleted": 1, "inserted": 1}
    assert seen == [False, False, True]  # the empty table, the appended batch, the overlapping one
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('write.metadata.metrics.default'='none')")
    write([(40, OP_INSERT)], "unmeasured")          # a file without statistics: it may hold any key
    assert write([(50, OP_UPSERT), (40, OP_DELETE)], "after").counts == {"inserted": 1, "deleted": 1}
    assert seen[-1] is True
    assert sorted(r.id for r in spark.table(name).collect()) == sorted(value(k) for k in (*range(10), 20, 30, 50))


def test_bounds_enter_the_merge_only_where_they_rule_a_file_out(spark, catalog, catalog_settings):
    """The batch's key range goes into the MERGE only where the target's file statistics let it skip a file:
    a literal in a plan is compiled into Spark's generated code, so bounds that skip nothing would only make
    every batch compile new classes. Batches spanning every file compile none after the first."""
    name = f"{catalog_settings.name}.db.reach"
    spark.sql(f"CREATE TABLE {name} (id bigint NOT NULL, v string) USING iceberg "
              "TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='merge-on-read')")
    schema = spark.table(name).schema

    def reach(low: int, high: int) -> tuple[bool, bool]:
        found = merge._reach(spark, name, name, merge.bounds_of_ranges({"id": (low, high)}, ("id",), schema))
        return found.within, found.skips
    assert reach(0, 5) == (False, False)                      # no snapshot: no file
    write_batch(spark, name, _frame(spark, [(k, OP_INSERT, "a") for k in range(10)], False), ("id",), "low")
    write_batch(spark, name, _frame(spark, [(k, OP_INSERT, "b") for k in range(100, 110)], False), ("id",), "high")
    assert reach(5, 7) == (True, True)                        # the high file is ruled out
    assert reach(5, 105) == (True, False)                     # both files may hold a key: nothing skipped
    assert reach(200, 300) == (False, True)                   # past every file
    compiled = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    counts = []
    for n in range(3):  # each batch's range spans both files, and differs from the others'
        rows = [(n, OP_UPSERT, f"u{n}"), (101 + n, OP_UPSERT, f"u{n}"), (50 + n, OP_DELETE, None)]
        outcome = write_batch(spark, name, _frame(spark, rows, False), ("id",), f"span{n}")
        assert outcome.counts == {"updated": 2, "delete_missing": 1}
        counts.append(compiled.getCount())
    assert counts[2] == counts[1], "a batch whose bounds skip no file compiled new code"


def test_a_table_named_like_a_branch_is_planned_as_itself(spark, catalog, catalog_settings):
    """``db.branch_x`` staged as ``db.branch_x.branch_<staging>``: the files planned are the table's own."""
    name = f"{catalog_settings.name}.db.branch_x"
    spark.sql(f"CREATE TABLE {name} (id bigint NOT NULL, v string) USING iceberg "
              "TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='merge-on-read')")
    assert write_batch(spark, name, _frame(spark, FILL, False), ("id",), "b0").counts == {"inserted": KEYS}
    rows = [(KEYS + 5, OP_UPSERT, "n"), (3, OP_DELETE, None)]
    assert write_batch(spark, name, _frame(spark, rows, False), ("id",), "b1").counts == {"inserted": 1, "deleted": 1}


def _metadata_files(table_location: str) -> int:
    return len(list(Path(table_location.removeprefix("file:")).joinpath("metadata").glob("*.metadata.json")))


@pytest.mark.parametrize("kind", ["v2-cow", "v2-mor", "v3-mor"])
def test_a_batch_is_two_metadata_commits(spark, catalog, catalog_settings, kind):
    """The write to the staging branch and the publish (fast-forward + properties); the branch is created
    once and then stays at main's snapshot. Expiry drops it (it is re-created: one commit more, once)."""
    table = _create(spark, catalog_settings.name, kind)
    location = catalog.load_table(table.split(".", 1)[1]).location()
    write_batch(spark, table, _frame(spark, FILL, False), ("id",), "b0")
    for n, rows in enumerate([UPSERTS, DELETES, [(5, OP_DELETE, None)]], start=1):
        before = _metadata_files(location)
        write_batch(spark, table, _frame(spark, rows, False), ("id",), f"b{n}", ledger=True)
        assert _metadata_files(location) - before == 2
        refs = catalog.load_table(table.split(".", 1)[1]).refs()
        assert refs[STAGING_BRANCH].snapshot_id == refs["main"].snapshot_id
    name = table.split(".", 1)[1]
    spark.sql(f"CALL {catalog_settings.name}.system.expire_snapshots(table => '{name}', "
              "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)")
    assert STAGING_BRANCH not in catalog.load_table(name).refs()   # max-ref-age 1 ms: dropped by expiry
    assert len(list(java_table(spark, table).snapshots())) == 1
    before = _metadata_files(location)
    outcome = write_batch(spark, table, _frame(spark, [(6, OP_UPSERT, "z")], False), ("id",), "b9", ledger=True)
    assert outcome.counts == {"updated": 1} and _metadata_files(location) - before == 3


def test_the_ledger_is_sealed_in_chunks_and_read_whole():
    """A publish re-encodes the open chunk only; a full one is sealed under the next number and never
    rewritten; readers see every entry in order (a ledger written before chunks is the open chunk)."""
    props: dict[str, str] = {}
    entries = [{"icecdc.batch-id": f"b{i}"} for i in range(7)]
    for n, entry in enumerate(entries):
        update = ledger_update(props, entry, chunk_entries=3)
        sealed_now = [k for k in update if k.startswith(LEDGER_SEALED_PREFIX)]
        assert sealed_now == ([f"{LEDGER_SEALED_PREFIX}{(n + 1) // 3 - 1}"] if (n + 1) % 3 == 0 else [])
        assert all(props.get(k) is None for k in sealed_now)        # a sealed chunk is written once
        props.update(update)
        assert ledger_entries(props) == entries[:n + 1]
    assert sorted(props) == [LEDGER_PROPERTY, f"{LEDGER_SEALED_PREFIX}0", f"{LEDGER_SEALED_PREFIX}1"]
    legacy = {LEDGER_PROPERTY: encode_ledger(entries)}                 # one unchunked ledger of 7 entries
    legacy.update(ledger_update(legacy, {"icecdc.batch-id": "b7"}, chunk_entries=3))
    assert ledger_entries(legacy) == [*entries, {"icecdc.batch-id": "b7"}]
    assert decode_ledger(legacy[LEDGER_PROPERTY]) == []
