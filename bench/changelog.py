"""Changelog engine benchmark.

1. 1M-row partitioned copy-on-write table, 1% of rows updated in one snapshot: our change rows vs
   Iceberg's create_changelog_view(compute_updates => true) in the same SparkSession.
   floor: a plain count of the rows of the files the change touched (the removed files as of the
   parent, the added files as of the snapshot), each read once, in the same session.
2. The same 100-row change (one partition) on a 1M and a BIG-row table (partitions of constant
   size, like daily partitions): our time on BIG / our time on 1M (cost follows the change).
3. The same 1-file change (one row updated) on a table of 20,000 small files and on one of 200:
   our time on 20,000 files / our time on 200 (planning must not grow with the file count).

Run: PYTHONPATH=. .venv/bin/python bench/changelog.py [--rows N] [--big-rows N] [--many-files N]
     [--few-files N] [--repeat N]
"""

import argparse
import os
import shutil
import tempfile
import time

from icecdc_dagster import changelog
from icecdc_dagster.changelog.read import read_files, touched_files
from icecdc_dagster.runtime.catalog import CatalogSettings
from icecdc_dagster.runtime.spark import SparkSettings, attach_catalog, build_spark_session

ROWS_PER_PARTITION = 62_500
CAT = "bench_cl"


def create(spark, name: str, rows: int) -> None:
    spark.sql(f"CREATE TABLE {CAT}.db.{name} (id bigint, day int, v string, amount double) USING iceberg "
              "PARTITIONED BY (day) TBLPROPERTIES ('format-version'='2', 'write.update.mode'='copy-on-write')")
    (spark.range(0, rows).selectExpr("id", f"cast(id div {ROWS_PER_PARTITION} as int) day",
                                     "concat('value-', id) v", "id * 0.5 amount")
     .repartition("day").sortWithinPartitions("id").writeTo(f"{CAT}.db.{name}").append())


def time_ours(spark, catalog, name: str) -> tuple[float, int]:
    table = catalog.load_table(f"db.{name}")
    started = time.monotonic()
    change_set = changelog.changes(spark, CAT, table, table.metadata.current_snapshot().snapshot_id, ["id"])
    count = change_set.rows.count()
    return time.monotonic() - started, count


def time_floor(spark, catalog, name: str) -> tuple[float, int]:
    """The touched files' rows read once (each file as of the snapshot that holds it) and counted."""
    table = catalog.load_table(f"db.{name}")
    plan = changelog.plan_snapshot(table, table.metadata.current_snapshot().snapshot_id)
    before, after = touched_files(table, plan)
    started = time.monotonic()
    count = (read_files(spark, CAT, table, plan.parent_id, before)
             .unionByName(read_files(spark, CAT, table, plan.snapshot_id, after)).count())
    return time.monotonic() - started, count


def time_floor_columns(spark, catalog, name: str) -> tuple[float, int]:
    """Like ``time_floor`` but every column of every row is read (Spark's no-op sink): the reading
    part of any changelog, which a count (Parquet row counts, no column decoded) leaves out."""
    table = catalog.load_table(f"db.{name}")
    plan = changelog.plan_snapshot(table, table.metadata.current_snapshot().snapshot_id)
    before, after = touched_files(table, plan)
    started = time.monotonic()
    (read_files(spark, CAT, table, plan.parent_id, before)
     .unionByName(read_files(spark, CAT, table, plan.snapshot_id, after))
     .write.format("noop").mode("overwrite").save())
    return time.monotonic() - started, 0


def create_files(catalog, name: str, files: int, work: str) -> None:
    """An unpartitioned table of ``files`` small Parquet files (10 rows each), added by pyiceberg
    (``add_files``): quicker than 20,000 Spark write tasks."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = os.path.join(work, f"files-{name}")
    os.makedirs(folder)
    paths = []
    for i in range(files):
        ids = list(range(i * 10, i * 10 + 10))
        path = os.path.join(folder, f"part-{i:05d}.parquet")
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "v": [f"value-{n}" for n in ids]}), path)
        paths.append(f"file://{path}")
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])
    table = catalog.create_table(f"db.{name}", schema=schema, properties={
        "format-version": "2", "write.update.mode": "copy-on-write"})
    table.add_files(paths)


def time_icv(spark, catalog, name: str) -> tuple[float, int]:
    table = catalog.load_table(f"db.{name}")
    snapshot = table.metadata.current_snapshot()
    started = time.monotonic()
    spark.sql(f"CALL {CAT}.system.create_changelog_view(table => 'db.{name}', changelog_view => 'icv_{name}', "
              f"options => map('start-snapshot-id', '{snapshot.parent_snapshot_id}', "
              f"'end-snapshot-id', '{snapshot.snapshot_id}'), compute_updates => true, "
              f"identifier_columns => array('id'))")
    count = spark.table(f"icv_{name}").count()
    return time.monotonic() - started, count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--big-rows", type=int, default=10_000_000)
    parser.add_argument("--many-files", type=int, default=20_000)
    parser.add_argument("--few-files", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5,
                        help="timed runs of each figure (the minimum counts: the machine is shared)")
    args = parser.parse_args()
    os.environ.setdefault("ICECDC_CACHE_DIR", os.path.expanduser("~/.cache/icecdc"))
    spark = build_spark_session(SparkSettings(master="local[2]", app_name="bench-changelog",
                                              conf={"spark.ui.enabled": "false", "spark.driver.memory": "4g"}))
    work = tempfile.mkdtemp(prefix="bench-changelog-")
    try:
        settings = CatalogSettings(name=CAT, uri=f"sqlite:///{work}/catalog.db", warehouse=f"file://{work}/wh")
        catalog = settings.load_pyiceberg()
        attach_catalog(spark, settings)
        catalog.create_namespace("db")
        create(spark, "t1m", args.rows)
        spark.sql(f"UPDATE {CAT}.db.t1m SET v = concat(v, '-u') WHERE id % 100 = 0")
        time_ours(spark, catalog, "t1m")  # warm-up (JIT, catalog), untimed
        time_icv(spark, catalog, "t1m")
        time_floor(spark, catalog, "t1m")
        time_floor_columns(spark, catalog, "t1m")
        runs = {"ours": [], "icv": [], "floor": [], "floor_columns": []}
        for _ in range(args.repeat):  # interleaved, so that load from elsewhere hits all three alike
            runs["ours"].append(time_ours(spark, catalog, "t1m"))
            runs["icv"].append(time_icv(spark, catalog, "t1m"))
            runs["floor"].append(time_floor(spark, catalog, "t1m"))
            runs["floor_columns"].append(time_floor_columns(spark, catalog, "t1m"))
        (ours, ours_n), (icv, icv_n), (floor, floor_n) = (min(runs[k]) for k in ("ours", "icv", "floor"))
        print(f"1% update of {args.rows:,} rows: ours {ours:.2f}s ({ours_n} rows), "
              f"create_changelog_view {icv:.2f}s ({icv_n} rows), ratio {ours / icv:.2f}; "
              f"floor {floor:.2f}s ({floor_n:,} rows read once), floor ratio {ours / floor:.2f}")
        floor_columns = min(runs["floor_columns"])[0]
        print(f"floor with every column read: {floor_columns:.2f}s, ours / that {ours / floor_columns:.2f}")
        if ours_n != icv_n:
            print(f"WARNING: row counts differ: ours {ours_n}, view {icv_n}")

        def interleaved(names: tuple[str, str]) -> dict[str, tuple[float, int]]:
            """Best of ``--repeat`` runs on each table, taking turns (load from elsewhere hits both alike)."""
            for name in names:
                time_ours(spark, catalog, name)  # warm-up, untimed
            timings: dict[str, list[tuple[float, int]]] = {name: [] for name in names}
            for _ in range(args.repeat):
                for name in names:
                    timings[name].append(time_ours(spark, catalog, name))
            return {name: min(runs) for name, runs in timings.items()}

        for name, rows in (("s1m", args.rows), ("sbig", args.big_rows)):
            started = time.monotonic()
            create(spark, name, rows)
            print(f"created {name} ({rows:,} rows) in {time.monotonic() - started:.1f}s")
            spark.sql(f"UPDATE {CAT}.db.{name} SET v = concat(v, '-u') WHERE day = 3 AND id % 625 = 0")
        small_times = interleaved(("s1m", "sbig"))
        for name, rows in (("s1m", args.rows), ("sbig", args.big_rows)):
            print(f"100-row change on {rows:,} rows: ours {small_times[name][0]:.2f}s "
                  f"({small_times[name][1]} change rows)")
        scale = small_times["sbig"][0] / small_times["s1m"][0]
        print(f"scale ratio ({args.big_rows:,} vs {args.rows:,} rows): {scale:.2f}")

        for name, files in (("ffew", args.few_files), ("fmany", args.many_files)):
            started = time.monotonic()
            create_files(catalog, name, files, work)
            print(f"created {name} ({files:,} files) in {time.monotonic() - started:.1f}s")
            spark.sql(f"UPDATE {CAT}.db.{name} SET v = concat(v, '-u') WHERE id = 7")
        file_times = interleaved(("ffew", "fmany"))
        for name, files in (("ffew", args.few_files), ("fmany", args.many_files)):
            print(f"1-file change on {files:,} files: ours {file_times[name][0]:.2f}s "
                  f"({file_times[name][1]} change rows)")
        files_ratio = file_times["fmany"][0] / file_times["ffew"][0]
        print(f"files ratio ({args.many_files:,} vs {args.few_files:,} files): {files_ratio:.2f}")
        print(f"RESULT ours_s={ours:.3f} icv_s={icv:.3f} ratio={ours / icv:.3f} floor_s={floor:.3f} "
              f"floor_ratio={ours / floor:.3f} scale_ratio={scale:.3f} files_ratio={files_ratio:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
