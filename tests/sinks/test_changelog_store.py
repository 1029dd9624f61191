"""The stored changelog (``<table>__changelog``) keeps the full change rows; sinks read events derived from it.

Expected rows are written by hand; commit times come from the source's snapshot metadata (pyiceberg).
"""

import datetime as dt
import random

import pytest
from pyspark.sql import functions as F

from icecdc_dagster import changelog
from icecdc_dagster.batch import (
    CHANGE_TYPE,
    COMMIT_SNAPSHOT_ID,
    COMMIT_TIMESTAMP,
    DELETE,
    INSERT,
    ROW_ID,
    UPDATE_AFTER,
    UPDATE_BEFORE,
)
from icecdc_dagster.errors import DuplicateKeyChangeError, IdentifierColumnError
from icecdc_dagster.steps.batches import compute_batch, keys_to_request, uses_row_id
from icecdc_dagster.steps.changelog_store import SOURCE_ROW_ID, ChangelogStore


def _store_batch(spark, cat, table, name, snapshot_ids, bootstrap_id, key):
    request = keys_to_request(name, [str(s) for s in snapshot_ids], [str(bootstrap_id)], False, key)
    store = ChangelogStore(spark, cat, name)
    with changelog.staged_scans(spark), changelog.deferred_key_checks():  # as the changelog step stores a batch
        computed = compute_batch(spark, cat, table, request)
        stored = store.write(computed.info, computed.rows)
    return store, computed.info, stored


def _stored_rows(spark, cat, name, snapshot_id, *columns):
    rows = spark.sql(f"SELECT {', '.join(columns)}, {CHANGE_TYPE}, {COMMIT_SNAPSHOT_ID}, "
                     f"unix_millis({COMMIT_TIMESTAMP}) AS ms FROM {cat}.{name}__changelog "
                     f"WHERE _batch_snapshot_id = {snapshot_id}").collect()
    return sorted(tuple(r) for r in rows)


def test_stored_batch_holds_both_images_with_commit_time_and_reruns_replace_it(spark, catalog, catalog_settings):
    cat, name = catalog_settings.name, "db.items"
    fq = f"{cat}.{name}"
    spark.sql(f"CREATE TABLE {fq} (id bigint NOT NULL, name string) USING iceberg "
              "TBLPROPERTIES ('format-version'='2', 'write.update.mode'='copy-on-write')")
    spark.sql(f"INSERT INTO {fq} VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    bootstrap = catalog.load_table(name).current_snapshot()
    spark.sql(f"UPDATE {fq} SET name = 'B' WHERE id = 2")
    spark.sql(f"MERGE INTO {fq} t USING (SELECT 3 AS id UNION ALL SELECT 4 AS id) s ON t.id = s.id "
              "WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT (id, name) VALUES (s.id, 'd')")
    table = catalog.load_table(name)
    update, merge = [s for s in table.snapshots() if s.snapshot_id != bootstrap.snapshot_id]

    _store_batch(spark, cat, table, name, [bootstrap.snapshot_id], bootstrap.snapshot_id, ("id",))
    store, info, stored = _store_batch(spark, cat, table, name, [update.snapshot_id], bootstrap.snapshot_id, ("id",))
    expected = [(2, "B", UPDATE_AFTER, update.snapshot_id, update.timestamp_ms),
                (2, "b", UPDATE_BEFORE, update.snapshot_id, update.timestamp_ms)]
    assert _stored_rows(spark, cat, f"{name}", update.snapshot_id, "id", "name") == expected
    assert stored.counts == {UPDATE_BEFORE: 1, UPDATE_AFTER: 1}

    # A rerun replaces the batch: same rows, same counts, nothing duplicated.
    _, _, again = _store_batch(spark, cat, table, name, [update.snapshot_id], bootstrap.snapshot_id, ("id",))
    assert again.counts == stored.counts and again.snapshot_id != stored.snapshot_id
    assert _stored_rows(spark, cat, name, update.snapshot_id, "id", "name") == expected
    assert _stored_rows(spark, cat, name, bootstrap.snapshot_id, "id", "name") == [
        (i, n, INSERT, bootstrap.snapshot_id, bootstrap.timestamp_ms) for i, n in ((1, "a"), (2, "b"), (3, "c"))]

    # Sinks read events derived from the stored rows: one per document, the after image.
    events = store.read_events(info, use_row_id=False).collect()
    assert [(e["id"], e["name"], e["iceberg_operation"], e["bulk_action"], e["document_id"]) for e in events] == [
        (2, "B", UPDATE_AFTER, "INDEX", "2")]

    # A catch-up range (net changes) is stored under its last snapshot, each row with its commit time.
    _, _, net = _store_batch(spark, cat, table, name, [update.snapshot_id, merge.snapshot_id], bootstrap.snapshot_id,
                             ("id",))
    assert net.counts == {UPDATE_BEFORE: 1, UPDATE_AFTER: 1, DELETE: 1, INSERT: 1}
    rows = _stored_rows(spark, cat, name, merge.snapshot_id, "id", "name")
    assert [(r[0], r[1], r[2]) for r in rows] == [(2, "B", UPDATE_AFTER), (2, "b", UPDATE_BEFORE), (3, "c", DELETE),
                                                  (4, "d", INSERT)]
    commit_times = {s.snapshot_id: s.timestamp_ms for s in table.snapshots()}
    assert all(r[4] == commit_times[r[3]] for r in rows)


def test_v3_lineage_is_stored_under_non_reserved_names_and_read_back(spark, catalog, catalog_settings):
    cat, name = catalog_settings.name, "db.logs"
    fq = f"{cat}.{name}"
    spark.sql(f"CREATE TABLE {fq} (line string) USING iceberg TBLPROPERTIES ('format-version'='3', "
              "'write.update.mode'='merge-on-read')")
    spark.sql(f"INSERT INTO {fq} VALUES ('x'), ('y')")
    bootstrap = catalog.load_table(name).current_snapshot().snapshot_id
    spark.sql(f"UPDATE {fq} SET line = 'Y' WHERE line = 'y'")
    table = catalog.load_table(name)
    update = table.current_snapshot().snapshot_id
    row_id_of_y = spark.sql(f"SELECT _row_id FROM {fq} WHERE line = 'Y'").first()[0]
    _store_batch(spark, cat, table, name, [bootstrap], bootstrap, ())
    store, info, stored = _store_batch(spark, cat, table, name, [update], bootstrap, ())
    assert stored.counts == {UPDATE_BEFORE: 1, UPDATE_AFTER: 1}
    stored_columns = spark.table(f"{cat}.{name}__changelog").columns  # a full scan: no reserved-name clash
    assert SOURCE_ROW_ID in stored_columns and ROW_ID not in stored_columns
    assert sorted((r[SOURCE_ROW_ID], r["line"], r[CHANGE_TYPE]) for r in spark.table(f"{cat}.{name}__changelog")
                  .where(f"_batch_snapshot_id = {update}").collect()) == [
        (row_id_of_y, "Y", UPDATE_AFTER), (row_id_of_y, "y", UPDATE_BEFORE)]
    events = store.read_events(info, use_row_id=uses_row_id(table, ())).collect()
    assert [(e["document_id"], e["line"], e[ROW_ID]) for e in events] == [(str(row_id_of_y), "Y", row_id_of_y)]


def _aggregated_ranges(store, info, columns):
    """The oracle: min and max of each column over the batch's rows as the store reads them back."""
    row = store.read(info).agg(*[F.struct(F.min(c), F.max(c)).alias(c) for c in columns]).first()
    return {c: tuple(row[c]) for c in columns}


def test_a_stored_batchs_column_ranges_come_from_its_files_statistics(spark, catalog, catalog_settings):
    """What a replica bounds its MERGE by, with no job: the stored batch's file bounds, equal to an aggregate of
    its rows (strings within Iceberg's 16-character truncation), under the batch's own column names after a
    rename; None where the statistics cannot tell (a type without ranges, metrics turned off)."""
    cat, name = catalog_settings.name, "db.ranged"
    fq = f"{cat}.{name}"
    spark.sql(f"CREATE TABLE {fq} (id bigint NOT NULL, code string, day date, n int, score double) USING iceberg "
              "TBLPROPERTIES ('format-version'='2')")
    rnd = random.Random(7)
    values = ", ".join(f"({rnd.randrange(-10**12, 10**12)}, '{rnd.choice('abcxyz')}{rnd.randrange(10**6)}', "
                       f"DATE '{dt.date(2020, 1, 1) + dt.timedelta(days=rnd.randrange(2000))}', "
                       f"{rnd.randrange(-99, 99)}, {rnd.random()})" for _ in range(40))
    spark.sql(f"INSERT INTO {fq} VALUES {values}")
    first = catalog.load_table(name).current_snapshot().snapshot_id
    store, info, _ = _store_batch(spark, cat, catalog.load_table(name), name, [first], first, ("id",))
    columns = ["id", "code", "day", "n"]
    assert store.column_ranges(info, columns) == _aggregated_ranges(store, info, columns)
    events, ranges = store.events_and_ranges(info, use_row_id=False)  # one load for both: the same answers
    assert ranges(columns) == store.column_ranges(info, columns)
    assert sorted(events.collect()) == sorted(store.read_events(info, use_row_id=False).collect())
    assert store.column_ranges(info, ["id", "score"]) is None  # a double has no range here
    assert store.column_ranges(info, ["no_such_column"]) is None

    spark.sql(f"ALTER TABLE {fq} RENAME COLUMN code TO label")
    spark.sql(f"INSERT INTO {fq} VALUES (1, 'a-label-longer-than-sixteen-characters', DATE '2019-05-05', 5, 0.5), "
              f"(2, 'b-label-longer-than-sixteen-characters-too', DATE '2031-01-01', 6, 0.25)")
    second = catalog.load_table(name).current_snapshot().snapshot_id
    _, later, _ = _store_batch(spark, cat, catalog.load_table(name), name, [second], first, ("id",))
    assert store.column_ranges(info, ["code"]) == _aggregated_ranges(store, info, ["code"])  # the batch's names
    ranges, exact = store.column_ranges(later, ["label", "day"]), _aggregated_ranges(store, later, ["label", "day"])
    assert ranges["day"] == exact["day"] == (dt.date(2019, 5, 5), dt.date(2031, 1, 1))
    low, high = ranges["label"]
    assert low <= exact["label"][0] and high >= exact["label"][1] and (low, high) != exact["label"]  # truncated

    spark.sql(f"ALTER TABLE {fq}__changelog SET TBLPROPERTIES ('write.metadata.metrics.column.id'='none')")
    spark.sql(f"INSERT INTO {fq} VALUES (3, 'c', DATE '2020-01-01', 7, 0.75)")
    third = catalog.load_table(name).current_snapshot().snapshot_id
    _, unmeasured, _ = _store_batch(spark, cat, catalog.load_table(name), name, [third], first, ("id",))
    assert store.column_ranges(unmeasured, ["id"]) is None
    assert store.column_ranges(unmeasured, ["n"]) == {"n": (7, 7)}


def _jobs_of(spark, label, action):
    spark.sparkContext.setJobGroup(label, label)
    try:
        return action()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)


def test_a_batch_is_key_checked_by_the_write_that_stores_it_and_a_bad_key_stores_nothing(
        spark, catalog, catalog_settings):
    """Inside ``deferred_key_checks`` the key check travels in the rows' plan: a good batch is stored by one
    Spark job (no aggregate of its own); a key changed twice (an append, and a copy-on-write MERGE that also
    rewrote a row) or a null key fails the store's write with the error the eager check names, and the store
    keeps no row of that batch and no new snapshot."""
    cat, name = catalog_settings.name, "db.keyed"
    fq = f"{cat}.{name}"
    spark.sql(f"CREATE TABLE {fq} (id bigint, name string) USING iceberg "
              "TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='copy-on-write')")
    spark.sql(f"INSERT INTO {fq} VALUES (1, 'a'), (2, 'b')")
    boot = catalog.load_table(name).current_snapshot().snapshot_id
    _store_batch(spark, cat, catalog.load_table(name), name, [boot], boot, ("id",))
    spark.sql(f"INSERT INTO {fq} VALUES (3, 'c')")
    good = catalog.load_table(name).current_snapshot().snapshot_id
    tracker = spark.sparkContext.statusTracker()
    store, _, stored = _jobs_of(spark, "good-batch", lambda: _store_batch(
        spark, cat, catalog.load_table(name), name, [good], boot, ("id",)))
    assert stored.counts == {INSERT: 1}
    assert len(tracker.getJobIdsForGroup("good-batch")) == 1
    before = store.spark.sql(f"SELECT count(*) AS n FROM {cat}.{name}__changelog.snapshots").collect()[0].n

    spark.sql(f"INSERT INTO {fq} VALUES (4, 'd'), (4, 'e'), (5, 'f')")
    twice = catalog.load_table(name).current_snapshot().snapshot_id
    with pytest.raises(DuplicateKeyChangeError,
                       match=rf"table db\.keyed, snapshot {twice}: key \{{'id': 4\}} has 2 INSERT"):
        _store_batch(spark, cat, catalog.load_table(name), name, [twice], boot, ("id",))
    spark.sql(f"MERGE INTO {fq} t USING (SELECT 1 AS id, 'p' AS n UNION ALL SELECT 7, 'q' UNION ALL SELECT 7, 'r') s "
              "ON t.id = s.id WHEN MATCHED THEN UPDATE SET name = s.n WHEN NOT MATCHED THEN INSERT (id, name) "
              "VALUES (s.id, s.n)")
    two_sided = catalog.load_table(name).current_snapshot().snapshot_id
    with pytest.raises(DuplicateKeyChangeError,
                       match=rf"table db\.keyed, snapshot {two_sided}: key \{{'id': 7\}} has 2 INSERT"):
        _store_batch(spark, cat, catalog.load_table(name), name, [two_sided], boot, ("id",))
    spark.sql(f"INSERT INTO {fq} VALUES (NULL, 'n')")
    null = catalog.load_table(name).current_snapshot().snapshot_id
    with pytest.raises(IdentifierColumnError, match=rf"column\(s\) id of table db\.keyed hold null in snapshot {null}"):
        _store_batch(spark, cat, catalog.load_table(name), name, [null], boot, ("id",))

    after = store.spark.sql(f"SELECT count(*) AS n FROM {cat}.{name}__changelog.snapshots").collect()[0].n
    assert after == before
    stored_batches = {r[0] for r in spark.sql(f"SELECT DISTINCT _batch_snapshot_id FROM {cat}.{name}__changelog")
                      .collect()}
    assert stored_batches == {boot, good}
