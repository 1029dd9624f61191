"""A line: an ordered sequence of partition keys (snapshots of a table, files of a landing folder)
materialised strictly in order, one run at a time. The Dagster side of ``steps.ordering``.

Run state lives in the instance (partitions, run records, materialisations), never in a sensor
cursor, so a daemon restart or a manual re-execution is seen on the next tick. Every plan first
fails over the line's runs whose worker died (``lease.failover``): a crash never wedges a line.

A tick costs what is still pending, not the line's history: keys are read newest first, a page at a
time, down to the newest key that every asset of the line has materialised (the frontier). The line
runs strictly in order and every sink refuses a batch out of order (checkpoints), so a key done in
every asset means every key before it is done too; only the keys after the frontier are planned.
"""

import math
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    DynamicPartitionsDefinition,
    RunRequest,
    RunsFilter,
)
from dagster._core.storage.dagster_run import FINISHED_STATUSES
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from dagster_shared.serdes import serialize_value

from icecdc_dagster import run_tags
from icecdc_dagster.errors import TERMINAL
from icecdc_dagster.lease import failover, retry
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.instance_connections import keep_connections_open
from icecdc_dagster.lease.line_lock import LineLock, busy_message
from icecdc_dagster.steps.ordering import Blocked, KeyStatus, NextRun, combine_status, plan_next_run

if TYPE_CHECKING:
    from dagster import DagsterInstance, DagsterRun, SensorEvaluationContext

_STATUS = {"MATERIALIZED": KeyStatus.DONE, "FAILED": KeyStatus.FAILED, "IN_PROGRESS": KeyStatus.IN_PROGRESS}
_INSTANCES: dict[str, "DagsterInstance"] = {}
_INSTANCES_LOCK = threading.Lock()


def share_instance(context: "SensorEvaluationContext") -> None:
    """Give a sensor tick this process's instance for its instance ref, instead of a new one per tick.

    In the code server, every tick that touches ``context.instance`` or ``context.resources`` builds a
    ``DagsterInstance`` from the ref and disposes of it after the tick; with SQLite storage that opens
    its three storages and checks their alembic revision by loading every migration script from disk.
    With 20 tables at PT5S (4 ticks a second) that was ~65 % of the code server's CPU (py-spy,
    ``bench/freshness.py``). One instance per ref and process serves every tick, as the daemon's one
    instance serves all of its threads. Contexts that already hold an instance (tests) are left alone.
    """
    if getattr(context, "_instance", None) is not None or context.instance_ref is None:
        return

    key = serialize_value(context.instance_ref)
    with _INSTANCES_LOCK:
        instance = _INSTANCES.get(key)
        if instance is None:
            instance = _INSTANCES[key] = DagsterInstance.from_ref(context.instance_ref)
            keep_connections_open(instance)  # every tick of every sensor uses it
    context._instance = instance  # noqa: SLF001 - what the context's own lazy `instance` property sets


def minimum_interval(polling_interval_s: float) -> int:
    """The sensor's ``minimum_interval_seconds`` for a polling interval: one second less.

    Dagster's sensor daemon looks at its sensors every 5 s and skips one whose last tick started
    less than the minimum interval ago; the previous tick started a moment after its loop did, so an
    interval equal to the loop's was skipped every other loop (PT5S polled every 10 s half of the
    time, measured in bench/freshness.py). One second less keeps the cadence the user wrote.
    """
    return max(1, math.ceil(polling_interval_s) - 1)


TAIL_PAGE = 100  # keys read per page when walking a line back to its frontier
MEMBERSHIP_CHUNK = 500  # keys per "which of these are materialised" query
_ACTIVE_RUN_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                        DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


@dataclass(frozen=True)
class Line:
    line_id: str                      # its runs' line tag (run_tags.line_tags): a table, or ingest:<name>
    partitions_def: DynamicPartitionsDefinition
    asset_keys: tuple[AssetKey, ...]  # every asset a run of the line materialises
    max_keys_per_run: int
    max_retries: int
    check_keys: tuple[AssetCheckKey, ...] = ()  # the checks a batch run executes (None of them: all)
    # Assets that may join the line while it runs (a table's sinks): one never materialised does not
    # hold the line back; it gets its own export with the next batch (see ``lines.window``).
    joinable: tuple[AssetKey, ...] = ()

    @property
    def partitions_name(self) -> str:
        """The name of the line's dynamic partitions (always set: lines build them by name)."""
        assert self.partitions_def.name is not None
        return self.partitions_def.name

    @property
    def first_asset(self) -> AssetKey:
        """The asset a run of the line materialises first (a table's changelog, an entry's ingest)."""
        return self.asset_keys[0]


def key_statuses(instance: "DagsterInstance", line: Line, keys: Sequence[str]) -> dict[str, KeyStatus]:
    """Per key, the combined status over every asset of the line, from Dagster's partition status cache
    (its cost follows every partition of each asset: see :func:`pending_statuses` for a backlog)."""
    if not keys:
        return {}
    per_asset = []
    for asset_key in line.asset_keys:
        statuses = instance.get_status_by_partition(asset_key, list(keys), line.partitions_def) or {}
        per_asset.append({k: _STATUS.get(getattr(v, "name", ""), None) for k, v in statuses.items()})
    return {key: combine_status([statuses.get(key) for statuses in per_asset]) for key in keys}


def active_run(instance: "DagsterInstance", line: Line) -> "DagsterRun | None":
    for tags in run_tags.line_filters(line.line_id):
        records = instance.get_run_records(RunsFilter(tags=tags, statuses=_ACTIVE_RUN_STATUSES), limit=1)
        if records:
            return records[0].dagster_run
    return None


def describe_run(run: "DagsterRun") -> str:
    holder = Holder.from_tags(run.tags)
    worker = f", worker {holder.describe()}" if holder else ""
    return f"run {run.run_id} ({run.status.value}{worker})"


def newest_key(instance: "DagsterInstance", line: Line) -> str | None:
    """The line's newest known key (one indexed query, whatever the history)."""
    page = instance.get_paginated_dynamic_partitions(line.partitions_name, limit=1, ascending=False)
    return page.results[0] if page.results else None


def oldest_key(instance: "DagsterInstance", line: Line) -> str | None:
    """The line's first key (one indexed query, whatever the history)."""
    page = instance.get_paginated_dynamic_partitions(line.partitions_name, limit=1, ascending=True)
    return page.results[0] if page.results else None


def key_count(instance: "DagsterInstance", line: Line, before: str | None = None) -> int:
    """How many keys the line has; ``before``: how many were added before that key (0 if it is unknown).

    One aggregate query on Dagster's dynamic partitions table: no key is read, the database counts
    index entries. An event log storage that is not SQL counts the keys it returns.
    """
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage  # ~2 s beyond dagster, key counts only

    storage = instance.event_log_storage
    if not isinstance(storage, SqlEventLogStorage):
        keys = list(instance.get_dynamic_partitions(line.partitions_name))
        if before is None:
            return len(keys)
        return keys.index(before) if before in keys else 0
    import sqlalchemy as db  # a SQL event log only
    from dagster._core.storage.event_log.schema import DynamicPartitionsTable as Keys  # a SQL event log only

    of_line = Keys.c.partitions_def_name == line.partitions_name
    query = db.select(db.func.count()).select_from(Keys).where(of_line)
    if before is not None:
        query = query.where(Keys.c.id < db.select(Keys.c.id).where(of_line, Keys.c.partition == before)
                            .scalar_subquery())
    with storage.index_connection() as conn:
        return int(conn.execute(query).scalar() or 0)


def _latest_ids(instance: "DagsterInstance", asset_key: AssetKey, event_type: DagsterEventType,
                keys: Sequence[str]) -> dict[str, int]:
    """The storage id of each key's latest event of that type for the asset (keys without one are
    left out): indexed queries, a chunk of keys at a time (SQL engines cap bound parameters)."""
    found: dict[str, int] = {}
    ordered = sorted(set(keys))
    for start in range(0, len(ordered), MEMBERSHIP_CHUNK):
        found |= instance.event_log_storage.get_latest_storage_id_by_partition(
            asset_key, event_type, set(ordered[start:start + MEMBERSHIP_CHUNK]))
    return found


def materialised_keys(instance: "DagsterInstance", asset_key: AssetKey, keys: Sequence[str]) -> set[str]:
    """Those of ``keys`` the asset has materialised (indexed queries, a chunk of keys at a time)."""
    return set(_latest_ids(instance, asset_key, DagsterEventType.ASSET_MATERIALIZATION, list(keys)))


def done_in_every_asset(instance: "DagsterInstance", line: Line, keys: Sequence[str]) -> set[str]:
    """Those of ``keys`` that every asset of the line has materialised (one indexed query per asset)."""
    done = set(keys)
    for asset_key in line.asset_keys:
        done &= set(_latest_ids(instance, asset_key, DagsterEventType.ASSET_MATERIALIZATION, list(done)))
        if not done:
            break
    return done


def pending_statuses(instance: "DagsterInstance", line: Line, keys: Sequence[str],
                     done: Collection[str] | None = None) -> dict[str, KeyStatus]:
    """Per key of ``keys`` (what can still be pending: a window, the tail after the frontier), its
    status over every asset of the line, read from the event log for these keys only.

    DONE: every asset materialised it (:func:`done_in_every_asset`, as the sensors decide; ``done``:
    those keys, when the caller already has them). Otherwise per asset as Dagster's partition status
    defines it: the latest planned materialisation without a materialisation since is IN_PROGRESS
    while its run has not finished, FAILED when its run failed; the assets' statuses combine as in
    :func:`key_statuses`. No key outside ``keys`` is read, whatever the history.
    """
    done = set(done_in_every_asset(instance, line, keys) if done is None else done) & set(keys)
    rest = [key for key in keys if key not in done]
    per_asset: list[dict[str, KeyStatus | None]] = []
    attempts: list[dict[str, str]] = []  # per asset: key -> run id of an attempt without a materialisation since
    for asset_key in line.asset_keys:
        materialised = _latest_ids(instance, asset_key, DagsterEventType.ASSET_MATERIALIZATION, rest)
        planned = _latest_ids(instance, asset_key, DagsterEventType.ASSET_MATERIALIZATION_PLANNED, rest)
        open_ids = {sid: key for key, sid in planned.items() if sid > materialised.get(key, 0)}
        runs: dict[str, str] = {}
        ids = sorted(open_ids)
        for start in range(0, len(ids), MEMBERSHIP_CHUNK):
            chunk = ids[start:start + MEMBERSHIP_CHUNK]
            for record in instance.fetch_planned_materializations(
                    AssetRecordsFilter(asset_key=asset_key, storage_ids=chunk), limit=len(chunk)).records:
                runs[open_ids[record.storage_id]] = record.run_id
        attempts.append(runs)
        per_asset.append({key: KeyStatus.DONE for key in materialised})
    run_ids = sorted({run_id for runs in attempts for run_id in runs.values()})
    run_status: dict[str, DagsterRunStatus] = {}
    for start in range(0, len(run_ids), MEMBERSHIP_CHUNK):
        run_status |= {run.run_id: run.status for run in instance.get_runs(
            RunsFilter(run_ids=run_ids[start:start + MEMBERSHIP_CHUNK]))}
    for statuses, runs in zip(per_asset, attempts, strict=True):
        for key, run_id in runs.items():
            status = run_status.get(run_id)  # None: the run was deleted (neither failed nor in progress)
            if status is DagsterRunStatus.FAILURE:
                statuses[key] = KeyStatus.FAILED
            elif status is not None and status not in FINISHED_STATUSES:
                statuses[key] = KeyStatus.IN_PROGRESS
    result = {key: KeyStatus.DONE for key in done}
    return result | {key: combine_status([statuses.get(key) for statuses in per_asset]) for key in rest}


def pending_keys(instance: "DagsterInstance", line: Line, page_size: int = TAIL_PAGE) -> list[str]:
    """Known keys after the line's frontier (the newest key done in every asset), oldest first.

    Reads the keys newest first, a page at a time, and stops at the frontier: the cost follows the
    backlog, not the history (a year of synced snapshots costs one page).
    """
    tail: list[str] = []
    cursor: str | None = None
    while True:
        page = instance.get_paginated_dynamic_partitions(line.partitions_name, limit=page_size,
                                                         ascending=False, cursor=cursor)
        keys = list(page.results)
        done = done_in_every_asset(instance, line, keys)
        for key in keys:  # newest first
            if key in done:
                return tail[::-1]
            tail.append(key)
        if not page.has_more or not keys:
            return tail[::-1]
        cursor = page.cursor


def failures_of(instance: "DagsterInstance", line: Line, key: str) -> int:
    """Failed runs of the line that started at ``key`` and count against ``max_retries``: not those
    whose worker died, nor transient errors (``lease.retry``)."""
    return retry.attempts_at(instance, line.line_id, key).spent


def plan(instance: "DagsterInstance", line: Line, new_keys: Sequence[str] = (),
         detected_by: Holder | None = None, window: Sequence[str] | None = None,
         config_path: str | None = None, done: Collection[str] | None = None,
         patient: bool = True) -> NextRun | Blocked | None:
    """The next run of the line. Runs whose worker died are failed over first; a live run blocks the
    line until it ends.

    ``window``: the keys that can still be pending, in order, known or new (a table line derives them
    from its ancestry after its latest materialisations); keys done in every asset are skipped. Without
    it, the known keys after the frontier (:func:`pending_keys`) and then ``new_keys`` (discovered this
    tick, not yet added as partitions). The first key not done is retried by what failed it
    (``lease.retry``): a dead worker at once, a transient error after its backoff, a terminal error
    never (the line stops, naming the command), anything else up to ``max_retries``; pending keys after
    it may join a catch-up range. ``config_path``: named in the recovery commands; ``done``: the
    window's keys done in every asset, when the caller knows them; ``patient``: a batch whose worker
    keeps dying waits for a backoff (the sensor); False: retried at once (``icecdc sync``, an operator).
    """
    failover.fail_dead_runs(instance, line.line_id, detected_by)
    running = active_run(instance, line)
    keys = list(window) if window is not None else [*pending_keys(instance, line), *new_keys]
    if done is None:
        done = done_in_every_asset(instance, line, keys) if window is not None else set()
    first = next((key for key in keys if key not in done), None)
    if running is not None:
        return Blocked(first or "", f"a run of {line.line_id} is in progress: {describe_run(running)}")
    if first is None:
        return None
    attempts = retry.attempts_at(instance, line.line_id, first)
    waiting = retry_verdict(line, first, attempts, config_path, patient=patient)
    if waiting is not None:
        return waiting
    status = {key: KeyStatus.DONE for key in done} | ({first: KeyStatus.FAILED} if attempts.spent else {})
    return plan_next_run(keys, status, {first: attempts.spent}, max_keys_per_run=line.max_keys_per_run,
                         max_retries=line.max_retries, runs={first: attempts.runs})


def retry_verdict(line: Line, key: str, attempts: retry.Attempts, config_path: str | None,
                  now: float | None = None, patient: bool = True) -> Blocked | None:
    """Why the line's first key may not run yet: a terminal failure stops the line (retried once only
    by ``--retry-failed``), a transient one waits for its backoff, and (``patient``) so does a batch
    whose worker died again and again. None: it may run."""
    now = time.time() if now is None else now
    dead_retry_at = attempts.dead_retry_at() if patient else None
    if dead_retry_at is not None and dead_retry_at > now:
        return Blocked(key, retry.dead_streak_reason(key, attempts, dead_retry_at - now), retry_at=dead_retry_at)
    latest = attempts.latest
    if latest is None or attempts.dead_streak:
        return None
    if latest.kind == TERMINAL:
        return Blocked(key, retry.terminal_reason(key, attempts, line.line_id, config_path), failed=True)
    retry_at = attempts.retry_at()
    if retry_at is not None and retry_at > now:
        return Blocked(key, retry.waiting_reason(key, attempts, now), retry_at=retry_at)
    return None


def wait_for_run_end(instance: "DagsterInstance", run_id: str, stop_requested: Callable[[], bool],
                     poll_s: float = 1.0) -> None:
    """Until the run ends (or its worker dies and it is failed over), or a stop is requested."""
    while not stop_requested():
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return
        failover.fail_over(instance, run, Holder.current())
        time.sleep(poll_s)


def held_elsewhere(instance: "DagsterInstance", line: Line) -> str | None:
    """For sensors: why the line is busy when another writer (an ``icecdc sync``) holds its lock."""
    lock = LineLock.for_instance(instance, line.line_id)
    return busy_message(lock) if lock.is_busy() else None


def run_selection(line: Line, planned: NextRun) -> tuple[list[AssetKey], list[AssetCheckKey] | None]:
    """The assets and checks a run of ``planned`` executes: the whole line, or the sinks joining it."""
    if not planned.assets:
        return list(line.asset_keys), list(line.check_keys) or None
    assets = [AssetKey.from_user_string(name) for name in planned.assets]
    return assets, [check for check in line.check_keys if check.asset_key in set(assets)]


def run_request(line: Line, planned: NextRun) -> RunRequest:
    tags = run_tags.line_tags(line.line_id, planned.first_key, planned.last_key)
    selection, checks = run_selection(line, planned)
    if planned.first_key == planned.last_key:
        return RunRequest(run_key=planned.run_key, partition_key=planned.first_key, asset_selection=selection,
                          asset_check_keys=checks, tags=tags)
    tags |= {ASSET_PARTITION_RANGE_START_TAG: planned.first_key, ASSET_PARTITION_RANGE_END_TAG: planned.last_key}
    return RunRequest(run_key=planned.run_key, asset_selection=selection, asset_check_keys=checks, tags=tags)
