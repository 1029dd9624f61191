"""Replica equals source at every snapshot: randomised CoW/MoR, v2/v3, keyed and keyless workloads through
the real pipeline (engine -> stored changelog -> events read back -> replica sink).

Oracle: the source read by time travel at each snapshot. A keyless v3 replica holds the source's
``_row_id`` in ``_source_row_id``; it must equal the source's (``_row_id``, columns) at that snapshot.
"""

import random

import pytest

from icecdc_dagster import changelog
from icecdc_dagster.sinks.iceberg import SOURCE_ROW_ID, IcebergReplicaSink
from icecdc_dagster.steps.batches import compute_batch, keys_to_request, uses_row_id
from icecdc_dagster.steps.changelog_store import ChangelogStore

KEY = ("id",)


def _batch(spark, cat, table, snapshot_id, bootstrap_id, key):
    """The batch as the Dagster assets run it: computed, stored, read back as events."""
    request = keys_to_request("db.src", [str(snapshot_id)], [str(bootstrap_id)], False, key)
    store = ChangelogStore(spark, cat, "db.src")
    with changelog.staged_scans(spark):
        computed = compute_batch(spark, cat, table, request)
        store.write(computed.info, computed.rows)
    return computed.info, store.read_events(computed.info, use_row_id=uses_row_id(table, key))


def _random_statement(rng, fq, next_id, has_extra):
    kind = rng.choice(["insert", "update", "delete", "merge", "update"])
    lo = rng.randrange(0, next_id)
    if kind == "insert":
        n = rng.randint(1, 4)
        extra = ", 'e'" if has_extra else ""
        values = ", ".join(f"({next_id + i}, 'n{next_id + i}', {rng.randint(0, 3)}, {rng.random():.3f}{extra})"
                           for i in range(n))
        return f"INSERT INTO {fq} VALUES {values}", next_id + n
    if kind == "update":
        return f"UPDATE {fq} SET name = 'u{rng.randint(0, 999)}', score = score + 1 WHERE id % 5 = {lo % 5}", next_id
    if kind == "delete":
        return f"DELETE FROM {fq} WHERE id BETWEEN {lo} AND {lo + rng.randint(0, 2)}", next_id
    extra = ", 'm' AS extra" if has_extra else ""
    return (f"MERGE INTO {fq} t USING (SELECT {lo} AS id, 'm{lo}' AS name, 1 AS part, 0.5 AS score{extra} "
            f"UNION ALL SELECT {next_id} AS id, 'm{next_id}' AS name, 2 AS part, 0.25 AS score{extra}) s "
            "ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"), next_id + 1


def _run(spark, catalog, catalog_settings, seed, version, mode, steps, keyed=True):
    rng = random.Random(seed)
    cat = catalog_settings.name
    fq = f"{cat}.db.src"
    key = KEY if keyed else ()
    spark.sql(f"CREATE TABLE {fq} (id bigint NOT NULL, name string, part int, score double) USING iceberg "
              f"PARTITIONED BY (part) TBLPROPERTIES ('format-version'='{version}', 'write.merge.mode'='{mode}', "
              f"'write.update.mode'='{mode}', 'write.delete.mode'='{mode}')")
    if keyed:
        spark.sql(f"ALTER TABLE {fq} SET IDENTIFIER FIELDS id")
    spark.sql(f"INSERT INTO {fq} VALUES " + ", ".join(f"({i}, 'n{i}', {i % 4}, {i / 10})" for i in range(20)))
    sink = IcebergReplicaSink(spark, cat, catalog, "db.dst", catalog.load_table("db.src"), key, write_mode=mode)
    next_id, has_extra = 20, False
    bootstrap_id = catalog.load_table("db.src").current_snapshot().snapshot_id
    for step in range(steps):
        table = catalog.load_table("db.src")
        snapshot_id = table.current_snapshot().snapshot_id
        info, events = _batch(spark, cat, table, snapshot_id, bootstrap_id, key)
        sink.apply(info, events)
        columns = spark.table(fq).columns
        select = ", ".join(columns)
        if keyed:
            source = spark.sql(f"SELECT {select} FROM {fq} VERSION AS OF {snapshot_id}")
            replica = spark.table(f"{cat}.db.dst").select(*columns)
        else:
            source = spark.sql(f"SELECT _row_id, {select} FROM {fq} VERSION AS OF {snapshot_id}")
            replica = spark.table(f"{cat}.db.dst").select(SOURCE_ROW_ID, *columns)
        source, replica = sorted(map(tuple, source.collect())), sorted(map(tuple, replica.collect()))
        assert replica == source, f"seed {seed} step {step} snapshot {snapshot_id}"
        assert sink.read_checkpoint().snapshot_id == snapshot_id
        if step == steps // 2 and not has_extra:
            spark.sql(f"ALTER TABLE {fq} ADD COLUMN extra string")
            has_extra = True
        statement, next_id = _random_statement(rng, fq, next_id, has_extra)
        spark.sql(statement)
    replica = catalog.load_table("db.dst")
    assert replica.format_version == version
    assert replica.current_snapshot().summary["total-equality-deletes"] == "0"
    # The replica's columns are the source's (plus the row id key when keyless), never lineage as data.
    replica_columns = [f.name for f in replica.schema().fields]
    assert sorted(replica_columns) == sorted(spark.table(fq).columns + ([] if keyed else [SOURCE_ROW_ID]))
    assert replica.schema().identifier_field_names() == ({"id"} if keyed else {SOURCE_ROW_ID})
    if version >= 3:
        # Its own row lineage: every replica row has a row id of the replica.
        assert spark.sql(f"SELECT count(*) FROM {cat}.db.dst WHERE _row_id IS NULL").first()[0] == 0
    else:
        # pyiceberg reads the replica (positional deletes only) and sees what Spark sees
        assert sorted(replica.scan().to_arrow().column("name").to_pylist(), key=str) == sorted(
            (r.name for r in spark.table(f"{cat}.db.dst").collect()), key=str)


_SLOW = pytest.mark.slow  # the default run keeps one keyed kind per format (keyless v3: tests/dagster_layer/test_sink_runs.py); -m slow runs the rest


@pytest.mark.parametrize("seed,version,mode,keyed", [
    (1, 2, "copy-on-write", True), pytest.param(2, 2, "merge-on-read", True, marks=_SLOW),
    pytest.param(3, 3, "copy-on-write", True, marks=_SLOW), (4, 3, "merge-on-read", True),
    pytest.param(5, 3, "merge-on-read", False, marks=_SLOW), pytest.param(6, 3, "copy-on-write", False, marks=_SLOW)])
def test_replica_equals_source_at_every_snapshot(spark, catalog, catalog_settings, seed, version, mode, keyed):
    _run(spark, catalog, catalog_settings, seed, version, mode, steps=6, keyed=keyed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 9))
@pytest.mark.parametrize("version,mode,keyed", [
    (2, "copy-on-write", True), (2, "merge-on-read", True), (3, "merge-on-read", True),
    (3, "copy-on-write", True), (3, "merge-on-read", False)])
def test_replica_equals_source_long_random(spark, catalog, catalog_settings, seed, version, mode, keyed):
    _run(spark, catalog, catalog_settings, seed, version, mode, steps=15, keyed=keyed)
