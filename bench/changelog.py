"""Changelog engine benchmark.

1. 1M-row partitioned copy-on-write table, 1% of rows updated in one snapshot: our change rows vs
   Iceberg's create_changelog_view(compute_updates => true) in the same SparkSession, in wall time
   (``ratio``) and in CPU seconds of the whole process tree: this Python driver, the driver JVM (local
   executors are its threads) and the Python workers it starts (``cpu_ratio``, steadier than wall time on
   a shared machine). ``spark_ratio``: our Spark carry-over path (shuffle + sort of every row read, the
   reference) against the view. The same on a format v3 table (row lineage: ``v3_ratio``,
   ``v3_cpu_ratio``; against the view on the v3 table, or on the v2 table of the same rows when the view
   refuses v3).
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
from typing import Any

from proc_cpu import children, cpu_s

from icecdc_dagster import changelog
from icecdc_dagster.changelog.read import read_files, touched_files
from icecdc_dagster.runtime.catalog import CatalogSettings
from icecdc_dagster.runtime.spark import SparkSettings, attach_catalog, build_spark_session

ROWS_PER_PARTITION = 62_500
CAT = "bench_cl"


def create(spark, name: str, rows: int, version: int = 2) -> None:
    spark.sql(f"CREATE TABLE {CAT}.db.{name} (id bigint, day int, v string, amount double) USING iceberg "
              f"PARTITIONED BY (day) TBLPROPERTIES ('format-version'='{version}', "
              "'write.update.mode'='copy-on-write')")
    (spark.range(0, rows).selectExpr("id", f"cast(id div {ROWS_PER_PARTITION} as int) day",
                                     "concat('value-', id) v", "id * 0.5 amount")
     .repartition("day").sortWithinPartitions("id").writeTo(f"{CAT}.db.{name}").append())


def tree_cpu(spark) -> dict[str, Any]:
    """CPU seconds so far of this process (driver), the driver JVM (local executors are its threads) and
    each process under the JVM (Python daemon and workers, by pid: see :func:`cpu_delta`)."""
    jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    tree = children()
    pids: set[int] = set()
    stack = list(tree.get(jvm_pid, []))
    while stack:
        pid = stack.pop()
        if pid not in pids:
            pids.add(pid)
            stack += tree.get(pid, [])
    return {"driver": cpu_s(os.getpid()), "jvm": cpu_s(jvm_pid),
            "workers": {pid: cpu_s(pid) for pid in pids}}


def cpu_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """CPU seconds between two :func:`tree_cpu` readings. A worker that exited in between (Spark stops
    idle ones; the daemon ignores SIGCHLD, so no parent collects their CPU) counts 0 from then on, not
    minus its whole life."""
    workers = sum(cpu - before["workers"].get(pid, 0.0) for pid, cpu in after["workers"].items())
    return {"driver": after["driver"] - before["driver"], "jvm": after["jvm"] - before["jvm"], "workers": workers}


SPLIT: dict[str, list[dict[str, float]]] = {}


def timed(spark, run, label: str = "") -> tuple[float, int, float]:
    """(wall seconds, result, CPU seconds of the process tree) of ``run()``; the split per process goes
    to ``SPLIT[label]``."""
    cpu, started = tree_cpu(spark), time.monotonic()
    result = run()
    wall, after = time.monotonic() - started, tree_cpu(spark)
    split = cpu_delta(cpu, after)
    SPLIT.setdefault(label, []).append(split)
    return wall, result, sum(split.values())


def print_split(label: str) -> None:
    """The CPU split of the cheapest run of ``label``."""
    runs = SPLIT.get(label, [])
    if runs:
        best = min(runs, key=lambda r: sum(r.values()))
        print(f"  CPU split {label}: " + ", ".join(f"{k} {v:.2f}s" for k, v in best.items()))


def time_ours(spark, catalog, name: str, carry_over: str = "arrow") -> tuple[float, int]:
    wall, count, _ = time_ours_cpu(spark, catalog, name, carry_over)
    return wall, count


def time_ours_cpu(spark, catalog, name: str, carry_over: str = "arrow") -> tuple[float, int, float]:
    table = catalog.load_table(f"db.{name}")
    sid = table.metadata.current_snapshot().snapshot_id

    def run() -> int:
        # Keep the ChangeSet referenced while counting: its finalizer unpersists the cached change rows,
        # and a count after that would compute them a second time.
        change_set = changelog.changes(spark, CAT, table, sid, ["id"], carry_over=carry_over)
        return change_set.rows.count()

    return timed(spark, run, f"{name}/{carry_over}")


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


def time_icv(spark, catalog, name: str) -> tuple[float, int, float]:
    table = catalog.load_table(f"db.{name}")
    snapshot = table.metadata.current_snapshot()

    def run() -> int:
        spark.sql(f"CALL {CAT}.system.create_changelog_view(table => 'db.{name}', changelog_view => 'icv_{name}', "
                  f"options => map('start-snapshot-id', '{snapshot.parent_snapshot_id}', "
                  f"'end-snapshot-id', '{snapshot.snapshot_id}'), compute_updates => true, "
                  f"identifier_columns => array('id'))")
        return spark.table(f"icv_{name}").count()

    return timed(spark, run, f"{name}/view")


def compare_with_view(spark, catalog, name: str, view_name: str, repeat: int) -> dict[str, tuple]:
    """Best of ``repeat`` interleaved runs of ours (Arrow and Spark carry-over) and of the view; each figure
    (wall, rows, CPU) is the minimum over runs (the machine is shared)."""
    kinds = {"ours": lambda: time_ours_cpu(spark, catalog, name),
             "ours_spark": lambda: time_ours_cpu(spark, catalog, name, "spark"),
             "icv": lambda: time_icv(spark, catalog, view_name)}
    for run in kinds.values():
        run()  # warm-up (JIT, catalog, Python workers), untimed
    runs: dict[str, list] = {k: [] for k in kinds}
    for _ in range(repeat):  # interleaved, so that load from elsewhere hits all alike
        for kind, run in kinds.items():
            runs[kind].append(run())
    for label in (f"{name}/arrow", f"{name}/spark", f"{view_name}/view"):
        print_split(label)
    task_profile()
    return {k: (min(r[0] for r in v), v[0][1], min(r[2] for r in v)) for k, v in runs.items()}


PROFILE = os.path.join(tempfile.gettempdir(), f"icecdc-carry-over-profile-{os.getpid()}.jsonl")


def task_profile() -> None:
    """CPU seconds per task phase of the Arrow path (summed over groups, averaged over runs), then reset."""
    if not os.path.exists(PROFILE):
        return
    import json

    with open(PROFILE) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    os.remove(PROFILE)
    if rows:
        print("  Arrow tasks, CPU-s summed over all runs: " + ", ".join(
            f"{k} {sum(r[k] for r in rows):.2f}" for k in rows[0]) + f" ({len(rows)} group tasks)")


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--big-rows", type=int, default=10_000_000)
    parser.add_argument("--many-files", type=int, default=20_000)
    parser.add_argument("--few-files", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5,
                        help="timed runs of each figure (the minimum counts: the machine is shared)")
    parser.add_argument("--view-only", action="store_true",
                        help="only the comparisons with the view (v2, v3): no scale or file-count case")
    parser.add_argument("--stock-daemon", action="store_true",
                        help="PySpark's own worker daemon (~0.14 CPU-s of set-up per Python task; each new worker "
                        "imports pyiceberg itself)")
    args = parser.parse_args()
    os.environ.setdefault("ICECDC_CACHE_DIR", os.path.expanduser("~/.cache/icecdc"))
    os.environ["ICECDC_CARRY_OVER_PROFILE"] = PROFILE  # Python workers inherit it through the JVM
    conf = {"spark.ui.enabled": "false", "spark.driver.memory": "4g"}
    if args.stock_daemon:  # not our default daemon (icecdc_dagster/runtime/worker_daemon.py)
        conf["spark.python.daemon.module"] = "pyspark.daemon"
    spark = build_spark_session(SparkSettings(master="local[2]", app_name="bench-changelog", conf=conf))
    work = tempfile.mkdtemp(prefix="bench-changelog-")
    try:
        settings = CatalogSettings(name=CAT, uri=f"sqlite:///{work}/catalog.db", warehouse=f"file://{work}/wh")
        catalog = settings.load_pyiceberg()
        attach_catalog(spark, settings)
        catalog.create_namespace("db")
        create(spark, "t1m", args.rows)
        spark.sql(f"UPDATE {CAT}.db.t1m SET v = concat(v, '-u') WHERE id % 100 = 0")
        best = compare_with_view(spark, catalog, "t1m", "t1m", args.repeat)
        (ours, ours_n, ours_cpu), (icv, icv_n, icv_cpu) = best["ours"], best["icv"]
        spark_path, spark_cpu = best["ours_spark"][0], best["ours_spark"][2]
        time_floor(spark, catalog, "t1m")
        floor = min(time_floor(spark, catalog, "t1m") for _ in range(args.repeat))[0]
        floor_columns = min(time_floor_columns(spark, catalog, "t1m") for _ in range(args.repeat))[0]
        print(f"1% update of {args.rows:,} rows (v2, load {load_average()}): ours {ours:.2f}s {ours_cpu:.2f} CPU-s "
              f"({ours_n} rows), create_changelog_view {icv:.2f}s {icv_cpu:.2f} CPU-s ({icv_n} rows), ratio "
              f"{ours / icv:.2f}, cpu_ratio {ours_cpu / icv_cpu:.2f}; Spark carry-over path {spark_path:.2f}s "
              f"{spark_cpu:.2f} CPU-s; floor {floor:.2f}s, floor ratio {ours / floor:.2f}")
        print(f"floor with every column read: {floor_columns:.2f}s, ours / that {ours / floor_columns:.2f}")
        if ours_n != icv_n:
            print(f"WARNING: row counts differ: ours {ours_n}, view {icv_n}")

        create(spark, "t1m3", args.rows, version=3)
        spark.sql(f"UPDATE {CAT}.db.t1m3 SET v = concat(v, '-u') WHERE id % 100 = 0")
        try:
            time_icv(spark, catalog, "t1m3")
            v3_view = "t1m3"
        except Exception as error:  # noqa: BLE001 - the view may refuse v3: compare with it on the v2 table
            print(f"create_changelog_view on v3: {str(error).splitlines()[0][:200]}; v3 compared with the view on v2")
            v3_view = "t1m"
        best3 = compare_with_view(spark, catalog, "t1m3", v3_view, args.repeat)
        (v3, v3_n, v3_cpu), (icv3, icv3_n, icv3_cpu) = best3["ours"], best3["icv"]
        print(f"1% update of {args.rows:,} rows (v3, load {load_average()}): ours {v3:.2f}s {v3_cpu:.2f} CPU-s "
              f"({v3_n} rows), view ({v3_view}) {icv3:.2f}s {icv3_cpu:.2f} CPU-s ({icv3_n} rows), ratio "
              f"{v3 / icv3:.2f}, cpu_ratio {v3_cpu / icv3_cpu:.2f}; Spark carry-over path "
              f"{best3['ours_spark'][0]:.2f}s {best3['ours_spark'][2]:.2f} CPU-s")

        if args.view_only:
            print(f"RESULT ours_s={ours:.3f} icv_s={icv:.3f} ratio={ours / icv:.3f} ours_cpu_s={ours_cpu:.3f} "
                  f"icv_cpu_s={icv_cpu:.3f} cpu_ratio={ours_cpu / icv_cpu:.3f} spark_ratio={spark_path / icv:.3f} "
                  f"spark_cpu_ratio={spark_cpu / icv_cpu:.3f} v3_s={v3:.3f} v3_ratio={v3 / icv3:.3f} "
                  f"v3_cpu_ratio={v3_cpu / icv3_cpu:.3f} floor_s={floor:.3f} load={load_average()}")
            return

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
        print(f"RESULT ours_s={ours:.3f} icv_s={icv:.3f} ratio={ours / icv:.3f} ours_cpu_s={ours_cpu:.3f} "
              f"icv_cpu_s={icv_cpu:.3f} cpu_ratio={ours_cpu / icv_cpu:.3f} spark_ratio={spark_path / icv:.3f} "
              f"spark_cpu_ratio={spark_cpu / icv_cpu:.3f} v3_s={v3:.3f} v3_ratio={v3 / icv3:.3f} "
              f"v3_cpu_ratio={v3_cpu / icv3_cpu:.3f} floor_s={floor:.3f} floor_ratio={ours / floor:.3f} "
              f"scale_ratio={scale:.3f} files_ratio={files_ratio:.3f} load={load_average()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
