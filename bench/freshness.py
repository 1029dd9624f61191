"""Freshness under the real daemon: snapshot commit -> batch applied in the sink.

Starts `dagster dev` (webserver + daemon) on a fresh local lakehouse with one
table and an Iceberg replica sink, commits 20 snapshots one after another with
pyiceberg, and measures for each the time from the snapshot's commit to the
sink's materialisation of that partition. Also the wall time of an empty batch
(a snapshot with no files). Two launch modes, measured in the same run:

- default: Dagster's default run launcher (a new process and a cold JVM per run);
- warm: icecdc_dagster.launcher.WarmRunLauncher (runs execute in one
  long-lived process that keeps its SparkSession warm).

Both modes use the same run queue settings (max_concurrent_runs lanes + ``--queue-extra``, dequeue
every second); the warm mode also enables run monitoring, as recommended in
the launcher's docstring. Each latency is split into: commit -> run created
(sensor tick cadence), created -> started (run queue + launch, incl. a new
process in default mode), started -> applied (the batch itself).
The last line is the warm mode (the chosen design); the default mode's figures
and the ratio are extra keys.

Many tables (``--tables 20``, warm mode, ``--workers`` lanes): N tables with a replica each
commit together, ``--warm-rounds`` + ``--rounds`` times; each table's latency is commit -> applied, and
``multi_table_p95_s`` is the 95th percentile over every table of every measured round (the daemon
warmed up: a long-running daemon's steady state), ``multi_table_cold_p95_s`` that of the first round
after the exports (a fresh JVM still compiling Spark's code). The instance runs ``workers`` lanes with
``max_concurrent_runs = workers + --queue-extra`` (default 1, as docs/warm-launcher.md recommends: a lane
that ends a run starts the next one handed to it, without waiting for the queue's next dequeue) and one run
per line (tag limit).

Instance kinds (``--instance sqlite|postgres|both``): where the Dagster instance keeps runs, events and
schedules. ``sqlite`` (default): files under DAGSTER_HOME. ``postgres``: each scenario gets a fresh database
on the PostgreSQL server at 127.0.0.1:5432 (trust auth; ``--pg-server``), named in ``dagster.yaml``'s
``storage: postgres`` block through an environment variable (as ``icecdc`` writes it), dropped afterwards.
``both``: the same run measures both kinds, interleaved (one table: SQLite then PostgreSQL; then the many-tables
scenario in the same order), so machine load hits both alike; the RESULT line then has ``sqlite_*`` and
``pg_*`` keys and ``pg_ratio`` (PostgreSQL / SQLite single-table p50) and ``pg_multi_ratio`` (20-table p95).

Layouts (many tables, SQLite instance): the shipped layout is ``snapshot_sensors: auto`` (a sensor per table
below 10 tables, one sensor for all from 10); ``--sensors both`` also measures the other layout at each count
(``per_table_sensors`` or ``one_sensor``) against it; ``--tables 20,50`` each count. Per layout and count: p50/p95,
the control plane's CPU per sensor loop at rest (``idle_loop_cpu_s``: every process of ``dagster dev`` with
its ended children, e.g. a run's compute-log ``tail`` and watcher; on a PostgreSQL instance also the server's
processes, ``postgres server``), CPU-seconds per batch by process (``batch_cpu_s``, the same processes),
steps and Spark jobs per run; the other layout's
``*_ratio`` keys are against the shipped layout at the same count, in the same run.

Usage: python bench/freshness.py [--commits 20] [--interval 5] [--modes warm,default]
                                 [--tables 20[,50] --warm-rounds 4 --rounds 3 --workers 3]
                                 [--sensors shipped|per-table|one|both]
                                 [--instance sqlite|postgres|both]
       python bench/freshness.py --sustained 100 [--sustained-minutes 10 --commit-every 60]
                                 [--snapshot-sensors auto|per_table|one] [--instance sqlite|postgres|both]

Sustained (``--sustained N``, alone): N tables each commit every ``--commit-every`` seconds at staggered times
for ``--sustained-minutes``; ``tables_<N>_p95_s`` over every commit, ``backlog_end`` = commits not applied when
the commits stop, against ``backlog_allowed`` = the commits of the last sensor interval.

Each many-tables RESULT also holds ``tables_<N>_p95_s``, the per-step medians (``step_<step>_s``), the
per-process CPU per batch (``batch_cpu_<process>_s``) and ``spark_job_split`` (per call site: jobs and
median wall seconds per run, from the warm launcher's run profile).
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC
from pathlib import Path

import pyarrow as pa
import yaml

PROFILE_ENV = "ICECDC_RUN_PROFILE"  # icecdc_dagster.launcher.PROFILE_ENV (not imported: the bench
                                    # also measures revisions without it)

TABLE = "db.events"
# At rest an idle line's tick compares the catalog's record, and once a minute reads the table in full
# (sensors/snapshots.py IDLE_RECHECK_S): a window of one full minute averages both, a shorter one
# depends on whether the full checks fall in it (20 s windows: 0.31-0.36 CPU-s per loop, same code).
IDLE_MEASURE_S = 60.0
SENSOR_LOOP_S = 5.0  # Dagster's sensor daemon looks at every sensor once per loop
SINK_KEY = ["replica", "replica", "replica_events"]
PG_SERVER = "postgresql://postgres@127.0.0.1:5432"
PG_URL_ENV = "ICECDC_BENCH_PG_URL"  # the instance's database URL, read by every process of the scenario
TIMEOUTS = {"scale": 1.0}  # --timeouts-x: every wait's timeout times this (a machine under heavy load)
QUEUE = {"extra": 1}  # --queue-extra: the shipped recommendation, max_concurrent_runs = lanes + 1
LANES = {"process": False}  # --lane-process: the warm launcher's lanes in a process of their own


@contextmanager
def instance_storage(kind: str, server: str = PG_SERVER) -> Iterator[dict | None]:
    """The ``storage`` block of a fresh instance of ``kind`` (None: SQLite files under DAGSTER_HOME).

    PostgreSQL: a new database on ``server`` for this scenario alone, its URL in ``PG_URL_ENV`` (the block
    names the variable, as ``icecdc`` writes it), dropped afterwards even if the scenario failed."""
    if kind == "sqlite":
        yield None
        return
    name = f"icecdc_bench_{uuid.uuid4().hex[:10]}"
    pg_admin(server, f"CREATE DATABASE {name}")
    os.environ[PG_URL_ENV] = f"{server}/{name}".replace("postgresql://", "postgresql+psycopg2://")
    try:
        yield {"postgres": {"postgres_url": {"env": PG_URL_ENV}}}
    finally:
        os.environ.pop(PG_URL_ENV, None)
        pg_admin(server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def pg_admin(server: str, sql: str) -> None:
    """One statement on the server's maintenance database (CREATE / DROP DATABASE need autocommit)."""
    import psycopg2  # type: ignore[import-untyped]

    conn = psycopg2.connect(f"{server}/postgres")
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def write_home(home: Path, mode: str, workers: int = 1, sqlite_synchronous: str = "",
               storage: dict | None = None) -> None:
    home.mkdir(parents=True, exist_ok=True)
    config: dict = {"telemetry": {"enabled": False},
                    "run_queue": {"max_concurrent_runs": workers + QUEUE["extra"], "dequeue_interval_seconds": 1,
                                  "tag_concurrency_limits": [{"key": "icecdc/table", "limit": 1,
                                                              "value": {"applyLimitPerUniqueValue": True}}]},
                    # Sensor ticks of many tables in parallel (the daemon's default is one at a time).
                    "sensors": {"use_threads": True, "num_workers": 4}}
    if mode == "warm":
        launcher: dict = {"workers": workers, **({"lane_process": True} if LANES["process"] else {})}
        if sqlite_synchronous and storage is None:
            launcher["sqlite_synchronous"] = sqlite_synchronous
        config["run_launcher"] = {"module": "icecdc_dagster.launcher", "class": "WarmRunLauncher",
                                  "config": launcher}
        config["run_monitoring"] = {"enabled": True, "max_resume_run_attempts": 0, "poll_interval_seconds": 30}
    if storage is not None:
        config["storage"] = storage
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))


def setup_lake(root: Path, interval: int, names: tuple[str, ...] = (TABLE,),  # noqa: ANN201
               snapshot_sensors: str = "auto", snapshots_per_run: int | None = 1):
    """``snapshots_per_run``: the tables' ``max_snapshots_per_run`` (1: each commit its own batch, so a
    latency is one commit's; None: the shipped default, a table behind takes its pending snapshots as one)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "payload", StringType()),
                    identifier_field_ids=[1])
    for name in names:
        catalog.create_table(name, schema=schema).append(rows(0, 100))
    config = {
        "catalog": {"name": "bench", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"},
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}},
        "tables": [{"table_name": name, "identifier_columns": ["id"], "polling_interval": f"PT{interval}S",
                    **({} if snapshots_per_run is None else {"max_snapshots_per_run": snapshots_per_run}),
                    "sinks": [{"iceberg": {"table_name": "replica." + name.split(".")[1]}}]} for name in names],
        "snapshot_sensors": snapshot_sensors,
    }
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return catalog, path


def rows(start: int, count: int) -> pa.Table:
    ids = pa.array(range(start, start + count), pa.int64())
    return pa.table({"id": ids, "payload": pa.array([f"row-{i}" for i in range(start, start + count)])},
                    schema=pa.schema([pa.field("id", pa.int64(), nullable=False), ("payload", pa.string())]))


def applied_at(instance, partition: str, sink_key: tuple[str, ...] = tuple(SINK_KEY)) -> float | None:  # noqa: ANN001
    from dagster import AssetKey, AssetRecordsFilter

    result = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(list(sink_key)), asset_partitions=[partition]), limit=1)
    return result.records[0].timestamp if result.records else None


def wait_applied(instance, partition: str, timeout: float,  # noqa: ANN001
                 sink_key: tuple[str, ...] = tuple(SINK_KEY)) -> float:
    timeout *= TIMEOUTS["scale"]
    deadline = time.time() + timeout
    while time.time() < deadline:
        stamp = applied_at(instance, partition, sink_key)
        if stamp is not None:
            return stamp
        time.sleep(0.2)
    raise TimeoutError(f"snapshot {partition} was not applied within {timeout}s")


def run_mode(mode: str, commits: int, interval: int, sqlite_synchronous: str = "",
             storage: dict | None = None) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"icecdc-fresh-{mode}-"))
    catalog, config_path = setup_lake(root, interval)
    home = root / "dagster_home"
    write_home(home, mode, sqlite_synchronous=sqlite_synchronous, storage=storage)
    process, instance = start_dagster(root, home, config_path)
    try:
        table = catalog.load_table(TABLE)
        bootstrap = str(table.current_snapshot().snapshot_id)
        wait_applied(instance, bootstrap, 300)
        wait_run_finished(instance, bootstrap, 120)
        latencies, parts = [], []
        for i in range(commits):
            table.append(rows(1000 + i * 10, 10))
            snapshot = table.current_snapshot()
            key = str(snapshot.snapshot_id)
            committed = snapshot.timestamp_ms / 1000
            stamp = wait_applied(instance, key, 180)
            record = wait_run_finished(instance, key, 120)
            latencies.append(stamp - committed)
            created = record.create_timestamp.timestamp()
            parts.append((created - committed, record.start_time - created, stamp - record.start_time))
            print(f"[{mode}] commit {i + 1:2d}: applied after {latencies[-1]:5.1f}s  (sensor {parts[-1][0]:4.1f}s,"
                  f" queue+launch {parts[-1][1]:4.1f}s, run {parts[-1][2]:4.1f}s)", flush=True)
        table.append(rows(0, 0))  # a snapshot with no files: an empty batch
        empty = table.current_snapshot()
        wait_applied(instance, str(empty.snapshot_id), 180)
        record = wait_run_finished(instance, str(empty.snapshot_id), 120)
        empty_s = record.end_time - record.create_timestamp.timestamp()
        print(f"[{mode}] empty batch: {empty_s:.1f}s from run created to run finished "
              f"(queue+launch {record.start_time - record.create_timestamp.timestamp():.1f}s, "
              f"run {record.end_time - record.start_time:.1f}s)", flush=True)
    finally:
        stop_dagster(process)
        instance.dispose()
    for name, values in zip(("sensor", "queue+launch", "run"), zip(*parts, strict=True), strict=True):
        print(f"[{mode}] median {name}: {statistics.median(values):.1f}s", flush=True)
    latencies.sort()
    p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
    return {"p50": statistics.median(latencies), "p95": p95, "empty": empty_s}


def wait_run_finished(instance, partition: str, timeout: float):  # noqa: ANN001, ANN201 - RunRecord
    """The finished run of this partition (its status is final; FAILURE/CANCELED raise)."""
    from dagster import DagsterRunStatus, RunsFilter

    timeout *= TIMEOUTS["scale"]
    deadline = time.time() + timeout
    while time.time() < deadline:
        records = instance.get_run_records(RunsFilter(tags={"dagster/partition": partition}), limit=1)
        if records and records[0].dagster_run.is_finished and records[0].end_time is not None:
            if records[0].dagster_run.status != DagsterRunStatus.SUCCESS:
                raise RuntimeError(f"run of {partition} ended {records[0].dagster_run.status}")
            return records[0]
        time.sleep(0.2)
    raise TimeoutError(f"the run of snapshot {partition} did not finish within {timeout}s")


def start_dagster(root: Path, home: Path, config_path: Path):  # noqa: ANN201 - (process, instance)
    """``dagster dev`` on the shipped definitions of ``config_path``."""
    from dagster import DagsterInstance

    # The storage is created here, before `dagster dev` starts: two processes creating one SQLite
    # storage at once can leave two alembic heads, and then the code server cannot load.
    os.environ["DAGSTER_HOME"] = str(home)
    instance = DagsterInstance.get()
    env = {**os.environ, "DAGSTER_HOME": str(home), "ICECDC_CONFIG": str(config_path)}
    dagster = Path(sys.executable).parent / "dagster"
    log = (root / "dagster.log").open("w")
    process = subprocess.Popen([str(dagster), "dev", "-m", "icecdc_dagster.definitions", "-p", "0"],
                               env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
    return process, instance


def stop_dagster(process) -> None:  # noqa: ANN001
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)


def start_lake(prefix: str, names: tuple[str, ...], interval: int, snapshot_sensors: str, workers: int,  # noqa: ANN201
               sqlite_synchronous: str, storage: dict | None, snapshots_per_run: int | None = 1):
    """A fresh lake of ``names`` under a temporary root, ``dagster dev`` on it with the warm launcher, and the
    warm launcher's per-run profile (wall, lane CPU, Spark jobs) written to ``runs.jsonl`` there. Returns
    (catalog, process, instance, profile)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    catalog, config_path = setup_lake(root, interval, names, snapshot_sensors, snapshots_per_run)
    home = root / "dagster_home"
    write_home(home, "warm", workers, sqlite_synchronous, storage)
    profile = root / "runs.jsonl"
    os.environ[PROFILE_ENV] = str(profile)
    process, instance = start_dagster(root, home, config_path)
    return catalog, process, instance, profile


def wait_exports(catalog, instance, names: tuple[str, ...], timeout: float) -> dict:  # noqa: ANN001
    """Wait until every table's bootstrap export is applied in its replica; returns table -> replica asset key."""
    sink_keys = {name: ("replica", "replica", "replica_" + name.split(".")[1]) for name in names}
    for name in names:
        wait_applied(instance, str(catalog.load_table(name).current_snapshot().snapshot_id), timeout, sink_keys[name])
    return sink_keys


def run_many_tables(tables: int, rounds: int, workers: int, interval: int, sqlite_synchronous: str = "",
                    warm_rounds: int = 0, storage: dict | None = None, label: str = "many",
                    snapshot_sensors: str = "auto") -> dict:
    """N tables commit together, ``warm_rounds`` + ``rounds`` times: commit -> applied for every table.

    The first ``warm_rounds`` warm the daemon up and are reported apart (``cold``: the first of them):
    a fresh driver JVM spends most of its first ~100 batches' CPU compiling Spark's own code (JIT: C2
    and C1 threads took ~2x the CPU of the work itself over the first 30 s of batches, and settle
    after ~100), a cost a long-running daemon pays once, not per round.
    """
    names = tuple(f"db.events_{i:02d}" for i in range(tables))
    catalog, process, instance, profile = start_lake("icecdc-fresh-many-", names, interval, snapshot_sensors,
                                                     workers, sqlite_synchronous, storage)
    latencies: list[float] = []
    commits: dict[str, float] = {}  # partition key -> commit time
    try:
        started = time.time()
        sink_keys = wait_exports(catalog, instance, names, 900)
        print(f"[{label}] {tables} exports applied in {time.time() - started:.1f}s", flush=True)
        time.sleep(2 * interval)  # the last export's run ends, idle ticks settle
        idle_before, since = process_cpu(process.pid, storage is not None), time.time()
        time.sleep(IDLE_MEASURE_S)  # nothing committed: what the control plane costs at rest
        idle = process_cpu(process.pid, storage is not None)
        span = time.time() - since
        idle_cores = {name: (idle[name] - idle_before.get(name, 0.0)) / span for name in idle}
        # The sensor daemon looks at every sensor once per loop (5 s): CPU per loop is cores x 5 s.
        print(f"[{label}] idle ({tables} tables, nothing to do, {span:.0f}s): " + ", ".join(
            f"{name} {cores:.3f}" for name, cores in sorted(idle_cores.items()))
            + f" cores; total {sum(idle_cores.values()):.3f} cores = {sum(idle_cores.values()) * SENSOR_LOOP_S:.2f}"
            f" CPU-s per sensor loop", flush=True)
        cold: list[float] = []
        for round_ in range(warm_rounds + rounds):
            if round_ == warm_rounds:
                cpu_before, since = process_cpu(process.pid, storage is not None), time.time()
            committed = {}
            for name in names:
                table = catalog.load_table(name)
                table.append(rows(1000 + round_ * 10, 10))
                snapshot = table.current_snapshot()
                committed[name] = (str(snapshot.snapshot_id), snapshot.timestamp_ms / 1000)
            round_latencies = []
            for name, (key, at) in committed.items():
                round_latencies.append(wait_applied(instance, key, 900, sink_keys[name]) - at)
            kind = "warm-up round" if round_ < warm_rounds else "round"
            print(f"[{label}] {kind} {round_ + 1}: {tables} tables, latency min {min(round_latencies):.1f}s "
                  f"median {statistics.median(round_latencies):.1f}s max {max(round_latencies):.1f}s "
                  f"({load()})", flush=True)
            if round_ < warm_rounds:
                cold = cold or round_latencies
                continue
            latencies += round_latencies
            commits.update(dict(committed.values()))
        span = time.time() - since
        cpu_after = process_cpu(process.pid, storage is not None)
        medians = breakdown(instance, commits, profile, workers, label)
        cpu = {name: cpu_after.get(name, 0.0) - cpu_before.get(name, 0.0) for name in cpu_after}
        runs = len(commits)
        print(f"[{label}] CPU over the rounds ({span:.1f}s wall, {runs} runs): " + ", ".join(
            f"{name} {seconds:.1f}s ({seconds / runs:.2f}s/run)" for name, seconds in sorted(cpu.items())
            if seconds >= 0.05) + f"; total {sum(cpu.values()) / runs:.2f} CPU-s/run, "
            f"{sum(cpu.values()) / span:.2f} cores busy", flush=True)
    finally:
        os.environ.pop(PROFILE_ENV, None)
        stop_dagster(process)
        instance.dispose()
    return {"p50": statistics.median(latencies), "p95": percentile(latencies, 0.95),
            "cold_p95": percentile(cold, 0.95) if cold else None,
            "idle_loop_cpu_s": sum(idle_cores.values()) * SENSOR_LOOP_S,
            "idle_daemon_loop_cpu_s": (idle_cores.get("daemon", 0.0) + idle_cores.get("code server", 0.0))
            * SENSOR_LOOP_S,
            "batch_cpu_s": sum(cpu.values()) / runs, "batch_cpu": {k: v / runs for k, v in cpu.items()},
            "steps": medians.get("steps", 0.0), "run_s": medians.get("run", 0.0),
            "spark_jobs": medians.get("spark_jobs", 0.0), "framework_s": medians.get("framework", 0.0),
            "medians": medians}


def run_sustained(tables: int, minutes: float, every_s: float, workers: int, interval: int,
                  sqlite_synchronous: str = "", storage: dict | None = None, snapshot_sensors: str = "auto",
                  label: str = "sustained", drain_s: float = 600.0) -> dict:
    """``tables`` tables each commit once every ``every_s`` seconds, staggered evenly (table i at i/N of the
    period), for ``minutes``: commit -> applied of every commit, the backlog (commits not applied) at the end
    of every period, and at the end against the commits of the last period (a pipeline that keeps up has at
    most each table's latest commit in flight). The tables keep the shipped ``max_snapshots_per_run``: a
    table behind takes its pending snapshots as one batch, as in production. The exports are applied first
    and not measured."""
    names = tuple(f"db.events_{i:03d}" for i in range(tables))
    catalog, process, instance, profile = start_lake("icecdc-fresh-sustained-", names, interval, snapshot_sensors,
                                                     workers, sqlite_synchronous, storage, snapshots_per_run=None)
    commits: list[tuple[str, str, float]] = []  # table, partition key, commit time
    stamps: dict[str, float] = {}  # partition key -> applied at
    backlogs: list[int] = []  # commits not applied at the end of each period
    try:
        started = time.time()
        sink_keys = wait_exports(catalog, instance, names, 1800)
        print(f"[{label}] {tables} exports applied in {time.time() - started:.1f}s ({load()})", flush=True)
        time.sleep(2 * interval)
        cpu_before, begin = process_cpu(process.pid, storage is not None), time.time()
        schedule = sorted((period * every_s + i * every_s / tables, name)
                          for period in range(max(1, round(minutes * 60 / every_s))) for i, name in enumerate(names))
        loaded = {name: catalog.load_table(name) for name in names}
        for n, (offset, name) in enumerate(schedule):
            delay = begin + offset - time.time()
            if delay > 0:
                time.sleep(delay)
            table = loaded[name]
            table.append(rows(1000 + n * 10, 10))
            snapshot = table.current_snapshot()
            commits.append((name, str(snapshot.snapshot_id), snapshot.timestamp_ms / 1000))
            if (n + 1) % tables == 0:
                backlogs.append(pending_commits(instance, commits, stamps, sink_keys))
                print(f"[{label}] {n + 1} commits, {time.time() - begin:.0f}s, {backlogs[-1]} not applied "
                      f"({load()})", flush=True)
        end = time.time()
        late = max(0.0, end - (begin + schedule[-1][0]))
        from datetime import datetime

        from dagster import DagsterRunStatus, RunsFilter

        # CPU per batch: over the runs that ended while the commits went on (a backlog leaves commits unapplied)
        runs_done = instance.get_runs_count(RunsFilter(
            statuses=[DagsterRunStatus.SUCCESS], updated_after=datetime.fromtimestamp(begin, UTC),
            updated_before=datetime.fromtimestamp(end, UTC)))
        cpu_after = process_cpu(process.pid, storage is not None)
        # Drain for at most drain_s: a commit still not applied then counts with the time it waited so far
        # (its latency is at least that), and the p95 is then a lower bound.
        drain_end = time.time() + drain_s
        while pending_commits(instance, commits, stamps, sink_keys) and time.time() < drain_end:
            time.sleep(1.0)
        unapplied = [key for _, key, _ in commits if key not in stamps]
        for key in unapplied:
            stamps[key] = time.time()
        done = {key: at for _, key, at in commits if key not in set(unapplied)}
        medians = breakdown(instance, done, profile, workers, label) if not unapplied else {}
    finally:
        os.environ.pop(PROFILE_ENV, None)
        stop_dagster(process)
        instance.dispose()
    latencies = [stamps[key] - at for _, key, at in commits]
    backlog = sum(1 for _, key, _ in commits if stamps[key] > end)
    allowed = sum(1 for _, _, at in commits if at > end - every_s)
    cpu = {name: cpu_after.get(name, 0.0) - cpu_before.get(name, 0.0) for name in cpu_after}
    runs = max(runs_done, 1)
    minute = [stamps[key] - at for _, key, at in commits if at > end - 60]
    print(f"[{label}] {len(commits)} commits over {end - begin:.0f}s (the committer {late:.1f}s behind its "
          f"schedule at the end): p50 {statistics.median(latencies):.1f}s p95 {percentile(latencies, 0.95):.1f}s, "
          f"last minute p95 {percentile(minute, 0.95) if minute else 0:.1f}s; backlog at the end {backlog} "
          f"(commits of the last {every_s:.0f}s: {allowed}; per period {backlogs}); {runs_done} runs ended while "
          f"committing, "
          f"{sum(cpu.values()) / runs:.2f} CPU-s per run "
          f"({', '.join(f'{k} {v / runs:.2f}' for k, v in sorted(cpu.items()) if v >= 0.05)}), "
          f"{sum(cpu.values()) / (end - begin):.2f} cores busy ({load()})", flush=True)
    if unapplied:
        print(f"[{label}] {len(unapplied)} commits still not applied {drain_s:.0f}s after the last commit: the "
              f"latencies are lower bounds", flush=True)
    return {"p50": statistics.median(latencies), "p95": percentile(latencies, 0.95), "backlog_end": backlog,
            "unapplied_after_drain": len(unapplied),
            "backlog_allowed": allowed, "commits": len(commits), "batch_cpu_s": sum(cpu.values()) / runs,
            "backlog_by_period": backlogs,
            "runs_done": runs_done,
            "medians": medians,
            "last_minute_p95": percentile(minute, 0.95) if minute else None}


def pending_commits(instance, commits: list[tuple[str, str, float]], stamps: dict[str, float],  # noqa: ANN001
                    sink_keys: dict) -> int:
    """Commits not applied yet (``stamps`` gains those applied since the last look, with their time)."""
    for name, key, _ in commits:
        if key not in stamps and (stamp := applied_at(instance, key, sink_keys[name])) is not None:
            stamps[key] = stamp
    return sum(1 for _, key, _ in commits if key not in stamps)


def sustained_scenario(args: argparse.Namespace) -> None:
    """``--sustained N``: the sustained scenario on each instance kind of ``--instance``; its own RESULT line."""
    kinds = {"sqlite": ("sqlite",), "postgres": ("postgres",), "both": ("sqlite", "postgres")}[args.instance]
    start_load = load()
    keys: dict[str, str] = {}
    for kind in kinds:
        prefix = "" if len(kinds) == 1 else f"{KIND_PREFIX[kind]}_"
        with instance_storage(kind, args.pg_server) as storage:
            m = run_sustained(args.sustained, args.sustained_minutes, args.commit_every, args.workers, args.interval,
                              args.sqlite_synchronous, storage, args.snapshot_sensors, label=f"sustained {kind}",
                              drain_s=args.drain_s)
        n = args.sustained
        keys |= {f"{prefix}tables_{n}_p50_s": f"{m['p50']:.2f}", f"{prefix}tables_{n}_p95_s": f"{m['p95']:.2f}",
                 f"{prefix}backlog_end": str(m["backlog_end"]), f"{prefix}backlog_allowed": str(m["backlog_allowed"]),
                 f"{prefix}backlog_by_period": ",".join(map(str, m["backlog_by_period"])),
                 f"{prefix}sustained_commits": str(m["commits"]), f"{prefix}runs_while_committing": str(m["runs_done"]),
                 f"{prefix}unapplied_after_drain": str(m["unapplied_after_drain"]),
                 f"{prefix}batch_cpu_s": f"{m['batch_cpu_s']:.2f}",
                 f"{prefix}spark_jobs_per_run": f"{m['medians'].get('spark_jobs', 0):.0f}",
                 f"{prefix}run_steps": f"{m['medians'].get('steps', 0):.0f}"} | step_keys(m["medians"], prefix)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in keys.items()) + f" minutes={args.sustained_minutes} "
          f"commit_every_s={args.commit_every} workers={args.workers} queue_extra={args.queue_extra} "
          f"lane_process={int(args.lane_process)} "
          f"interval_s={args.interval} "
          f"snapshot_sensors={args.snapshot_sensors} load1_start={start_load.split()[2]} "
          f"load1_end={load().split()[2]}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def process_cpu(session: int, server: bool = False) -> dict[str, float]:
    """CPU seconds (user + system) of every process of ``dagster dev``'s session by kind, each with its children
    that have ended (a run's compute-log ``tail`` and watcher processes); ``server``: also the PostgreSQL
    server's processes (the instance's work on a PostgreSQL instance; the postmaster's ended children are its
    backends, one per connection where Dagster opens one per call)."""
    tick = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        postgres = stat[stat.index("(") + 1:stat.rindex(")")] == "postgres"
        if int(fields[3]) != session and not (server and postgres):  # field 6 of stat: the session id
            continue
        kind = ("postgres server" if postgres else
                "jvm" if "java" in cmdline.split(" ", 1)[0] else
                "lane process" if "launcher.lane_process" in cmdline else  # the lanes (lane_process: true)
                "daemon" if "dagster._daemon" in cmdline else  # sensors' bookkeeping, run queue, the lanes
                "webserver" if "dagster_webserver" in cmdline else
                "code server" if " api grpc" in cmdline else  # evaluates the sensors
                "other")
        used = sum(int(f) for f in fields[11:15])  # utime, stime, and those of its children that ended
        totals[kind] = totals.get(kind, 0.0) + used / tick
    return totals


def idle_lane_seconds(spans: list[tuple[float, float, float]], workers: int) -> float:
    """Lane-seconds no run executed while a created run waited to start (dequeue and launch latency)."""
    times = sorted({t for span in spans for t in span})
    idle = 0.0
    for a, b in zip(times, times[1:], strict=False):
        mid = (a + b) / 2
        running = sum(1 for _, started, ended in spans if started <= mid < ended)
        waiting = sum(1 for created, started, _ in spans if created <= mid < started)
        idle += min(max(workers - running, 0), waiting) * (b - a)
    return idle


def breakdown(instance, commits: dict[str, float], profile: Path, workers: int,  # noqa: ANN001
              label: str = "many") -> dict[str, float]:
    """Medians over the rounds' runs: sensor (commit -> run created), queue (created -> started), run
    (started -> ended), each step, framework (run minus steps); the launcher's profile per run."""
    import json

    from dagster import DagsterEventType, DagsterRunStatus, RunsFilter

    profiled = {}
    deadline = time.time() + 60 * TIMEOUTS["scale"]
    # A run is materialised before it ends, and profiled when it has ended: wait until none is in flight
    # (a key may have been applied by a run of several snapshots, which has no run of its own to wait for).
    in_flight = RunsFilter(statuses=[DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED,
                                     DagsterRunStatus.STARTING, DagsterRunStatus.STARTED])
    while instance.get_runs_count(in_flight) and time.time() < deadline:
        time.sleep(0.5)
    grace = time.time() + 5  # the last run's profile line is written just after its final status
    while True:
        if profile.exists():
            for line in profile.read_text().splitlines():
                record = json.loads(line)
                profiled[record["run_id"]] = record
        if len(profiled) >= len(commits) or time.time() > min(deadline, grace):
            break
        time.sleep(0.5)
    parts: dict[str, list[float]] = {}
    spans: list[tuple[float, float, float]] = []  # created, started, ended
    for key, committed in commits.items():
        records = instance.get_run_records(RunsFilter(tags={"dagster/partition": key}), limit=1)
        if not records or records[0].start_time is None or records[0].end_time is None:
            continue
        record = records[0]
        created = record.create_timestamp.timestamp()
        values = {"sensor": created - committed, "queue": record.start_time - created,
                  "run": record.end_time - record.start_time}
        spans.append((created, record.start_time, record.end_time))
        starts: dict[str, float] = {}
        steps, count = 0.0, 0
        windows: list[tuple[str, float, float]] = []
        for event in instance.all_logs(record.dagster_run.run_id, of_type={
                DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS}):
            step = event.step_key or ""
            if event.dagster_event_type == DagsterEventType.STEP_START:
                starts[step] = event.timestamp
            elif step in starts:
                kind = re.sub(r"events_\d+", "*", step)  # the same step of every table together
                values[f"step {kind}"] = values.get(f"step {kind}", 0.0) + event.timestamp - starts[step]
                steps += event.timestamp - starts[step]
                count += 1
                windows.append((re.sub(r"[^a-z_]", "", kind.split("__")[0]), starts[step], event.timestamp))
        owned = []
        for job in profiled.get(record.dagster_run.run_id, {}).get("jobs", []):
            at = job[2] if len(job) > 2 else None
            owner = next((name for name, begin, end in windows if at is not None and begin <= at <= end), "other")
            values[f"jobs in {owner}"] = values.get(f"jobs in {owner}", 0) + 1
            owned.append((owner, job[0], job[1]))
        for site, seconds in job_split(owned).items():
            values[f"job {site}"] = seconds
        values["framework"] = values["run"] - steps
        values["steps"] = count
        extra = profiled.get(record.dagster_run.run_id, {})
        for name in ("thread_cpu_s", "spark_jobs"):
            if name in extra:
                values[name] = extra[name]
        for name, value in values.items():
            parts.setdefault(name, []).append(value)
    print(f"[{label}] lanes idle while runs waited: {idle_lane_seconds(spans, workers):.1f} lane-s over "
          f"{len(spans)} runs", flush=True)
    # A job site absent from a run counts 0 there: the median is over every run.
    medians = {name: statistics.median(v + [0.0] * (len(spans) - len(v)) if name.startswith("job") else v)
               for name, v in parts.items()}
    print(f"[{label}] medians per run: " + ", ".join(f"{name} {v:.2f}" for name, v in medians.items()
                                                      if not name.startswith("job ")), flush=True)
    jobs = {name[4:]: v for name, v in medians.items() if name.startswith("job ")}
    print(f"[{label}] Spark jobs per run by step and kind (median wall s of those jobs): "
          + (", ".join(f"{site} {v:.2f}" for site, v in sorted(jobs.items(), key=lambda kv: -kv[1])) or "none"),
          flush=True)
    return medians


# Spark's own names of the jobs a step's statements make (a Python action's call site is not kept: lanes
# running at once overwrite each other's, so it is named by its step only).
JOB_KINDS = {"overwrite": "write", "append": "write", "sql": "merge", "$anonfun$withThreadLocalCaptured$1": "subquery"}


def job_split(jobs: list[tuple[str, str, float | None]]) -> dict[str, float]:
    """A run's Spark jobs (step, Spark's name, wall s) summed per step and kind (``replica/merge x1``: the
    step, what the job did, how many of them); a kind Spark does not name is a Python action (an aggregate
    the driver reads: ``action``)."""
    seconds: dict[str, float] = {}
    counts: dict[str, int] = {}
    for step, name, wall in jobs:
        site = f"{step}/{JOB_KINDS.get(name, 'action')}"
        seconds[site] = seconds.get(site, 0.0) + (wall or 0.0)
        counts[site] = counts.get(site, 0) + 1
    return {f"{site} x{counts[site]}": value for site, value in seconds.items()}


def step_keys(medians: dict[str, float], prefix: str = "") -> dict[str, str]:
    """RESULT keys of the per-step medians (``step_changelog_s``, ``step_replica_s``, ...) and the per-job split
    (``spark_job_split``: ``site xN:seconds`` joined by commas)."""
    keys = {}
    for name, value in medians.items():
        if name.startswith("step "):
            short = re.sub(r"[^a-z_]", "", name[5:].split("__")[0]) or "step"
            keys[f"{prefix}step_{short}_s"] = f"{value:.2f}"
        elif name.startswith("jobs in "):
            keys[f"{prefix}spark_jobs_{name[8:]}"] = f"{value:.0f}"
    jobs = [f"{name[4:].replace(' ', '')}:{value:.2f}" for name, value in medians.items() if name.startswith("job ")]
    if jobs:
        keys[f"{prefix}spark_job_split"] = ",".join(jobs)
    return keys


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def many_tables_keys(kind: str, count: int, first: bool, args: argparse.Namespace,
                     figures: dict[str, dict[str, float]]) -> dict[str, str]:
    """The many-tables scenario at ``count`` tables on one instance kind: its RESULT keys (the first count's
    under the plain names, every other count's as ``<kind>_tables_<count>_...``)."""
    prefix = KIND_PREFIX[kind]
    print(f"[{prefix}] {count} tables: start {load()}", flush=True)
    with instance_storage(kind, args.pg_server) as storage:
        m = run_many_tables(count, args.rounds, args.workers, args.interval, args.sqlite_synchronous,
                            args.warm_rounds, storage)
    print(f"[{prefix}] {count} tables x {args.rounds} rounds after {args.warm_rounds} warm-up rounds, "
          f"{args.workers} lanes: p50 {m['p50']:.1f}s p95 {m['p95']:.1f}s (end: {load()})", flush=True)
    if not first:
        return {f"{prefix}_tables_{count}_p95_s": f"{m['p95']:.2f}",
                f"{prefix}_tables_{count}_batch_cpu_s": f"{m['batch_cpu_s']:.2f}",
                f"{prefix}_tables_{count}_idle_loop_cpu_s": f"{m['idle_loop_cpu_s']:.3f}"}
    figures.setdefault(kind, {})["multi_p95"] = m["p95"]
    keys = {f"{prefix}_multi_p50_s": f"{m['p50']:.2f}", f"{prefix}_multi_p95_s": f"{m['p95']:.2f}",
            f"{prefix}_batch_cpu_s": f"{m['batch_cpu_s']:.2f}",
            f"{prefix}_spark_jobs_per_run": f"{m['spark_jobs']:.0f}", f"{prefix}_run_steps": f"{m['steps']:.0f}",
            f"{prefix}_idle_loop_cpu_s": f"{m['idle_loop_cpu_s']:.3f}"}
    keys |= step_keys(m["medians"], f"{prefix}_")
    if m["cold_p95"] is not None:
        keys[f"{prefix}_multi_cold_p95_s"] = f"{m['cold_p95']:.2f}"
    return keys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--interval", type=int, default=5)
    parser.add_argument("--modes", default="warm,default")
    parser.add_argument("--tables", default="20",
                        help="tables of the many-tables scenario, a comma list for several counts (0: skip)")
    parser.add_argument("--sensors", choices=("shipped", "per-table", "one", "both"), default="shipped",
                        help="many tables: the shipped layout (auto), a sensor per table, one for all, or both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm-rounds", type=int, default=4,
                        help="many-tables rounds before the measured ones (JIT warm-up of a fresh daemon)")
    parser.add_argument("--workers", type=int, default=3, help="warm launcher lanes in the many-tables scenario")
    parser.add_argument("--queue-extra", type=int, default=1,
                        help="run_queue.max_concurrent_runs = lanes + this: runs handed to the warm launcher ahead "
                             "of a free lane (a lane then starts its next run without waiting for the dequeue)")
    parser.add_argument("--sqlite-synchronous", default="OFF",
                        help="the warm launcher's sqlite_synchronous ('': SQLite's default; SQLite instances only)")
    parser.add_argument("--instance", choices=("sqlite", "postgres", "both"), default="sqlite",
                        help="the Dagster instance's storage; both: measure both kinds in this run")
    parser.add_argument("--pg-server", default=PG_SERVER, help="PostgreSQL server for --instance postgres|both")
    parser.add_argument("--timeouts-x", type=float, default=1.0,
                        help="multiply every wait's timeout (exports, batches) on a heavily loaded machine")
    parser.add_argument("--sustained", type=int, default=0, metavar="N",
                        help="the sustained scenario alone: N tables, each committing every --commit-every seconds, "
                             "staggered, for --sustained-minutes")
    parser.add_argument("--sustained-minutes", type=float, default=10.0)
    parser.add_argument("--commit-every", type=float, default=60.0)
    parser.add_argument("--drain-s", type=float, default=600.0,
                        help="sustained: how long to wait for the backlog after the last commit")
    parser.add_argument("--snapshot-sensors", choices=("auto", "per_table", "one"), default="auto",
                        help="the sustained scenario's sensor layout")
    parser.add_argument("--lane-process", action="store_true",
                        help="the warm launcher's lanes in a process of their own (lane_process: true)")
    args = parser.parse_args()
    args.table_counts = [int(n) for n in args.tables.split(",") if int(n)]
    TIMEOUTS["scale"] = args.timeouts_x
    QUEUE["extra"] = args.queue_extra
    LANES["process"] = args.lane_process
    # SIGTERM (timeout, a supervisor) unwinds like an exception: `dagster dev` is stopped and a scenario's
    # PostgreSQL database dropped by their `finally`, not left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.sustained:
        sustained_scenario(args)
    elif args.instance == "sqlite":
        single_kind(args)
    else:
        instance_kinds(args, ("sqlite", "postgres") if args.instance == "both" else ("postgres",))


def single_kind(args: argparse.Namespace) -> None:
    """One instance on SQLite: every launch mode, then the many-tables scenario (the original RESULT keys)."""
    results = {}
    for mode in [m for m in args.modes.split(",") if m] if args.commits else ():  # 0: many tables alone
        print(f"[{mode}] start: {load()} ({os.cpu_count()} cores)", flush=True)
        results[mode] = run_mode(mode, args.commits, args.interval, args.sqlite_synchronous)
        r = results[mode]
        print(f"{mode}: p50 {r['p50']:.1f}s p95 {r['p95']:.1f}s empty batch {r['empty']:.1f}s "
              f"(sensor interval {args.interval}s, {args.commits} commits; end: {load()})", flush=True)
    many = many_tables_scenarios(args) if args.table_counts else ""
    if not results:
        print(f"RESULT{many} interval_s={args.interval}")
        return
    main_mode = "warm" if "warm" in results else args.modes.split(",")[0]
    first = results[main_mode]
    extra = many
    if "default" in results and main_mode != "default":
        d = results["default"]
        print(f"default / {main_mode}: p50 x{d['p50'] / first['p50']:.1f}, p95 x{d['p95'] / first['p95']:.1f}, "
              f"empty batch x{d['empty'] / first['empty']:.1f}", flush=True)
        extra = (f" default_p50_s={d['p50']:.2f} default_p95_s={d['p95']:.2f}"
                 f" default_empty_batch_s={d['empty']:.2f} p50_ratio={d['p50'] / first['p50']:.2f}")
    print(f"RESULT p50_s={first['p50']:.2f} p95_s={first['p95']:.2f} empty_batch_s={first['empty']:.2f}"
          f" interval_s={args.interval} mode={main_mode}{extra}")


# A layout: the pipeline file's ``snapshot_sensors``.
LAYOUTS = {"shipped": "auto", "one_sensor": "one", "per_table_sensors": "per_table"}


def layouts(sensors: str, tables: int) -> list[tuple[str, str]]:
    """The layouts to measure at ``tables``: the shipped one (``snapshot_sensors: auto``) unless one layout
    alone was asked, and the one ``both`` adds (the sensor layout that ``auto`` does not pick at this count)."""
    from icecdc_dagster.config.model import ONE_SENSOR_FROM_TABLES

    auto = "one" if tables >= ONE_SENSOR_FROM_TABLES else "per-table"
    alone = sensors in ("per-table", "one") and sensors != auto
    chosen = [] if alone else ["shipped"]
    other = "per-table" if auto == "one" else "one"
    if sensors == other or sensors == "both":
        chosen.append("per_table_sensors" if other == "per-table" else "one_sensor")
    return [(name, LAYOUTS[name]) for name in chosen]


def many_tables_scenarios(args: argparse.Namespace) -> str:
    """Every table count of ``--tables`` x every layout (interleaved: a count's layouts run back to back),
    on SQLite. RESULT keys: the first count's shipped layout keeps the original names
    (``multi_table_p95_s``); other counts are prefixed ``t<N>_``, other layouts ``<layout>_``."""
    counts = args.table_counts
    keys: dict[str, str] = {}
    for count in counts:
        shipped: dict | None = None
        for name, snapshot_sensors in layouts(args.sensors, count):
            label = f"{name} x{count}"
            print(f"[{label}] start: {load()}", flush=True)
            m = run_many_tables(count, args.rounds, args.workers, args.interval, args.sqlite_synchronous,
                                args.warm_rounds, label=label, snapshot_sensors=snapshot_sensors)
            print(f"[{label}] {count} tables x {args.rounds} rounds after {args.warm_rounds} warm-up rounds, "
                  f"{args.workers} lanes: p50 {m['p50']:.1f}s p95 {m['p95']:.1f}s, idle {m['idle_loop_cpu_s']:.2f} "
                  f"CPU-s per sensor loop, {m['batch_cpu_s']:.2f} CPU-s per batch ({m['steps']:.0f} steps, "
                  f"{m['spark_jobs']:.0f} Spark jobs) (end: {load()})", flush=True)
            prefix = ("" if name == "shipped" else f"{name}_") + ("" if count == counts[0] else f"t{count}_")
            keys |= {f"{prefix}multi_table_p50_s": f"{m['p50']:.2f}", f"{prefix}multi_table_p95_s": f"{m['p95']:.2f}",
                     f"{prefix}idle_loop_cpu_s": f"{m['idle_loop_cpu_s']:.3f}",
                     f"{prefix}batch_cpu_s": f"{m['batch_cpu_s']:.2f}", f"{prefix}run_steps": f"{m['steps']:.0f}",
                     f"{prefix}spark_jobs_per_run": f"{m['spark_jobs']:.0f}"}
            keys |= {f"{prefix}tables_{count}_p95_s": f"{m['p95']:.2f}"} | step_keys(m["medians"], prefix)
            keys |= {f"{prefix}batch_cpu_{proc.replace(' ', '_')}_s": f"{v:.2f}"
                     for proc, v in sorted(m["batch_cpu"].items()) if v >= 0.005}
            if m["cold_p95"] is not None:
                keys[f"{prefix}multi_table_cold_p95_s"] = f"{m['cold_p95']:.2f}"
            if name == "shipped":
                shipped = m
            elif shipped is not None:  # the other layout against the shipped one, same count, same run
                keys[f"{prefix}p95_ratio"] = f"{m['p95'] / shipped['p95']:.2f}"
                keys[f"{prefix}idle_ratio"] = f"{m['idle_loop_cpu_s'] / max(shipped['idle_loop_cpu_s'], 1e-9):.2f}"
                keys[f"{prefix}batch_cpu_ratio"] = f"{m['batch_cpu_s'] / shipped['batch_cpu_s']:.2f}"
    return (" " + " ".join(f"{k}={v}" for k, v in keys.items()) + f" tables={args.tables}"
            f" workers={args.workers} queue_extra={args.queue_extra} lane_process={int(args.lane_process)}"
            f" warm_rounds={args.warm_rounds} sqlite_synchronous={args.sqlite_synchronous or 'default'}")


KIND_PREFIX = {"sqlite": "sqlite", "postgres": "pg"}


def instance_kinds(args: argparse.Namespace, kinds: tuple[str, ...]) -> None:
    """Each instance kind on its own fresh instance, interleaved: the one-table scenario (first launch mode
    of ``--modes``) of every kind, then the many-tables scenario of every kind. Load at start and end."""
    mode = [m for m in args.modes.split(",") if m][0]
    start_load = load()
    print(f"[instances] start: {start_load} ({os.cpu_count()} cores), kinds {', '.join(kinds)}, mode {mode}",
          flush=True)
    keys: dict[str, str] = {}
    figures: dict[str, dict] = {}
    for kind in kinds if args.commits else ():  # --commits 0: the many-tables scenario alone
        prefix = KIND_PREFIX[kind]
        print(f"[{prefix}] one table, {mode} launcher: start {load()}", flush=True)
        with instance_storage(kind, args.pg_server) as storage:
            r = run_mode(mode, args.commits, args.interval, args.sqlite_synchronous, storage)
        figures[kind] = r
        print(f"[{prefix}] one table: p50 {r['p50']:.1f}s p95 {r['p95']:.1f}s empty batch {r['empty']:.1f}s "
              f"(end: {load()})", flush=True)
        keys.update({f"{prefix}_p50_s": f"{r['p50']:.2f}", f"{prefix}_p95_s": f"{r['p95']:.2f}",
                     f"{prefix}_empty_batch_s": f"{r['empty']:.2f}"})
    for kind in kinds if args.table_counts else ():
        for count in args.table_counts:
            keys |= many_tables_keys(kind, count, count == args.table_counts[0], args, figures)
    if len(kinds) == 2:
        sqlite, pg = figures["sqlite"], figures["postgres"]
        if "p50" in pg:
            keys["pg_ratio"] = f"{pg['p50'] / sqlite['p50']:.2f}"
        if "multi_p95" in pg:
            keys["pg_multi_ratio"] = f"{pg['multi_p95'] / sqlite['multi_p95']:.2f}"
    end_load = load()
    print(f"[instances] load at start: {start_load}; at end: {end_load}", flush=True)
    extra = (f" tables={args.table_counts[0]} workers={args.workers} queue_extra={args.queue_extra}"
             f" warm_rounds={args.warm_rounds}"
             if args.table_counts else "")
    print("RESULT " + " ".join(f"{k}={v}" for k, v in keys.items()) + f" interval_s={args.interval} mode={mode}"
          f"{extra} load1_start={start_load.split()[2]} load1_end={end_load.split()[2]}")


if __name__ == "__main__":
    main()
