"""Fast tests of the engine's pure DataFrame functions (no Iceberg table involved)."""

import datetime as dt
import decimal
from collections import Counter

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster import changelog
from icecdc_dagster.batch import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from icecdc_dagster.errors import DuplicateKeyChangeError

CHANGE_FIELDS = [T.StructField("_change_type", T.StringType()), T.StructField("_commit_snapshot_id", T.LongType()),
                 T.StructField("_commit_sequence_number", T.LongType()), T.StructField("_change_ordinal", T.IntegerType())]
EPOCH_MS = 1_700_000_000_000


def frame(spark, fields, rows):
    """Change rows; ``_commit_timestamp`` differs per snapshot, as it does in real batches."""
    df = spark.createDataFrame(rows, T.StructType([*fields, *CHANGE_FIELDS]))
    return df.withColumn("_commit_timestamp", F.timestamp_millis(F.col("_commit_snapshot_id") * 1000 + EPOCH_MS))


def summary(df, *cols):
    return Counter(tuple(r[c] for c in (*cols, "_change_type")) for r in df.collect())


def test_carry_over_is_pairwise_null_safe_and_by_value(spark):
    fields = [T.StructField("id", T.LongType()), T.StructField("b", T.BinaryType()),
              T.StructField("m", T.MapType(T.StringType(), T.IntegerType())),
              T.StructField("s", T.StructType([T.StructField("x", T.DecimalType(5, 2))]))]
    row = (1, bytearray(b"\x00\x01"), {"k": 1}, (decimal.Decimal("1.50"),))
    nulls = (2, None, None, None)
    rows = ([(*row, DELETE, 7, 1, 0)] * 3 + [(*row, INSERT, 7, 1, 0)] * 2   # 3 deletes + 2 inserts -> 1 delete
            + [(*nulls, DELETE, 7, 1, 0), (*nulls, INSERT, 7, 1, 0)]        # nulls compare equal
            + [(3, None, {"k": 2}, None, DELETE, 7, 1, 0), (3, None, {"k": 3}, None, INSERT, 7, 1, 0)]
            + [(*row, INSERT, 8, 2, 1)])                                     # other snapshot: kept
    out = changelog.remove_carry_over(frame(spark, fields, rows))
    assert summary(out, "id", "_commit_snapshot_id") == Counter(
        {(1, 7, DELETE): 1, (3, 7, DELETE): 1, (3, 7, INSERT): 1, (1, 8, INSERT): 1})


def test_update_detection_and_duplicate_key(spark):
    fields = [T.StructField("id", T.LongType()), T.StructField("v", T.StringType())]
    rows = [(1, "a", DELETE, 5, 1, 0), (1, "b", INSERT, 5, 1, 0), (2, "c", INSERT, 5, 1, 0),
            (3, "d", DELETE, 5, 1, 0), (1, "c", DELETE, 6, 2, 1)]
    out = changelog.detect_updates(frame(spark, fields, rows), ["id"], "db.t")
    assert summary(out, "id", "v", "_commit_snapshot_id") == Counter(
        {(1, "a", 5, UPDATE_BEFORE): 1, (1, "b", 5, UPDATE_AFTER): 1, (2, "c", 5, INSERT): 1,
         (3, "d", 5, DELETE): 1, (1, "c", 6, DELETE): 1})
    dup = frame(spark, fields, [(9, "x", INSERT, 5, 1, 0), (9, "y", INSERT, 5, 1, 0)])
    with pytest.raises(DuplicateKeyChangeError, match=r"table db\.t, snapshot 5: key \{'id': 9\} has 2 INSERT"):
        changelog.detect_updates(dup, ["id"], "db.t")


def test_net_changes_per_key(spark):
    fields = [T.StructField("id", T.LongType()), T.StructField("v", T.StringType())]
    rows = [
        (1, "new", INSERT, 1, 1, 0), (1, "new", DELETE, 3, 3, 2),                      # insert..delete: gone
        (2, "a", UPDATE_BEFORE, 1, 1, 0), (2, "b", UPDATE_AFTER, 1, 1, 0),
        (2, "b", UPDATE_BEFORE, 2, 2, 1), (2, "c", UPDATE_AFTER, 2, 2, 1),              # chain: a -> c
        (3, "x", UPDATE_BEFORE, 1, 1, 0), (3, "y", UPDATE_AFTER, 1, 1, 0),
        (3, "y", UPDATE_BEFORE, 3, 3, 2), (3, "x", UPDATE_AFTER, 3, 3, 2),              # back to x: gone
        (4, "d", DELETE, 2, 2, 1), (4, "e", INSERT, 3, 3, 2),                            # delete, re-insert
        (5, "f", INSERT, 2, 2, 1), (5, "f", UPDATE_BEFORE, 3, 3, 2), (5, "g", UPDATE_AFTER, 3, 3, 2),
        (6, "h", DELETE, 3, 3, 2),
    ]
    # Compared by every column but the change columns: _commit_timestamp differs, key 3 still vanishes.
    out = changelog.net_changes(frame(spark, fields, rows), ["id"])
    assert summary(out, "id", "v") == Counter({
        (2, "a", UPDATE_BEFORE): 1, (2, "c", UPDATE_AFTER): 1, (4, "d", UPDATE_BEFORE): 1,
        (4, "e", UPDATE_AFTER): 1, (5, "g", INSERT): 1, (6, "h", DELETE): 1})


def test_net_changes_order_by_ordinal_where_sequence_numbers_tie(spark):
    """Snapshots of a table upgraded from v1 all have sequence number 0: the chain a -> b -> c -> d
    still nets to a -> d (input deliberately in reverse commit order)."""
    fields = [T.StructField("id", T.LongType()), T.StructField("v", T.StringType())]
    chain = [("c", "d", 12, 2), ("b", "c", 11, 1), ("a", "b", 10, 0)]
    rows = [r for before, after, sid, ordinal in chain
            for r in ((1, after, UPDATE_AFTER, sid, 0, ordinal), (1, before, UPDATE_BEFORE, sid, 0, ordinal))]
    rows += [(2, "x", INSERT, 11, 0, 1), (2, "x", DELETE, 12, 0, 2), (3, "y", DELETE, 10, 0, 0),
             (3, "z", INSERT, 12, 0, 2)]
    out = changelog.net_changes(frame(spark, fields, rows).repartition(3), ["id"])
    assert summary(out, "id", "v", "_commit_snapshot_id") == Counter({
        (1, "a", 10, UPDATE_BEFORE): 1, (1, "d", 12, UPDATE_AFTER): 1,
        (3, "y", 10, UPDATE_BEFORE): 1, (3, "z", 12, UPDATE_AFTER): 1})


def test_net_changes_without_keys_credit_the_snapshot_iceberg_credits(spark):
    """Keyless net changes walk the copies of one row in commit order (delete before insert within a
    snapshot); what survives is the first row of the last run that did not cancel out, as
    create_changelog_view(net_changes => true) does. Input: rows as read, carry-over included."""
    fields = [T.StructField("v", T.StringType())]
    rows = [("rewritten", INSERT, 1, 1, 0),                                   # inserted at 1,
            ("rewritten", DELETE, 2, 2, 1), ("rewritten", INSERT, 2, 2, 1),   # rewritten unchanged at 2
            ("rewritten", DELETE, 3, 3, 2), ("rewritten", INSERT, 3, 3, 2),   # and at 3: credited to 3
            ("twice", INSERT, 1, 1, 0), ("twice", INSERT, 2, 2, 1),           # two copies: both credited to 1
            ("gone", DELETE, 1, 1, 0), ("gone", INSERT, 2, 2, 1), ("gone", DELETE, 3, 3, 2),  # credited to 3
            ("one left", INSERT, 1, 1, 0), ("one left", INSERT, 2, 2, 1), ("one left", DELETE, 3, 3, 2),
            ("cancelled", INSERT, 2, 2, 1), ("cancelled", DELETE, 3, 3, 2)]
    out = changelog.net_changes(frame(spark, fields, rows).repartition(3), [])
    got = Counter((r["v"], r["_change_type"], r["_commit_snapshot_id"], r["_change_ordinal"],
                   r["_commit_sequence_number"], r["_commit_timestamp"].timestamp()) for r in out.collect())
    at = {sid: (EPOCH_MS + sid * 1000) / 1000 for sid in (1, 2, 3)}
    assert got == Counter({("rewritten", INSERT, 3, 2, 3, at[3]): 1, ("twice", INSERT, 1, 0, 1, at[1]): 2,
                           ("gone", DELETE, 3, 2, 3, at[3]): 1, ("one left", INSERT, 1, 0, 1, at[1]): 1})


def test_to_events_document_ids_and_actions(spark):
    fields = [T.StructField("k", T.StringType()), T.StructField("d", T.DecimalType(12, 4)),
              T.StructField("ts", T.TimestampType()), T.StructField("day", T.DateType()),
              T.StructField("b", T.BinaryType()), T.StructField("flag", T.BooleanType())]
    ts = dt.datetime(2024, 3, 1, 12, 30, 0, 5, tzinfo=dt.UTC)
    base = ("a", decimal.Decimal("0.0000001").quantize(decimal.Decimal("0.0001")), ts, dt.date(2024, 3, 1),
            bytearray(b"\xff"), True)
    rows = [(*base, UPDATE_BEFORE, 5, 1, 0), (*base, UPDATE_AFTER, 5, 1, 0),
            (("b", decimal.Decimal("12.5000"), None, None, None, False) + (DELETE, 5, 1, 0))]
    events = changelog.to_events(frame(spark, fields, rows), "db.t", ["k", "d", "ts", "day", "b", "flag"],
                                 "overwrite", 5, use_row_id=False).collect()
    assert sorted((e["document_id"], e["bulk_action"], e["_change_type"]) for e in events) == [
        ("a|0.0000|2024-03-01T12:30:00.000005Z|2024-03-01|/w==|true", "INDEX", UPDATE_AFTER),
        (r"b|12.5000|\N|\N|\N|false", "DELETE", DELETE)]  # a null part is \N, never dropped
    assert {(e["iceberg_operation"], e["iceberg_snapshot_operation"], e["iceberg_table_name"],
             e["iceberg_snapshot_id"]) for e in events} == {
        (UPDATE_AFTER, "overwrite", "db.t", 5), (DELETE, "overwrite", "db.t", 5)}
    keyless = changelog.to_events(frame(spark, fields, rows), "db.t", (), "append", 5, use_row_id=False).collect()
    assert len(keyless) == 2 and {e["document_id"] for e in keyless} == {None}


def test_to_events_keeps_last_image_per_document(spark):
    fields = [T.StructField("id", T.IntegerType()), T.StructField("v", T.StringType())]
    rows = [(1, "old", INSERT, 1, 1, 0), (1, "old", DELETE, 2, 2, 1), (1, "new", INSERT, 2, 2, 1),
            (2, "x", INSERT, 1, 1, 0), (2, "x", DELETE, 2, 2, 1)]
    events = changelog.to_events(frame(spark, fields, rows), "db.t", ["id"], "append", 2, use_row_id=False)
    assert sorted((e["document_id"], e["v"], e["bulk_action"]) for e in events.collect()) == [
        ("1", "new", "INDEX"), ("2", "x", "DELETE")]


def test_events_of_rows_with_unique_ids_are_not_ranked(spark):
    """An export (keys checked, one row each): the same events without the ranking window's shuffle."""
    fields = [T.StructField("id", T.IntegerType()), T.StructField("v", T.StringType())]
    rows = frame(spark, fields, [(i, f"v{i}", INSERT, 1, 1, 0) for i in range(20)])
    ranked = changelog.to_events(rows, "db.t", ["id"], "append", 1, use_row_id=False)
    plain = changelog.to_events(rows, "db.t", ["id"], "append", 1, use_row_id=False, unique_ids=True)
    assert sorted(map(tuple, plain.collect())) == sorted(map(tuple, ranked.collect()))
    plans = [frame_._jdf.queryExecution().executedPlan().toString() for frame_ in (ranked, plain)]
    assert "Window" in plans[0] and "Window" not in plans[1] and "Exchange" not in plans[1]
