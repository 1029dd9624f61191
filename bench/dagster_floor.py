"""Dagster's own floor under the sustained scenario: the same daemon, run queue, warm launcher and instance as
``bench/freshness.py --sustained N``, the same number of runs a minute, but runs that do nothing of ours.

``bench/freshness.py --sustained 100`` asks two cores for 100 batches a minute. What part of a batch's CPU is
Dagster's alone - the sensor's tick, the run's creation, the queue, the launch, the run's events and its
storage - depends on the instance kind (SQLite: a database file per run and an engine per call; PostgreSQL:
kept connections) and on the load, so it is measured here in the same shape, not estimated from one run in
one process: ``bench/dagster_floor_defs.py`` holds N lines of our run's shape (a changelog asset with two
checks, a replica with one, one dynamic partition per commit, a job per table limited to one run at a time, a
sensor per ten tables) whose steps only log, emit metadata and pass their checks. Each table "commits" once
every ``--every`` seconds, staggered as in the sustained scenario; each commit is one partition and one run.

Printed per instance kind: commit -> replica materialised (p50, p95), the backlog at the end of each period and
at the end, runs that ended while committing, CPU-s per run by process (``dagster dev``'s processes; on
PostgreSQL also the server's) and the cores they kept busy. With the same run's figures of
``bench/batch_profile.py`` (the batch by hand in the JVM), this is the floor of a batch on this machine:
Dagster's run here + the JVM's work by hand, per run; 100 runs a minute need that x 100 / 60 cores.

Run: .venv/bin/python bench/dagster_floor.py [--tables 100 --minutes 10 --every 60] [--instance sqlite|postgres|both]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from dagster_floor_defs import commit_at, partition_key  # noqa: E402
from freshness import (  # noqa: E402
    IDLE_MEASURE_S,
    KIND_PREFIX,
    LANES,
    SENSOR_LOOP_S,
    instance_storage,
    load,
    percentile,
    process_cpu,
    stop_dagster,
    write_home,
)

DEFS = Path(__file__).parent / "dagster_floor_defs.py"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=60.0, help="seconds between a table's commits")
    parser.add_argument("--interval", type=int, default=5, help="the sensors' minimum interval")
    parser.add_argument("--workers", type=int, default=3, help="warm launcher lanes")
    parser.add_argument("--lead-s", type=float, default=120.0,
                        help="seconds before t0: dagster dev starts, then its last minute is measured at rest")
    parser.add_argument("--drain-s", type=float, default=300.0)
    parser.add_argument("--instance", choices=("sqlite", "postgres", "both"), default="sqlite")
    parser.add_argument("--lane-process", action="store_true",
                        help="the warm launcher's lanes in a process of their own (lane_process: true)")
    return parser.parse_args()


def start(root: Path, home: Path, env_extra: dict[str, str]) -> tuple[subprocess.Popen, object]:
    """``dagster dev`` on the floor's code location (the storage created first, as ``bench/freshness.py``)."""
    from dagster import DagsterInstance

    os.environ["DAGSTER_HOME"] = str(home)
    instance = DagsterInstance.get()
    env = {**os.environ, **env_extra, "DAGSTER_HOME": str(home)}
    dagster = Path(sys.executable).parent / "dagster"
    log = (root / "dagster.log").open("w")
    process = subprocess.Popen([str(dagster), "dev", "-f", str(DEFS), "-p", "0"], env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
    return process, instance


class Applied:
    """Each replica's materialisations since the last look, by partition (one query per table)."""

    def __init__(self, instance: object, tables: int) -> None:
        from dagster import AssetKey

        self.instance = instance
        self.keys = [AssetKey(["replica", "replica", f"replica_events_{i:03d}"]) for i in range(tables)]
        self.after = [0] * tables
        self.stamps: dict[str, float] = {}  # "<table>/<partition>" -> materialised at

    def poll(self) -> None:
        from dagster import AssetRecordsFilter

        for i, key in enumerate(self.keys):
            records = self.instance.fetch_materializations(  # type: ignore[attr-defined]
                AssetRecordsFilter(asset_key=key, after_storage_id=self.after[i] or None), limit=1000,
                ascending=True).records
            for record in records:
                self.stamps[f"{i}/{record.partition_key}"] = record.timestamp
                self.after[i] = max(self.after[i], record.storage_id)


def commits(tables: int, t0: float, every: float, periods: int) -> list[tuple[str, float]]:
    """Every scheduled commit as ("<table>/<partition key>", commit time), as the code location names them."""
    due = [(i, k, commit_at(i, k, t0, every, tables)) for i in range(tables) for k in range(periods)]
    return sorted(((f"{i}/{partition_key(k, at)}", int(at * 1000) / 1000) for i, k, at in due), key=lambda c: c[1])


def scenario(kind: str, args: argparse.Namespace) -> dict:
    """One instance kind: the floor's sustained run, its figures."""
    from dagster import DagsterRunStatus, RunsFilter

    periods = max(1, round(args.minutes * 60 / args.every))
    root = Path(tempfile.mkdtemp(prefix="icecdc-dagster-floor-"))
    with instance_storage(kind) as storage:
        home = root / "dagster_home"
        write_home(home, "warm", args.workers, "OFF" if storage is None else "", storage)
        t0 = float(f"{time.time() + args.lead_s:.3f}")  # as the code location reads it back
        env = {"FLOOR_TABLES": str(args.tables), "FLOOR_T0": f"{t0:.3f}", "FLOOR_EVERY_S": str(args.every),
               "FLOOR_PERIODS": str(periods), "FLOOR_INTERVAL_S": str(args.interval)}
        process, instance = start(root, home, env)
        server = storage is not None
        try:
            idle_from = t0 - IDLE_MEASURE_S
            time.sleep(max(0.0, idle_from - time.time()))  # the sensors tick with nothing due: the loop at rest
            idle_before, idle_begin = process_cpu(process.pid, server), time.time()
            time.sleep(max(0.0, t0 - time.time()))
            idle_cores = sum(process_cpu(process.pid, server).values()) - sum(idle_before.values())
            idle_cores /= max(time.time() - idle_begin, 1e-9)
            scheduled = commits(args.tables, t0, args.every, periods)
            applied = Applied(instance, args.tables)
            cpu_before, begin = process_cpu(process.pid, server), time.time()
            end = scheduled[-1][1]
            backlogs: list[int] = []
            next_period = t0 + args.every
            while time.time() < end:
                time.sleep(min(3.0, max(0.0, end - time.time())))
                applied.poll()
                if time.time() >= next_period:
                    now = time.time()
                    backlogs.append(sum(1 for c, at in scheduled if at <= now and c not in applied.stamps))
                    print(f"[{kind}] {now - begin:.0f}s: {sum(1 for _, at in scheduled if at <= now)} commits, "
                          f"{backlogs[-1]} not applied ({load()})", flush=True)
                    next_period += args.every
            end = time.time()
            cpu_after = process_cpu(process.pid, server)
            runs_done = instance.get_runs_count(RunsFilter(  # type: ignore[attr-defined]
                statuses=[DagsterRunStatus.SUCCESS], updated_after=datetime.fromtimestamp(begin, UTC),
                updated_before=datetime.fromtimestamp(end, UTC)))
            drain_end = time.time() + args.drain_s
            while any(c not in applied.stamps for c, _ in scheduled) and time.time() < drain_end:
                time.sleep(2.0)
                applied.poll()
            unapplied = [c for c, _ in scheduled if c not in applied.stamps]
        finally:
            stop_dagster(process)
            instance.dispose()  # type: ignore[attr-defined]
    now = time.time()
    latencies = [applied.stamps.get(c, now) - at for c, at in scheduled]
    cpu = {name: cpu_after.get(name, 0.0) - cpu_before.get(name, 0.0) for name in cpu_after}
    runs = max(runs_done, 1)
    figures = {"p50": statistics.median(latencies), "p95": percentile(latencies, 0.95),
               "backlog_end": sum(1 for c, _ in scheduled if applied.stamps.get(c, now) > end),
               "backlog_allowed": sum(1 for _, at in scheduled if at > end - args.every),
               "runs": runs_done, "unapplied": len(unapplied), "cpu_per_run": sum(cpu.values()) / runs,
               "cores": sum(cpu.values()) / (end - begin), "by_process": {k: v / runs for k, v in cpu.items()},
               "backlogs": backlogs, "idle_loop_cpu_s": idle_cores * SENSOR_LOOP_S}
    print(f"[{kind}] {len(scheduled)} commits over {end - begin:.0f}s: p50 {figures['p50']:.1f}s p95 "
          f"{figures['p95']:.1f}s, backlog at the end {figures['backlog_end']} (allowed {figures['backlog_allowed']};"
          f" per period {backlogs}), {runs_done} runs ended while committing, {figures['cpu_per_run']:.3f} CPU-s per "
          f"run ({', '.join(f'{k} {v:.3f}' for k, v in sorted(figures['by_process'].items()) if v >= 0.001)}), "
          f"{figures['cores']:.2f} cores busy, {len(unapplied)} not applied after the drain; "
          f"at rest before t0 {figures['idle_loop_cpu_s']:.3f} CPU-s per sensor loop", flush=True)
    return figures


def main() -> None:
    args = parse_args()
    LANES["process"] = args.lane_process
    kinds = {"sqlite": ("sqlite",), "postgres": ("postgres",), "both": ("sqlite", "postgres")}[args.instance]
    keys: dict[str, str] = {}
    for kind in kinds:
        m = scenario(kind, args)
        prefix = KIND_PREFIX[kind]
        keys |= {f"{prefix}_floor_p50_s": f"{m['p50']:.2f}", f"{prefix}_floor_p95_s": f"{m['p95']:.2f}",
                 f"{prefix}_floor_backlog_end": str(m["backlog_end"]),
                 f"{prefix}_floor_backlog_allowed": str(m["backlog_allowed"]),
                 f"{prefix}_floor_runs": str(m["runs"]), f"{prefix}_floor_cpu_per_run_s": f"{m['cpu_per_run']:.3f}",
                 f"{prefix}_floor_cores_busy": f"{m['cores']:.2f}",
                 f"{prefix}_floor_idle_loop_cpu_s": f"{m['idle_loop_cpu_s']:.3f}"}
        keys |= {f"{prefix}_floor_cpu_{name.replace(' ', '_')}_s": f"{v:.3f}"
                 for name, v in sorted(m["by_process"].items()) if v >= 0.001}
    keys |= {"tables": str(args.tables), "minutes": f"{args.minutes:.1f}", "every_s": f"{args.every:.0f}",
             "workers": str(args.workers), "lane_process": str(int(args.lane_process)),
             "load1_end": f"{os.getloadavg()[0]:.2f}"}
    print("RESULT " + " ".join(f"{k}={v}" for k, v in keys.items()))


if __name__ == "__main__":
    main()
