"""Schema evolution by field id through the real pipeline (engine -> stored changelog -> events read
back -> replica): rename, drop, widen, reorder, nested rename/add, a lagging sink, an identifier change.

Oracle: the source read by time travel at the synced snapshot (its own schema), compared on every
column in both directions, with no duplicate key in the replica.
"""

import dataclasses
from functools import partial

import pytest

from icecdc_dagster import changelog
from icecdc_dagster.errors import SchemaChangeError
from icecdc_dagster.sinks.iceberg import IcebergReplicaSink
from icecdc_dagster.steps.batches import compute_batch, keys_to_request
from icecdc_dagster.steps.changelog_store import ChangelogStore
from icecdc_dagster.writer.field_ids import FIELD_MAP_PROPERTY


def _store(spark, cat, catalog, snapshot_id, bootstrap_id, key=("id",)):
    """The batch as the changelog asset computes and stores it (read with the source's current schema)."""
    table = catalog.load_table("db.src")
    request = keys_to_request("db.src", [str(snapshot_id)], [str(bootstrap_id)], False, key)
    with changelog.staged_scans(spark):
        computed = compute_batch(spark, cat, table, request)
        ChangelogStore(spark, cat, "db.src").write(computed.info, computed.rows, table.schema())
    return computed.info


def _apply(spark, cat, sink, info):
    """As the sink asset applies a stored batch: its events, and its key range from the store's statistics."""
    store = ChangelogStore(spark, cat, "db.src")
    return sink.apply(info, store.read_events(info, use_row_id=False), partial(store.column_ranges, info))


def _sync(spark, cat, catalog, sink, bootstrap_id):
    """Store and apply the source's current snapshot; returns its id."""
    snapshot_id = catalog.load_table("db.src").current_snapshot().snapshot_id
    bootstrap_id = snapshot_id if bootstrap_id is None else bootstrap_id
    _apply(spark, cat, sink, _store(spark, cat, catalog, snapshot_id, bootstrap_id))
    return snapshot_id


def _assert_replica_equals_source(spark, cat, snapshot_id, replica="db.dst"):
    source = spark.sql(f"SELECT * FROM {cat}.db.src VERSION AS OF {snapshot_id}")
    target = spark.table(f"{cat}.{replica}")
    assert target.columns == source.columns
    assert [f.dataType.simpleString() for f in target.schema] == [f.dataType.simpleString() for f in source.schema]
    assert target.count() == target.select("id").distinct().count() == source.count()
    assert source.exceptAll(target).count() == 0 and target.exceptAll(source).count() == 0


def _field_id(catalog, table, name):
    return catalog.load_table(table).schema().find_field(name).field_id


def test_rename_widen_drop_reorder_follow_the_source_by_field_id(spark, catalog, catalog_settings):
    """The user's bug (rename, then 20 updates and 30 inserts) on a replica and store written by an earlier
    version (no recorded mapping: matched by name once, through the source's schema history)."""
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.src (id bigint NOT NULL, name string, qty int, price decimal(12,2), "
              f"tag string, day date) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {cat}.db.src SELECT id, concat('n', id), CAST(id AS int), CAST(id * 1.5 AS decimal(12,2)), "
              f"concat('t', id % 3), date_add(DATE'2024-01-01', CAST(id % 9 AS int)) FROM range(60)")
    sink = IcebergReplicaSink(spark, cat, catalog, "db.dst", "db.src", ("id",))
    boot = _sync(spark, cat, catalog, sink, None)
    _assert_replica_equals_source(spark, cat, boot)
    name_id = _field_id(catalog, "db.dst", "name")
    for table in ("db.dst", "db.src__changelog"):  # as an earlier version left them
        spark.sql(f"ALTER TABLE {cat}.{table} UNSET TBLPROPERTIES ('{FIELD_MAP_PROPERTY}')")

    spark.sql(f"ALTER TABLE {cat}.db.src RENAME COLUMN name TO full_name")
    spark.sql(f"UPDATE {cat}.db.src SET full_name = concat('u', id), qty = qty + 1 WHERE id < 20")
    _assert_replica_equals_source(spark, cat, _sync(spark, cat, catalog, sink, boot))
    spark.sql(f"INSERT INTO {cat}.db.src SELECT id, concat('i', id), 7, 1.25, 'x', DATE'2024-02-01' "
              f"FROM range(100, 130)")
    _assert_replica_equals_source(spark, cat, _sync(spark, cat, catalog, sink, boot))
    assert _field_id(catalog, "db.dst", "full_name") == name_id          # renamed in place, not added
    assert "name" not in spark.table(f"{cat}.db.src__changelog").columns
    assert FIELD_MAP_PROPERTY in catalog.load_table("db.dst").properties

    spark.sql(f"ALTER TABLE {cat}.db.src ALTER COLUMN qty TYPE bigint")
    spark.sql(f"ALTER TABLE {cat}.db.src ALTER COLUMN price TYPE decimal(18,2)")
    spark.sql(f"UPDATE {cat}.db.src SET qty = 5000000000 + id, price = 1234567890123.45 WHERE id % 4 = 0")
    _assert_replica_equals_source(spark, cat, _sync(spark, cat, catalog, sink, boot))

    spark.sql(f"ALTER TABLE {cat}.db.src DROP COLUMN tag")
    spark.sql(f"DELETE FROM {cat}.db.src WHERE id % 5 = 1")
    _assert_replica_equals_source(spark, cat, _sync(spark, cat, catalog, sink, boot))
    stored = spark.table(f"{cat}.db.src__changelog").columns
    assert "tag" not in stored and any(c.startswith("tag__dropped_") for c in stored)  # older batches keep it

    spark.sql(f"ALTER TABLE {cat}.db.src ALTER COLUMN day FIRST")
    spark.sql(f"ALTER TABLE {cat}.db.src ADD COLUMN tag string")           # a new field under an old name
    spark.sql(f"INSERT INTO {cat}.db.src VALUES (DATE'2024-03-01', 200, 'new', 1, 2.50, 'fresh')")
    _assert_replica_equals_source(spark, cat, _sync(spark, cat, catalog, sink, boot))
    assert spark.table(f"{cat}.db.dst").columns[:2] == ["day", "id"]


def test_nested_rename_add_and_widen(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.src (id bigint NOT NULL, info struct<a: int, b: string>, "
              f"pts array<struct<x: int, y: int>>) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {cat}.db.src SELECT id, named_struct('a', CAST(id AS int), 'b', concat('b', id)), "
              f"array(named_struct('x', CAST(id AS int), 'y', 1)) FROM range(12)")
    sink = IcebergReplicaSink(spark, cat, catalog, "db.dst", "db.src", ("id",))
    boot = _sync(spark, cat, catalog, sink, None)
    _assert_replica_equals_source(spark, cat, boot)
    a_id = _field_id(catalog, "db.dst", "info.a")

    spark.sql(f"ALTER TABLE {cat}.db.src RENAME COLUMN info.a TO alpha")
    spark.sql(f"ALTER TABLE {cat}.db.src ALTER COLUMN info.alpha TYPE bigint")
    spark.sql(f"ALTER TABLE {cat}.db.src ADD COLUMN info.c double")
    spark.sql(f"ALTER TABLE {cat}.db.src RENAME COLUMN pts.element.x TO px")
    spark.sql(f"ALTER TABLE {cat}.db.src ALTER COLUMN info.b FIRST")
    spark.sql(f"UPDATE {cat}.db.src SET info = named_struct('b', 'u', 'alpha', 9000000000, 'c', 0.5), "
              f"pts = array(named_struct('px', 5, 'y', 6)) WHERE id < 4")
    _assert_replica_equals_source(spark, cat, _sync(spark, cat, catalog, sink, boot))
    assert _field_id(catalog, "db.dst", "info.alpha") == a_id
    stored = catalog.load_table("db.src__changelog").schema()
    assert stored.find_field("info.alpha") is not None and stored.find_field("pts.element.px") is not None


def test_lagging_sink_applies_batches_stored_before_the_rename(spark, catalog, catalog_settings):
    """A sink that applies a batch stored before the rename after the store followed it gets the batch in
    the names of its snapshot (read back by field id), then follows the rename with the next batch."""
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.src (id bigint NOT NULL, name string, n int) USING iceberg "
              f"TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {cat}.db.src SELECT id, concat('n', id), CAST(id AS int) FROM range(10)")
    fast = IcebergReplicaSink(spark, cat, catalog, "db.dst", "db.src", ("id",))
    slow = IcebergReplicaSink(spark, cat, catalog, "db.lag", "db.src", ("id",))
    boot = catalog.load_table("db.src").current_snapshot().snapshot_id
    export = _store(spark, cat, catalog, boot, boot)
    _apply(spark, cat, fast, export)
    _apply(spark, cat, slow, export)

    spark.sql(f"UPDATE {cat}.db.src SET name = 'before', n = n + 100 WHERE id < 3")
    before = catalog.load_table("db.src").current_snapshot().snapshot_id
    before_batch = _store(spark, cat, catalog, before, boot)
    _apply(spark, cat, fast, before_batch)
    spark.sql(f"ALTER TABLE {cat}.db.src RENAME COLUMN name TO full_name")
    spark.sql(f"UPDATE {cat}.db.src SET full_name = 'after' WHERE id IN (2, 5)")
    after = catalog.load_table("db.src").current_snapshot().snapshot_id
    after_batch = _store(spark, cat, catalog, after, boot)
    _apply(spark, cat, fast, after_batch)
    _assert_replica_equals_source(spark, cat, after)
    assert "name" not in spark.table(f"{cat}.db.src__changelog").columns        # the store followed the rename

    read_back = ChangelogStore(spark, cat, "db.src").read(before_batch)
    assert "name" in read_back.columns and "full_name" not in read_back.columns
    _apply(spark, cat, slow, before_batch)
    _assert_replica_equals_source(spark, cat, before, replica="db.lag")
    _apply(spark, cat, slow, after_batch)
    _assert_replica_equals_source(spark, cat, after, replica="db.lag")


def test_identifier_change_stops_with_named_error_and_resync_rebuilds(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.src (id bigint NOT NULL, code string NOT NULL, v int) USING iceberg "
              f"TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"ALTER TABLE {cat}.db.src SET IDENTIFIER FIELDS id")
    spark.sql(f"INSERT INTO {cat}.db.src SELECT id, concat('c', id), 1 FROM range(8)")
    sink = IcebergReplicaSink(spark, cat, catalog, "db.dst", "db.src", ("id",))
    boot = _sync(spark, cat, catalog, sink, None)

    spark.sql(f"ALTER TABLE {cat}.db.src SET IDENTIFIER FIELDS code")
    spark.sql(f"UPDATE {cat}.db.src SET v = 2 WHERE id < 3")
    changed = catalog.load_table("db.src").current_snapshot().snapshot_id
    rekeyed = IcebergReplicaSink(spark, cat, catalog, "db.dst", "db.src", ("code",))
    batch = _store(spark, cat, catalog, changed, boot, key=("code",))
    with pytest.raises(SchemaChangeError) as stop:
        _apply(spark, cat, rekeyed, batch)
    message = str(stop.value)
    for part in ("db.dst", "db.src", str(changed), "identifier", "['id']", "['code']",
                 "icecdc resync --config <pipeline.yaml> --table db.src"):
        assert part in message
    assert rekeyed.read_checkpoint().snapshot_id == boot                      # nothing written

    # icecdc resync: a new line whose export rebuilds the replica keyed by the new identifier
    export = _store(spark, cat, catalog, changed, changed, key=("code",))
    resync = dataclasses.replace(export, line="resync-1")
    _apply(spark, cat, rekeyed, resync)
    _assert_replica_equals_source(spark, cat, changed)
    assert catalog.load_table("db.dst").schema().identifier_field_names() == {"code"}


def test_replica_left_with_two_columns_for_one_field_stops(spark, catalog, catalog_settings):
    """A replica an earlier (by-name) version evolved after a rename holds the stale column next to the new
    one: named stop, not a guess."""
    cat = catalog_settings.name
    spark.sql(f"CREATE TABLE {cat}.db.src (id bigint NOT NULL, name string) USING iceberg "
              f"TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {cat}.db.src VALUES (1, 'a'), (2, 'b')")
    sink = IcebergReplicaSink(spark, cat, catalog, "db.dst", "db.src", ("id",))
    boot = _sync(spark, cat, catalog, sink, None)
    spark.sql(f"ALTER TABLE {cat}.db.dst UNSET TBLPROPERTIES ('{FIELD_MAP_PROPERTY}')")
    spark.sql(f"ALTER TABLE {cat}.db.src RENAME COLUMN name TO full_name")
    spark.sql(f"ALTER TABLE {cat}.db.dst ADD COLUMN full_name string")      # what matching by name did
    spark.sql(f"UPDATE {cat}.db.src SET full_name = 'x' WHERE id = 1")
    with pytest.raises(SchemaChangeError, match=r"columns name and full_name both stand for source field"):
        _sync(spark, cat, catalog, sink, boot)
