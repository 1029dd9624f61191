"""The code location of ``bench/dagster_floor.py``: Dagster's machinery alone, in our run's shape, no icecdc code.

Per table a line like ours: a changelog asset with two checks evaluated in its step, a replica asset after it
with one check, both partitioned by one dynamic partitions definition per table; one job per table tagged as
ours (the run queue's one-run-per-table limit applies); a sensor per ten tables (``snapshot_sensors: auto``
above ten tables). The "commits" are a schedule, not tables: table ``i`` commits at ``t0 + i * every / N +
k * every`` for ``k`` in ``range(periods)``; a tick adds every due commit as a partition (``<k>-<commit ms>``)
and requests its run. The assets do nothing but what our steps tell Dagster: a log line, metadata, the
checks' results. Read from the environment (``bench/dagster_floor.py`` sets it): ``FLOOR_TABLES``,
``FLOOR_T0``, ``FLOOR_EVERY_S``, ``FLOOR_PERIODS``, ``FLOOR_INTERVAL_S``.
"""

import json
import os
import time

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    DefaultSensorStatus,
    Definitions,
    DynamicPartitionsDefinition,
    MaterializeResult,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    asset,
    define_asset_job,
    in_process_executor,
    sensor,
)

TABLES = int(os.environ.get("FLOOR_TABLES", "10"))
T0 = float(os.environ.get("FLOOR_T0", "0"))
EVERY_S = float(os.environ.get("FLOOR_EVERY_S", "60"))
PERIODS = int(os.environ.get("FLOOR_PERIODS", "10"))
INTERVAL_S = int(os.environ.get("FLOOR_INTERVAL_S", "5"))
PER_SENSOR = 10
TABLE_TAG = "icecdc/table"  # the tag the freshness bench's run queue limits to one run per value


def table_name(i: int) -> str:
    return f"events_{i:03d}"


def replica_key(i: int) -> AssetKey:
    return AssetKey(["replica", "replica", f"replica_{table_name(i)}"])


def commit_at(i: int, k: int, t0: float = T0, every_s: float = EVERY_S, tables: int = TABLES) -> float:
    """When table ``i``'s ``k``-th commit is due (epoch seconds); the bench computes its schedule with it too."""
    return t0 + i * every_s / tables + k * every_s


def partition_key(k: int, at: float) -> str:
    """The partition of a table's ``k``-th commit, due at ``at``: the commit time travels in the key."""
    return f"{k}-{int(at * 1000)}"


def _line(i: int):  # noqa: ANN202 - (assets, job)
    partitions = DynamicPartitionsDefinition(name=f"snapshots_{table_name(i)}")
    changelog_key = AssetKey(["changelog", "db", f"{table_name(i)}_changelog"])

    @asset(key=changelog_key, partitions_def=partitions,
           check_specs=[AssetCheckSpec("no_duplicate_keys", asset=changelog_key),
                        AssetCheckSpec("line_continues", asset=changelog_key)])
    def changelog(context: AssetExecutionContext) -> MaterializeResult:
        context.log.info(f"db.{table_name(i)}: stored 10 change rows of snapshot {context.partition_key} (cdc)")
        return MaterializeResult(
            metadata={"snapshot_ids": context.partition_key, "rows": 10, "inserted": 10, "updated": 0,
                      "deleted": 0, "line": "floor", "ordinal": 1},
            check_results=[AssetCheckResult(check_name="no_duplicate_keys", passed=True, metadata={"keys": 10}),
                           AssetCheckResult(check_name="line_continues", passed=True)])

    @asset(key=replica_key(i), partitions_def=partitions, deps=[changelog],
           check_specs=[AssetCheckSpec("rows_agree", asset=replica_key(i))])
    def replica(context: AssetExecutionContext) -> MaterializeResult:
        context.log.info(f"replica.{table_name(i)}: applied snapshot {context.partition_key}")
        return MaterializeResult(
            metadata={"snapshot_ids": context.partition_key, "inserted": 10, "updated": 0, "deleted": 0,
                      "line": "floor"},
            check_results=[AssetCheckResult(check_name="rows_agree", passed=True, metadata={"rows": 10})])

    job = define_asset_job(f"line__{table_name(i)}", selection=[changelog, replica], partitions_def=partitions,
                           tags={TABLE_TAG: table_name(i)},
                           executor_def=in_process_executor)  # as our line executor: steps in the run's thread
    return [changelog, replica], job, partitions


def _sensor(first: int, lines: dict[int, tuple]):  # noqa: ANN202
    tables = [i for i in lines if first <= i < first + PER_SENSOR]

    @sensor(name=f"commits_{first:03d}", minimum_interval_seconds=INTERVAL_S,
            jobs=[lines[i][1] for i in tables], default_status=DefaultSensorStatus.RUNNING)
    def _commits(context: SensorEvaluationContext) -> SensorResult:
        done = json.loads(context.cursor) if context.cursor else {}
        now = time.time()
        requests, adds = [], []
        for i in tables:
            due = [k for k in range(done.get(str(i), 0), PERIODS) if commit_at(i, k) <= now]
            if not due:
                continue
            keys = [partition_key(k, commit_at(i, k)) for k in due]
            adds.append(lines[i][2].build_add_request(keys))
            requests += [RunRequest(run_key=key, job_name=lines[i][1].name, partition_key=key) for key in keys]
            done[str(i)] = due[-1] + 1
        return SensorResult(run_requests=requests, dynamic_partitions_requests=adds, cursor=json.dumps(done))

    return _commits


_LINES = {i: _line(i) for i in range(TABLES)}
defs = Definitions(
    assets=[a for assets, _, _ in _LINES.values() for a in assets],
    jobs=[job for _, job, _ in _LINES.values()],
    sensors=[_sensor(first, _LINES) for first in range(0, TABLES, PER_SENSOR)],
)
