"""Where one snapshot batch's time goes, in-process: per step wall time, Spark jobs, CPU of the Python
thread and of the JVM, catalog loads (pyiceberg ``load_table``) and instance writes (event log rows).

A real lakehouse (SQLite catalog, one table with an Iceberg replica, as ``bench/freshness.py``), a
real SQLite-backed Dagster instance, the real sensor and ``execute_in_process`` runs (what the warm
launcher's lanes execute, minus its queue). Warm-up: the export and ``--warmup`` batches.

Two peers run in the same loop, after each of our batches, so that the floor of each process shows
(``--no-peers`` skips them):

- the same batch written by hand in the same JVM, no Dagster: Iceberg's ``create_changelog_view`` of
  the same snapshot, net changes, then one ``MERGE INTO`` a second replica created as ours is
  (``peer_*``, ``jvm_ratio`` = ours / peer); the two replicas are checked equal at the end;
- Dagster's run machinery without our work: a no-op asset graph shaped like our run (a partitioned
  changelog with its two checks in its step, a replica with one check), one partition per batch on a
  second SQLite instance (``dagster_floor_*``; ``ours_step_code_cpu_s`` = our Python CPU minus it).

Our batch by phase (``--no-phases`` skips it): each engine function below is wrapped, and each phase's JVM and
Python CPU excludes the wrapped phases it calls; ``phase_*`` keys. The peer does by hand what two of our phases
guarantee, in the same loop, after its MERGE (its replica unchanged): the key check (``groupBy`` of the view's
keys, any key twice) and the store (an append of the view's rows to an Iceberg table): ``peer_key_check_jvm_s``,
``peer_store_append_jvm_s``. ``guarantees_floor_cpu_s`` = the peer's view and MERGE + those two + the Dagster
floor: what a batch with our guarantees costs at least, done by hand; ``floor_ratio`` = ours (JVM + Python) / it.

Run: .venv/bin/python bench/batch_profile.py [--batches 10]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from freshness import rows, setup_lake  # noqa: E402

FLOOR_PARTITIONS = "floor_snapshots"


_JVM_PIDS: list[int] = []


def jvm_cpu_s() -> float:
    """CPU seconds of this process's child JVMs (the Spark driver in local mode). The children are found once
    (a scan of /proc), then read by pid: cheap enough to call around each phase."""
    tick = os.sysconf("SC_CLK_TCK")
    if not _JVM_PIDS:
        for entry in Path("/proc").iterdir():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) if entry.name.isdigit() else 0
                if parent == os.getpid():
                    _JVM_PIDS.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    total = 0.0
    for pid in _JVM_PIDS:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


class Phases:
    """JVM and Python CPU of our batch by phase: each function of ``PATCHED`` is wrapped where its callers look it
    up, and a phase's figures exclude the wrapped phases it calls (they add up to the wrapped total)."""

    # (module, class or None, attribute, phase): where the callers look each function up
    PATCHED = (("icecdc_dagster.changelog.engine", None, "check_keys", "key_check"),
               ("icecdc_dagster.steps.changelog_store", "ChangelogStore", "write", "store_write"),
               ("icecdc_dagster.steps.changelog_store", "ChangelogStore", "events_and_ranges", "events_plan"),
               ("icecdc_dagster.sinks.iceberg.sink", "IcebergReplicaSink", "apply", "replica_plan"),
               ("icecdc_dagster.writer.merge", None, "is_committed", "ledger_check"),
               ("icecdc_dagster.writer.merge", None, "staged_commit", "merge"),
               ("icecdc_dagster.writer.exactly_once", None, "publish", "publish"),
               ("icecdc_dagster.writer.merge", None, "merged_counts", "counts"))

    def __init__(self) -> None:
        self.jvm: dict[str, float] = {}
        self.python: dict[str, float] = {}
        self.stack: list[list[float]] = []

    def install(self) -> None:
        import importlib

        for module_name, class_name, attr, name in self.PATCHED:
            module = importlib.import_module(module_name)
            owner = getattr(module, class_name) if class_name else module
            setattr(owner, attr, self._wrap(name, getattr(owner, attr)))

    def _wrap(self, name: str, fn: Any) -> Any:
        import functools

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.stack.append([0.0, 0.0])
            jvm0, py0 = jvm_cpu_s(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                jvm, py = jvm_cpu_s() - jvm0, time.thread_time() - py0
                child_jvm, child_py = self.stack.pop()
                self.jvm[name] = self.jvm.get(name, 0.0) + jvm - child_jvm
                self.python[name] = self.python.get(name, 0.0) + py - child_py
                if self.stack:
                    self.stack[-1][0] += jvm
                    self.stack[-1][1] += py
        return timed

    def take(self) -> dict[str, float]:
        """The phases since the last call, as ``phase <name> jvm`` / ``phase <name> py`` figures."""
        out = {f"phase {k} jvm": v for k, v in self.jvm.items()} | {f"phase {k} py": v for k, v in self.python.items()}
        self.jvm, self.python = {}, {}
        return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--jobs", action="store_true", help="list each measured batch's Spark jobs and their stages")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--no-phases", action="store_true", help="no split of our batch by phase")
    parser.add_argument("--no-peers", action="store_true",
                        help="skip the hand-written batch and the Dagster floor (ours alone)")
    return parser.parse_args()


def prepare_lake(root: Path, spark_conf: list[str]) -> tuple[Any, Path]:
    """The lake and pipeline file of ``bench/freshness.py``, with ``--spark-conf`` added to the pipeline's
    Spark settings (e.g. spark.sql.adaptive.enabled=false), and the environment our definitions read."""
    catalog, config_path = setup_lake(root, 5)
    if spark_conf:
        import yaml

        pipeline = yaml.safe_load(config_path.read_text())
        pipeline["spark"]["conf"].update(dict(item.split("=", 1) for item in spark_conf))
        config_path.write_text(yaml.safe_dump(pipeline))
    os.environ["DAGSTER_HOME"] = str(root / "home")
    (root / "home").mkdir()
    os.environ["ICECDC_CONFIG"] = str(config_path)
    return catalog, config_path


def spark_context() -> Any:
    """The process's SparkContext, None before the first step starts it."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context  # noqa: SLF001


def start_job_group(label: str) -> None:
    """Tag the Spark jobs the calling thread submits from now on, to count them per batch afterwards."""
    sc = spark_context()
    if sc is not None:
        sc.setJobGroup(label, label)


def job_ids(label: str) -> list[int]:
    sc = spark_context()
    return list(sc.statusTracker().getJobIdsForGroup(label)) if sc is not None else []


def print_jobs(ids: list[int]) -> None:
    """Spark's own job records: what each job of a batch was (``--jobs``)."""
    store = spark_context()._jsc.sc().statusStore()  # noqa: SLF001
    for job_id in sorted(ids):
        data = store.job(job_id)
        print(f"  job {job_id}: {data.name()} | {str(data.description())[:100]} | tasks {data.numTasks()}",
              flush=True)
        stage_ids = data.stageIds()
        for i in range(stage_ids.size()):
            stage = store.lastStageAttempt(stage_ids.apply(i))
            cpu, deserialize = stage.executorCpuTime() / 1e9, stage.executorDeserializeCpuTime() / 1e9
            print(f"    stage {stage.stageId()}: {stage.numTasks()} tasks, executor CPU {cpu:.3f} s (deserialize "
                  f"{deserialize:.3f}), run {stage.executorRunTime() / 1e3:.3f} s, {str(stage.name())[:60]}",
                  flush=True)


def count_catalog_loads() -> list[int]:
    """A counter around pyiceberg's real ``SqlCatalog.load_table`` (reset and read by the caller)."""
    from pyiceberg.catalog.sql import SqlCatalog

    loads = [0]
    original = SqlCatalog.load_table

    def counted(self, identifier):  # noqa: ANN001, ANN202
        loads[0] += 1
        return original(self, identifier)

    SqlCatalog.load_table = counted  # type: ignore[method-assign]
    return loads


def count_instance_writes() -> dict[str, int]:
    """A counter of the writes (INSERT/UPDATE/DELETE) to our instance's SQLite files (under ``home``)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    statements = {"instance": 0}

    @event.listens_for(Engine, "before_cursor_execute")
    def _count(conn, cursor, statement, *_):  # noqa: ANN001, ANN202
        url = str(conn.engine.url)
        if "home" in url and statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            statements["instance"] += 1

    return statements


def step_times(instance: Any, run_id: str) -> dict[str, float]:
    """Each step's wall time, from the run's STEP_START / STEP_SUCCESS events."""
    from dagster import DagsterEventType

    starts: dict[str, float] = {}
    out: dict[str, float] = {}
    for entry in instance.all_logs(run_id, of_type={DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS}):
        if entry.dagster_event_type == DagsterEventType.STEP_START:
            starts[entry.step_key] = entry.timestamp
        else:
            out[entry.step_key] = entry.timestamp - starts[entry.step_key]
    return out


class Ours:
    """Our line's batch as the warm launcher runs it: a real sensor tick, then ``execute_in_process`` of the
    run it requests on the instance of ``$DAGSTER_HOME``."""

    def __init__(self, config_path: Path, list_jobs: bool) -> None:
        from dagster import DagsterInstance

        from icecdc_dagster.assets import naming
        from icecdc_dagster.config import load_config
        from icecdc_dagster.definitions import build_definitions
        from icecdc_dagster.launcher import set_sqlite_synchronous

        self.instance = DagsterInstance.get()
        set_sqlite_synchronous(self.instance, "OFF")  # as bench/freshness.py's daemon
        self.config = load_config(str(config_path))
        self.defs = build_definitions(self.config)
        self.table = self.config.tables[0]
        self.sensor = self.defs.get_sensor_def(naming.sensor_name(self.table))
        self.job = self.defs.resolve_implicit_global_asset_job_def()
        self.list_jobs = list_jobs
        self.loads = count_catalog_loads()
        self.writes = count_instance_writes()

    def _request(self) -> Any:
        """One tick of the real sensor; its dynamic partitions added; its one run request."""
        from dagster import build_sensor_context

        context = build_sensor_context(instance=self.instance, instance_ref=self.instance.get_ref(),
                                       resources=self.defs.resources, definitions=self.defs)
        result = self.sensor.evaluate_tick(context)
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        (request,) = result.run_requests
        return request

    def run(self, label: str) -> dict:
        """Tick, then the run: its wall time, Python thread and JVM CPU, Spark jobs, loads, writes, steps."""
        from icecdc_dagster.assets.naming import asset_keys

        t0 = time.monotonic()
        request = self._request()
        tick_s = time.monotonic() - t0
        start_job_group(label)
        self.loads[0], self.writes["instance"] = 0, 0
        jvm0, cpu0, wall0 = jvm_cpu_s(), time.thread_time(), time.monotonic()  # the /proc scans outside python_cpu
        subset = self.job.get_subset(asset_selection=set(asset_keys(self.table)),
                                     asset_check_selection=set(request.asset_check_keys or ()))
        execution = subset.execute_in_process(instance=self.instance, partition_key=request.partition_key,
                                              tags=request.tags)
        wall, python_cpu = time.monotonic() - wall0, time.thread_time() - cpu0
        assert execution.success
        out = {"tick": tick_s, "run": wall, "python_cpu": python_cpu, "jvm_cpu": jvm_cpu_s() - jvm0,
               "spark_jobs": len(job_ids(label)), "catalog_loads": self.loads[0],
               "instance_writes": self.writes["instance"]}
        if self.list_jobs:
            print_jobs(job_ids(label))
        steps = step_times(self.instance, execution.run_id)
        out["steps"] = len(steps)
        for key, seconds in steps.items():
            out[f"step {key.replace('db__events', '').strip('_')}"] = seconds
        out["framework"] = wall - sum(steps.values())
        return out


class HandWrittenPeer:
    """The same batch as a user writes it by hand in the same JVM, no Dagster: Iceberg's changelog view of
    the batch's snapshot range (net changes), then one MERGE into a replica created as ours is. The floor of
    the JVM's work per batch: what ours spends above it is ours."""

    def __init__(self, ours: Ours, snapshot_id: int) -> None:
        """Call after our export: the peer replica starts as the source at the exported ``snapshot_id``."""
        from pyspark.sql import SparkSession

        from icecdc_dagster.writer.tables import copy_table

        self.spark = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
        self.catalog = ours.config.catalog.name
        self.source = ours.table.table_name
        self.ours = ours.table.sinks[0].target
        self.replica = self.ours + "_peer"
        self.keys = list(ours.table.identifier_columns)  # id: the source's identifier field (setup_lake)
        self.columns = [f.name for f in self.spark.table(f"{self.catalog}.{self.source}").schema.fields]
        copy_table(self.spark, self.catalog, self.source, self.replica, self.keys)  # as our sink creates ours
        self.spark.sql(f"INSERT INTO {self.catalog}.{self.replica} SELECT * FROM {self.catalog}.{self.source} "
                       f"VERSION AS OF {snapshot_id}")

    def _merge_sql(self, view: str) -> str:
        """One MERGE of the net changes: a delete removes the key, any other image is written."""
        on = " AND ".join(f"t.{k} = s.{k}" for k in self.keys)
        values = [c for c in self.columns if c not in self.keys]
        return (f"MERGE INTO {self.catalog}.{self.replica} t USING {view} s ON {on} "
                "WHEN MATCHED AND s._change_type = 'DELETE' THEN DELETE "
                f"WHEN MATCHED THEN UPDATE SET {', '.join(f't.{c} = s.{c}' for c in values)} "
                f"WHEN NOT MATCHED AND s._change_type != 'DELETE' THEN INSERT ({', '.join(self.columns)}) "
                f"VALUES ({', '.join(f's.{c}' for c in self.columns)})")

    def batch(self, previous: int, current: int, label: str) -> dict:
        """Snapshots (previous, current] applied: the driver's Python CPU, the JVM's, the Spark jobs.

        ``compute_updates => false``: Iceberg refuses net changes beside update images, which identifier
        columns turn on by default; the view then removes carry-over rows and nets each row's changes. Our
        batches only append, so each key has one net row and MERGE sees no key twice."""
        view = f"peer_changes_{current}"
        start_job_group(label)
        jvm0, cpu0 = jvm_cpu_s(), time.thread_time()
        self.spark.sql(
            f"CALL {self.catalog}.system.create_changelog_view(table => '{self.source}', changelog_view => '{view}', "
            f"options => map('start-snapshot-id', '{previous}', 'end-snapshot-id', '{current}'), "
            f"net_changes => true, compute_updates => false, "
            f"identifier_columns => array({', '.join(repr(k) for k in self.keys)}))")
        self.spark.sql(self._merge_sql(view))
        python_cpu = time.thread_time() - cpu0
        out = {"python_cpu": python_cpu, "jvm_cpu": jvm_cpu_s() - jvm0, "spark_jobs": len(job_ids(label))}
        out |= self._guarantees(view)
        self.spark.catalog.dropTempView(view)
        return out

    def _guarantees(self, view: str) -> dict[str, float]:
        """By hand, what two of our phases guarantee (JVM CPU each, after the MERGE: the view is computed again
        as a user's job would): no key twice in the batch, and the batch's rows kept in an Iceberg table."""
        from pyspark.sql import functions as F

        changes = self.spark.table(view)
        jvm0 = jvm_cpu_s()
        twice = changes.groupBy(*self.keys).count().where(F.col("count") > 1).limit(1).collect()
        assert not twice, f"the peer's batch holds a key twice: {twice}"
        jvm1 = jvm_cpu_s()
        store = f"{self.catalog}.{self.replica}_store"
        if self.spark.catalog.tableExists(store):
            changes.writeTo(store).append()
        else:
            changes.writeTo(store).tableProperty("format-version", "2").create()
        return {"key_check_jvm": jvm1 - jvm0, "store_append_jvm": jvm_cpu_s() - jvm1}

    def agrees(self) -> int:
        """The row count of both replicas, once they hold the same rows (exceptAll both ways): the peer did
        the same work as ours."""
        ours = self.spark.table(f"{self.catalog}.{self.ours}").select(*self.columns)
        peer = self.spark.table(f"{self.catalog}.{self.replica}").select(*self.columns)
        missing, extra = ours.exceptAll(peer).count(), peer.exceptAll(ours).count()
        assert missing == 0 and extra == 0, f"peer replica differs from ours: {missing} missing, {extra} extra"
        return ours.count()


def floor_assets() -> list:
    """No-op assets and checks shaped like our run: a dynamic-partitioned changelog whose step also evaluates its
    two line checks, and a replica on it with one check spec; each returns small metadata."""
    from dagster import (
        AssetCheckResult,
        AssetCheckSpec,
        AssetKey,
        DynamicPartitionsDefinition,
        MaterializeResult,
        asset,
    )

    partitions = DynamicPartitionsDefinition(name=FLOOR_PARTITIONS)
    changelog_key, replica_key = AssetKey(["floor", "changelog"]), AssetKey(["floor", "replica"])

    @asset(key=changelog_key, partitions_def=partitions,
           check_specs=[AssetCheckSpec("line", asset=changelog_key), AssetCheckSpec("stuck", asset=changelog_key)])
    def changelog() -> MaterializeResult:
        return MaterializeResult(metadata={"rows": 10, "snapshot_id": "1"},
                                 check_results=[AssetCheckResult(check_name="line", passed=True, metadata={"gap": 0}),
                                                AssetCheckResult(check_name="stuck", passed=True,
                                                                 metadata={"pending": 0})])

    @asset(key=replica_key, deps=[changelog_key], partitions_def=partitions,
           check_specs=[AssetCheckSpec("counts", asset=replica_key)])
    def replica() -> MaterializeResult:
        return MaterializeResult(metadata={"rows": 10},
                                 check_results=[AssetCheckResult(check_name="counts", passed=True,
                                                                 metadata={"inserted": 10})])

    return [changelog, replica]


class DagsterFloor:
    """Dagster's run machinery without our work: the no-op graph of :func:`floor_assets`, one partition per
    batch, ``execute_in_process`` on a SQLite instance of its own (as ours: a subset of a prebuilt job)."""

    def __init__(self, home: Path) -> None:
        from dagster import DagsterInstance, Definitions

        from icecdc_dagster.launcher import set_sqlite_synchronous

        home.mkdir()
        self.instance = DagsterInstance.from_config(str(home))
        set_sqlite_synchronous(self.instance, "OFF")  # as ours
        assets = floor_assets()
        self.job = Definitions(assets=assets).resolve_implicit_global_asset_job_def()
        self.asset_keys = {key for a in assets for key in a.keys}
        self.check_keys = {key for a in assets for key in a.check_keys}

    def run(self, partition: str) -> dict:
        """One partition's run: the Python thread's CPU (no JVM work here) and its steps."""
        self.instance.add_dynamic_partitions(FLOOR_PARTITIONS, [partition])
        cpu0 = time.thread_time()
        subset = self.job.get_subset(asset_selection=self.asset_keys, asset_check_selection=self.check_keys)
        execution = subset.execute_in_process(instance=self.instance, partition_key=partition)
        cpu = time.thread_time() - cpu0
        assert execution.success
        return {"python_cpu": cpu, "steps": len(step_times(self.instance, execution.run_id))}


def medians(results: list[dict]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


def show(prefix: str, measured: dict) -> None:
    print(prefix + " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in measured.items()),
          flush=True)


def peers_result(ours: dict[str, float], peer: list[dict], floor: list[dict]) -> str:
    """The peers' RESULT keys: medians over the same measured batches as ours."""
    hand, machinery = medians(peer), medians(floor)
    print("peer median: " + ", ".join(f"{k} {v:.2f}" for k, v in hand.items()))
    print("floor median: " + ", ".join(f"{k} {v:.2f}" for k, v in machinery.items()))
    floor_cpu = hand["jvm_cpu"] + hand["key_check_jvm"] + hand["store_append_jvm"] + machinery["python_cpu"]
    return (f" peer_jvm_cpu_s={hand['jvm_cpu']:.2f} peer_python_cpu_s={hand['python_cpu']:.3f} "
            f"peer_key_check_jvm_s={hand['key_check_jvm']:.2f} peer_store_append_jvm_s={hand['store_append_jvm']:.2f} "
            f"guarantees_floor_cpu_s={floor_cpu:.2f} "
            f"floor_ratio={(ours['jvm_cpu'] + ours['python_cpu']) / floor_cpu:.2f} "
            f"peer_spark_jobs={hand['spark_jobs']:.0f} jvm_ratio={ours['jvm_cpu'] / hand['jvm_cpu']:.2f} "
            f"dagster_floor_cpu_s={machinery['python_cpu']:.2f} dagster_floor_steps={machinery['steps']:.0f} "
            f"ours_step_code_cpu_s={ours['python_cpu'] - machinery['python_cpu']:.2f}")


def main() -> None:
    args = parse_args()
    root = Path(tempfile.mkdtemp(prefix="icecdc-profile-"))
    catalog, config_path = prepare_lake(root, args.spark_conf)
    ours = Ours(config_path, args.jobs)
    phases = None if args.no_phases else Phases()
    if phases is not None:
        phases.install()
    ours.run("export")
    table = catalog.load_table("db.events")
    peer = None if args.no_peers else HandWrittenPeer(ours, table.current_snapshot().snapshot_id)
    floor = None if args.no_peers else DagsterFloor(root / "floor_instance")
    results: list[dict] = []
    peer_results: list[dict] = []
    floor_results: list[dict] = []
    for i in range(args.warmup + args.batches):
        table.append(rows(1000 + i * 10, 10))
        snapshot = table.current_snapshot()
        if phases is not None:
            phases.take()
        measured = ours.run(f"batch-{i}")
        measured |= phases.take() if phases is not None else {}
        hand = peer.batch(snapshot.parent_snapshot_id, snapshot.snapshot_id, f"peer-{i}") if peer else None
        machinery = floor.run(str(snapshot.snapshot_id)) if floor else None
        if i >= args.warmup:
            results.append(measured)
            show("", measured)
            if hand is not None and machinery is not None:
                peer_results.append(hand)
                floor_results.append(machinery)
                show("  peer: ", hand)
                show("  floor: ", machinery)
    median = medians(results)
    print("median: " + ", ".join(f"{k} {v:.2f}" for k, v in median.items()))
    extra = ""
    if peer is not None:
        print(f"peer replica = ours: {peer.agrees()} rows")
        extra = peers_result(median, peer_results, floor_results)
    split = " ".join(f"phase_{k.split()[1]}_{k.split()[2]}_s={v:.3f}" for k, v in sorted(median.items())
                     if k.startswith("phase "))
    extra += f" {split}" if split else ""
    print(f"RESULT batch_run_s={median['run']:.2f} python_cpu_s={median['python_cpu']:.2f} "
          f"jvm_cpu_s={median['jvm_cpu']:.2f} spark_jobs={median['spark_jobs']:.0f} "
          f"catalog_loads={median['catalog_loads']:.0f} instance_writes={median['instance_writes']:.0f} "
          f"load_average={os.getloadavg()[0]:.2f}{extra}")


if __name__ == "__main__":
    main()
