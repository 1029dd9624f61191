"""Where one snapshot batch's time goes, in-process: per step wall time, Spark jobs, CPU of the Python
thread and of the JVM, catalog loads (pyiceberg ``load_table``) and instance writes (event log rows).

A real lakehouse (SQLite catalog, one table with an Iceberg replica, as ``bench/freshness.py``), a
real SQLite-backed Dagster instance, the real sensor and ``execute_in_process`` runs (what the warm
launcher's lanes execute, minus its queue). Warm-up: the export and ``--warmup`` batches.

Run: .venv/bin/python bench/batch_profile.py [--batches 10]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from freshness import rows, setup_lake  # noqa: E402


def jvm_cpu_s() -> float:
    """CPU seconds of this process's child JVMs (the Spark driver in local mode)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == os.getpid():  # ppid
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--jobs", action="store_true", help="list the Spark jobs of the first measured batch")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="icecdc-profile-"))
    catalog, config_path = setup_lake(root, 5)
    if args.spark_conf:  # extra Spark settings for the pipeline, e.g. spark.sql.adaptive.enabled=false
        import yaml

        pipeline = yaml.safe_load(config_path.read_text())
        pipeline["spark"]["conf"].update(dict(item.split("=", 1) for item in args.spark_conf))
        config_path.write_text(yaml.safe_dump(pipeline))
    os.environ["DAGSTER_HOME"] = str(root / "home")
    (root / "home").mkdir()
    os.environ["ICECDC_CONFIG"] = str(config_path)

    from dagster import DagsterEventType, DagsterInstance, build_sensor_context
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from icecdc_dagster.assets import naming
    from icecdc_dagster.assets.naming import asset_keys
    from icecdc_dagster.config import load_config
    from icecdc_dagster.definitions import build_definitions

    instance = DagsterInstance.get()
    from icecdc_dagster.launcher import set_sqlite_synchronous

    set_sqlite_synchronous(instance, "OFF")  # as bench/freshness.py's daemon
    config = load_config(str(config_path))
    defs = build_definitions(config)
    table_config = config.tables[0]
    sensor = defs.get_sensor_def(naming.sensor_name(table_config))
    job = defs.resolve_implicit_global_asset_job_def()

    loads = [0]
    original = SqlCatalog.load_table

    def counted(self, identifier):  # noqa: ANN001, ANN202
        loads[0] += 1
        return original(self, identifier)

    SqlCatalog.load_table = counted  # type: ignore[method-assign]  # a counter around the real call
    statements = {"instance": 0}

    @event.listens_for(Engine, "before_cursor_execute")
    def _count(conn, cursor, statement, *_):  # noqa: ANN001, ANN202
        url = str(conn.engine.url)
        if "home" in url and statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            statements["instance"] += 1

    def tick_and_run(label: str) -> dict:
        context = build_sensor_context(instance=instance, instance_ref=instance.get_ref(), resources=defs.resources,
                                       definitions=defs)
        t0 = time.monotonic()
        result = sensor.evaluate_tick(context)
        tick_s = time.monotonic() - t0
        for request in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        (request,) = result.run_requests
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        if sc is not None:
            sc.setJobGroup(label, label)
        loads[0], statements["instance"] = 0, 0
        cpu0, jvm0, wall0 = time.thread_time(), jvm_cpu_s(), time.monotonic()
        subset = job.get_subset(asset_selection=set(asset_keys(table_config)),
                                asset_check_selection=set(request.asset_check_keys or ()))
        execution = subset.execute_in_process(instance=instance, partition_key=request.partition_key,
                                              tags=request.tags)
        wall = time.monotonic() - wall0
        assert execution.success
        sc = SparkContext._active_spark_context
        job_ids = list(sc.statusTracker().getJobIdsForGroup(label)) if sc is not None else []
        jobs = len(job_ids)
        if args.jobs and sc is not None and label == "batch-0":
            store = sc._jsc.sc().statusStore()  # noqa: SLF001 - Spark's own job records: what each job was
            for job_id in sorted(job_ids):
                data = store.job(job_id)
                print(f"  job {job_id}: {data.name()} | {str(data.description())[:100]} | "
                      f"tasks {data.numTasks()}", flush=True)
        out = {"tick": tick_s, "run": wall, "python_cpu": time.thread_time() - cpu0, "jvm_cpu": jvm_cpu_s() - jvm0,
               "spark_jobs": jobs, "catalog_loads": loads[0], "instance_writes": statements["instance"]}
        starts: dict[str, float] = {}
        steps = 0.0
        for entry in instance.all_logs(execution.run_id, of_type={DagsterEventType.STEP_START,
                                                                   DagsterEventType.STEP_SUCCESS}):
            if entry.dagster_event_type == DagsterEventType.STEP_START:
                starts[entry.step_key] = entry.timestamp
            else:
                name = entry.step_key.replace("db__events", "").strip("_")
                out[f"step {name}"] = entry.timestamp - starts[entry.step_key]
                steps += entry.timestamp - starts[entry.step_key]
        out["framework"] = wall - steps
        return out

    tick_and_run("export")
    table = catalog.load_table("db.events")
    results = []
    for i in range(args.warmup + args.batches):
        table.append(rows(1000 + i * 10, 10))
        measured = tick_and_run(f"batch-{i}")
        if i >= args.warmup:
            results.append(measured)
            print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in measured.items()),
                  flush=True)
    median = {k: statistics.median(r[k] for r in results) for k in results[0]}
    print("median: " + ", ".join(f"{k} {v:.2f}" for k, v in median.items()))
    print(f"RESULT batch_run_s={median['run']:.2f} python_cpu_s={median['python_cpu']:.2f} "
          f"jvm_cpu_s={median['jvm_cpu']:.2f} spark_jobs={median['spark_jobs']:.0f} "
          f"catalog_loads={median['catalog_loads']:.0f} instance_writes={median['instance_writes']:.0f} "
          f"load_average={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
