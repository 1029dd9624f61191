"""Replica equals source at every snapshot: randomised CoW/MoR workloads through the real changelog engine."""

import random

import pytest

from icecdc_dagster import changelog
from icecdc_dagster.batch import BatchInfo
from icecdc_dagster.sinks.iceberg import IcebergReplicaSink

KEY = ("id",)


def _batch(spark, cat, table, snapshot_id, export):
    plan = changelog.plan_snapshot(table, snapshot_id)
    if export:
        rows = changelog.export(spark, cat, table, snapshot_id).rows
        operation, preds = "append", ()
    else:
        rows = changelog.changes(spark, cat, table, snapshot_id, KEY).rows
        operation, preds = plan.operation, tuple(changelog.accepted_predecessors(table, snapshot_id))
    events = changelog.to_events(rows, "db.src", KEY, operation, snapshot_id, use_row_id=False)
    info = BatchInfo("db.src", snapshot_id, plan.sequence_number, snapshot_id, preds, plan.operation,
                     plan.committed_at_ms, is_export=export, identifier_columns=KEY, snapshot_ids=(snapshot_id,))
    return info, events


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


def _run(spark, catalog, catalog_settings, seed, version, mode, steps):
    rng = random.Random(seed)
    cat = catalog_settings.name
    fq = f"{cat}.db.src"
    spark.sql(f"CREATE TABLE {fq} (id bigint NOT NULL, name string, part int, score double) USING iceberg "
              f"PARTITIONED BY (part) TBLPROPERTIES ('format-version'='{version}', 'write.merge.mode'='{mode}', "
              f"'write.update.mode'='{mode}', 'write.delete.mode'='{mode}')")
    spark.sql(f"ALTER TABLE {fq} SET IDENTIFIER FIELDS id")
    spark.sql(f"INSERT INTO {fq} VALUES " + ", ".join(f"({i}, 'n{i}', {i % 4}, {i / 10})" for i in range(20)))
    sink = IcebergReplicaSink(spark, cat, catalog, "db.dst", catalog.load_table("db.src"), KEY)
    next_id, has_extra, export = 20, False, True
    for step in range(steps):
        table = catalog.load_table("db.src")
        snapshot_id = table.current_snapshot().snapshot_id
        info, events = _batch(spark, cat, table, snapshot_id, export)
        sink.apply(info, events)
        source = sorted(map(tuple, spark.sql(f"SELECT * FROM {fq} VERSION AS OF {snapshot_id}").collect()))
        columns = spark.table(fq).columns
        replica = sorted(map(tuple, spark.table(f"{cat}.db.dst").select(*columns).collect()))
        assert replica == source, f"seed {seed} step {step} snapshot {snapshot_id}"
        assert sink.read_checkpoint().snapshot_id == snapshot_id
        export = False
        if step == steps // 2 and not has_extra:
            spark.sql(f"ALTER TABLE {fq} ADD COLUMN extra string")
            has_extra = True
        statement, next_id = _random_statement(rng, fq, next_id, has_extra)
        spark.sql(statement)
    replica = catalog.load_table("db.dst")
    assert replica.current_snapshot().summary["total-equality-deletes"] == "0"
    # pyiceberg reads the replica (positional deletes / DVs only) and sees what Spark sees
    assert sorted(replica.scan().to_arrow().column("name").to_pylist(), key=str) == sorted(
        (r.name for r in spark.table(f"{cat}.db.dst").collect()), key=str)


@pytest.mark.parametrize("seed,version,mode", [(1, 2, "copy-on-write"), (2, 2, "merge-on-read")])
def test_replica_equals_source_at_every_snapshot(spark, catalog, catalog_settings, seed, version, mode):
    _run(spark, catalog, catalog_settings, seed, version, mode, steps=6)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 9))
@pytest.mark.parametrize("version,mode", [(2, "copy-on-write"), (2, "merge-on-read"), (3, "merge-on-read")])
def test_replica_equals_source_long_random(spark, catalog, catalog_settings, seed, version, mode):
    _run(spark, catalog, catalog_settings, seed, version, mode, steps=15)
