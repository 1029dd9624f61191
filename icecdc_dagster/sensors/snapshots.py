"""The per-table sensor: new snapshots become partitions, and runs are requested in order.

Each tick: (1) walk the table's current ancestry after the newest known
partition and add the new snapshot ids as partitions, in commit order; (2) ask
``plan_next_run`` for the first batch that is not done. Only one run per
table is ever in flight, a failed batch is retried up to ``max_retries`` and
then blocks the line until it is re-executed; other tables keep flowing. A run whose worker
died is failed over on the next tick (and retried); while an ``icecdc sync`` holds the table's
line lock the sensor requests nothing. When the run queue holds what the lanes will start within two
sensor intervals, lines with work wait, unplanned, for a later tick (``sensors.admission``): their
runs then take every snapshot committed meanwhile instead of queueing behind stale ranges.
The partitions themselves are the cursor, so a daemon restart loses nothing. The sensor's own
cursor only marks an idle line (nothing to do at a given table metadata file): until it changes, for
at most ``IDLE_RECHECK_S``, a tick compares the catalog's record of the table and skips the line's
queries (one sensor for every table: then the longest idle lines get their full check first,
``IDLE_RECHECKS_PER_TICK`` a tick, so the cost at rest does not grow with the tables).

When the table changed under the line (rolled back, a needed snapshot expired, dropped and
recreated: ``lines.window.line_view``), the tick skips with a reason that names what happened
and the ``icecdc resync`` command that recovers; it never raises on every tick. Partitions before
the latest resync bootstrap are superseded and never planned again.
"""

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)
from pyiceberg.exceptions import NoSuchTableError

from icecdc_dagster.assets import naming
from icecdc_dagster.assets.naming import table_line
from icecdc_dagster.assets.source_table import source_observations
from icecdc_dagster.config import TableConfig
from icecdc_dagster.lease import retry
from icecdc_dagster.lease.executor import line_job
from icecdc_dagster.lines import line
from icecdc_dagster.lines.window import TableWindow, WholeLine, diagnose, discover_new_keys, line_view
from icecdc_dagster.resources.keys import CATALOG_KEY
from icecdc_dagster.resources.resolved import initialized
from icecdc_dagster.sensors.admission import Admission
from icecdc_dagster.steps import lifecycle
from icecdc_dagster.steps.ordering import Blocked, NextRun

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from pyiceberg.table import Table

    from icecdc_dagster.resources import IcebergCatalogResource


def evaluate(instance: "DagsterInstance", table: TableConfig, source_table: "Table",
             config_path: str | None = None, patient: bool = True) -> tuple[list[str], NextRun | Blocked | None]:
    """New keys to add and the next run to request, for this tick (shared by the CLI's sync).
    A table that changed under the line gives ``Blocked`` with the diagnosis (no new keys).
    ``patient``: see ``line.plan`` (False for ``icecdc sync``)."""
    table_line_ = table_line(table)
    view = line_view(instance, table_line_, source_table)
    if isinstance(view, TableWindow):
        new_keys, planned = plan_window(instance, table_line_, view, config_path, patient)
        # The window starts after applied keys, so its first key is never a bootstrap: it may need its
        # parent's rows (merge-on-read diff), and that parent may have been expired once applied.
        if isinstance(planned, NextRun) and not planned.assets:
            problem = lifecycle.pending_problem(source_table, table.table_name, planned.first_key, config_path)
            if problem is not None:
                return [], Blocked(planned.first_key, problem.message)
        return new_keys, planned
    return plan_whole_line(instance, table_line_, view, source_table, config_path, patient)


def plan_whole_line(instance: "DagsterInstance", table_line_: line.Line, view: WholeLine, source_table: "Table",
                    config_path: str | None, patient: bool) -> tuple[list[str], NextRun | Blocked | None]:
    """:func:`evaluate` when the line does not simply follow the table: the whole line, diagnosed."""
    problem = diagnose(instance, table_line_, source_table, view.known, config_path)
    if problem is not None:
        return [], Blocked(view.active[-1], problem.message)
    new_keys = discover_new_keys(source_table, view.active[-1] if view.active else None)
    return new_keys, line.plan(instance, table_line_, window=view.active + new_keys, config_path=config_path,
                               patient=patient)


def plan_window(instance: "DagsterInstance", table_line_: line.Line, window: TableWindow,
                config_path: str | None = None, patient: bool = True) -> tuple[list[str], NextRun | Blocked | None]:
    """:func:`evaluate` when the line follows the table (the usual tick): its cost follows the
    backlog, not the history."""
    keys = window.keys
    known = instance.get_existing_dynamic_partitions(table_line_.partitions_name, keys) if keys else set()
    new_keys = [key for key in keys if key not in known]
    # What the line has applied is what its other assets have: a joining sink has nothing yet.
    following = tuple(key for key in table_line_.asset_keys if key not in window.joining)
    planned = line.plan(instance, table_line_, window=keys, config_path=config_path,
                        done=window.done(instance, following), patient=patient)
    if planned is None and window.joining:
        planned = join_run(instance, table_line_, window, config_path, patient)
    return new_keys, planned


def join_run(instance: "DagsterInstance", table_line_: line.Line, window: TableWindow,
             config_path: str | None, patient: bool = True) -> NextRun | Blocked | None:
    """Nothing is pending but sinks were added: a run of the key the others applied last, for the
    joining sinks only (each exports the table at that snapshot; nothing else runs again). Exporting at
    the line's applied snapshot, not the table's newest, keeps every sink of the line at one checkpoint:
    the next batch then follows all of them (an export ahead of the others would be refused by it)."""
    key = window.keys[-1] if window.keys else window.applied_key  # every window key is done: the newest
    assert key is not None
    attempts = retry.attempts_at(instance, table_line_.line_id, key)
    assets = tuple(k.to_user_string() for k in window.joining)
    waiting = line.retry_verdict(table_line_, key, attempts, config_path, patient=patient)
    if waiting is None and attempts.spent > table_line_.max_retries:
        waiting = Blocked(key, f"the export of the sinks joining at {key} ({', '.join(assets)}) failed "
                               f"{attempts.spent} times; re-execute it (icecdc sync --retry-failed)", failed=True)
    if waiting is not None:
        return dataclasses.replace(waiting, assets=assets)
    return NextRun(key, key, (key,), attempts.runs + 1, assets=assets)


IDLE_RECHECK_S = 60.0
# ``snapshot_sensors: one``: idle lines due a full check, at most this many per tick (the oldest first). Why:
# a full check is ~0.03 CPU-s of instance queries and a table load; with every idle line rechecked each
# IDLE_RECHECK_S, 50 idle tables cost four a tick, half the code server's CPU at rest
# (bench/freshness.py --tables 50, py-spy). A line is rechecked every max(IDLE_RECHECK_S, tables x interval).
IDLE_RECHECKS_PER_TICK = 1
UNCHANGED_SKIP = "all snapshots are applied (the table unchanged since the last full check)"
NOT_IDLE = "{}"  # a cursor that marks nothing (Dagster keeps the previous cursor when a result has none)


def idle_fingerprint(table: TableConfig, source_table: "Table | str") -> str:
    """What an idle line's next tick compares: the table's metadata file (every commit, rollback,
    expiry or property change writes a new one) and the line's sinks. ``source_table``: the table, or
    its metadata location as the catalog records it (a SQL catalog answers every due table's in one
    query, without reading a metadata file).

    Why not the line's newest partition too: reading it was one instance query per table per tick,
    half the code server's CPU at rest with 50 tables (py-spy, ``bench/freshness.py``). A partition added
    from outside while the table stands still is a resync's, and a resync applies it itself; should that
    run fail, the next full check (``IDLE_RECHECK_S``) plans it."""
    location = source_table if isinstance(source_table, str) else source_table.metadata_location
    sinks = ",".join(s.name for s in table.sinks)  # a sink added to the file is not idle
    return f"{location}|{sinks}"


def idle_cursor(fingerprint: str, now: float | None = None) -> str:
    return json.dumps({"idle": fingerprint, "at": time.time() if now is None else now})


def still_idle(cursor: str | None, fingerprint: str, now: float | None = None, expire: bool = True) -> bool:
    """The last full check found nothing to do, nothing changed since, and it is recent (``expire`` False:
    however old it is; the caller rechecks it later).

    The cursor only lets a tick skip work: the line's state stays in the instance (partitions,
    runs, materialisations) and every ``IDLE_RECHECK_S`` a full check reads it again (a wiped
    materialisation, a run launched by hand whose worker died). Runs are only requested after a
    full check.
    """
    if not cursor:
        return False
    try:
        mark = json.loads(cursor)
        at = float(mark["at"])
    except (ValueError, KeyError, TypeError):
        return False
    now = time.time() if now is None else now
    return mark.get("idle") == fingerprint and (not expire or 0 <= now - at < IDLE_RECHECK_S)


def idle_since(cursor: str | None) -> float | None:
    """When a line's idle mark was set (its last full check); None: the cursor marks nothing."""
    try:
        mark = json.loads(cursor) if cursor else None
        return float(mark["at"]) if isinstance(mark, dict) and "idle" in mark else None
    except (ValueError, KeyError, TypeError):
        return None


class ResolvedCatalog:
    """The pipeline's catalog resource with its config resolved (``EnvVar`` secrets), once per process.

    The sensor takes it from the definitions instead of declaring a resource: a tick with resources
    makes Dagster's code server build a ``DagsterInstance`` from the instance ref for that tick alone
    (see ``line.share_instance``), the largest cost of an idle tick.
    """

    def __init__(self, resource: "IcebergCatalogResource") -> None:
        self._resource = resource

    def get(self) -> "IcebergCatalogResource":
        """Raises: ConfigError: a variable the catalog's config names is not set."""
        return initialized(self._resource, CATALOG_KEY)


def tick(instance: "DagsterInstance", cursor: str | None, table: TableConfig, catalog: "IcebergCatalogResource",
         config_path: str | None, known_location: str | None = None,
         admission: Admission | None = None, recheck: bool = True) -> SensorResult:
    """One tick of ``table``'s line: new partitions, the next run (or why none), its cursor.
    ``known_location``: the table's metadata location when the caller read it already (one query for
    every table of a tick, :meth:`IcebergCatalogResource.metadata_locations`). ``admission``: the
    tick's room in the run queue; a line with work when there is none is deferred, unplanned.
    ``recheck`` False: an idle mark older than ``IDLE_RECHECK_S`` still holds (its full check waits its turn)."""
    if cursor:  # an idle mark to compare: the catalog's record first, the table only if it moved
        location = known_location or catalog.metadata_location(table.table_name)
        if location is not None and still_idle(cursor, idle_fingerprint(table, location), expire=recheck):
            return SensorResult(skip_reason=SkipReason(UNCHANGED_SKIP), cursor=cursor)
    if admission is not None and admission.full():  # planning it now would only be thrown away
        return SensorResult(skip_reason=SkipReason(admission.refuse(table.table_name)), cursor=cursor)
    try:
        source = catalog.load_table(table.table_name)
    except NoSuchTableError:  # an ingest entry with auto_create has not created it yet
        return SensorResult(skip_reason=SkipReason(f"table {table.table_name} does not exist yet"))
    fingerprint = idle_fingerprint(table, source)
    if still_idle(cursor, fingerprint, expire=recheck):
        return SensorResult(skip_reason=SkipReason(UNCHANGED_SKIP), cursor=cursor)
    new_keys, planned = evaluate(instance, table, source, config_path)
    # Nothing to do and nothing new: the next ticks skip the line's queries until the table or
    # the line changes (or IDLE_RECHECK_S pass). Any other outcome clears the mark.
    mark = idle_cursor(fingerprint) if planned is None and not new_keys else NOT_IDLE
    partitions = naming.partitions_def(table)
    add = [partitions.build_add_request(new_keys)] if new_keys else []
    # Record the source's new state on its observable asset (data version = snapshot id).
    events = source_observations(table, catalog.name, source, new_keys)
    busy = line.held_elsewhere(instance, table_line(table)) if isinstance(planned, NextRun) else None
    if isinstance(planned, NextRun) and busy is None and admission is not None:
        busy = admission.admit(table.table_name)
    if isinstance(planned, NextRun) and busy is None:
        return SensorResult(run_requests=[line.run_request(table_line(table), planned)],
                            dynamic_partitions_requests=add, asset_events=events, cursor=mark)
    reason = busy or (planned.reason if isinstance(planned, Blocked) else "all snapshots are applied")
    return SensorResult(skip_reason=SkipReason(reason), dynamic_partitions_requests=add, asset_events=events,
                        cursor=mark)


def build_snapshot_sensor(table: TableConfig, config_path: str | None = None,
                          catalog_resource: "IcebergCatalogResource | None" = None) -> SensorDefinition:
    """``catalog_resource``: the definitions' catalog resource (None: the sensor declares the
    ``catalog`` resource and Dagster builds it per tick)."""
    resolved = ResolvedCatalog(catalog_resource) if catalog_resource is not None else None
    job = line_job(naming.sensor_name(table), naming.asset_keys(table))

    @sensor(
        name=naming.sensor_name(table),
        minimum_interval_seconds=line.minimum_interval(table.polling_interval_s),
        job=job,
        default_status=DefaultSensorStatus.RUNNING,
        required_resource_keys=set() if resolved is not None else {CATALOG_KEY},
        description=f"Adds each new snapshot of {table.table_name} as a partition and syncs them in order.",
    )
    def _sensor(context: SensorEvaluationContext) -> SensorResult:
        line.share_instance(context)
        catalog = resolved.get() if resolved is not None else getattr(context.resources, CATALOG_KEY)
        admission = Admission(context.instance, [job.name], table.polling_interval_s)
        return tick(context.instance, context.cursor, table, catalog, config_path, admission=admission)

    return _sensor


ALL_TABLES_SENSOR = "snapshots__all_tables"


def build_tables_sensor(tables: Sequence[TableConfig], config_path: str | None,
                        catalog_resource: "IcebergCatalogResource") -> SensorDefinition:
    """``snapshot_sensors: one``: one sensor ticks every table's line (the same plans, runs and
    partitions as one sensor per table), each no more often than its own polling interval.

    Why: the daemon's cost is per sensor tick (a tick record, a code-server call, the cursor), not per
    table: at 20 tables ~4x less daemon CPU at rest (``bench/freshness.py --sensors both``). The price:
    the UI shows one tick history and one on/off switch for every table. The cursor is a JSON map by
    table name: ``{"cursor": <the table's tick cursor>, "at": <its last tick>}``."""
    resolved = ResolvedCatalog(catalog_resource)
    # One job per table, as with a sensor per table: a job's assets share one partitions definition.
    jobs = {table.table_name: line_job(naming.sensor_name(table), naming.asset_keys(table)) for table in tables}
    minimum = {table.table_name: line.minimum_interval(table.polling_interval_s) for table in tables}

    @sensor(name=ALL_TABLES_SENSOR, minimum_interval_seconds=min(minimum.values()),
            jobs=list(jobs.values()),
            default_status=DefaultSensorStatus.RUNNING,
            description="Adds each new snapshot of every table as a partition and syncs them in order, each table "
                        "at its own polling interval.")
    def _all(context: SensorEvaluationContext) -> SensorResult:
        line.share_instance(context)
        marks = json.loads(context.cursor) if context.cursor else {}
        now = time.time()
        due = due_tables(tables, marks, minimum, now)
        catalog = resolved.get()
        # Lines with an idle mark compare the catalog's record first: every such table's in one query.
        locations = catalog.metadata_locations([t.table_name for t in due if marks.get(t.table_name, {}).get("cursor")])
        admission = Admission(context.instance, [job.name for job in jobs.values()], min(minimum.values()) + 1)
        rechecks = idle_rechecks(due, marks, now)
        results = []
        for table in due:
            previous = marks.get(table.table_name, {}).get("cursor")
            result = tick(context.instance, previous, table, catalog, config_path, locations.get(table.table_name),
                          admission, recheck=table.table_name in rechecks)
            # A deferred line keeps its last tick's time: due again at once, and first in line.
            at = marks.get(table.table_name, {}).get("at", 0.0) if table.table_name in admission.deferred else now
            marks[table.table_name] = {"cursor": result.cursor if result.cursor is not None else previous, "at": at}
            results.append((table, result))
        return merged(results, json.dumps(marks), {name: job.name for name, job in jobs.items()})

    return _all


def due_tables(tables: Sequence[TableConfig], marks: Mapping[str, Mapping[str, Any]], minimum: Mapping[str, int],
               now: float) -> list[TableConfig]:
    """The tables whose interval has passed since their last tick, the longest waiting first: when the run
    queue has room for only some lines, the ones deferred on earlier ticks go first (no line starves)."""
    def last(table: TableConfig) -> float:
        return float(marks.get(table.table_name, {}).get("at", 0.0))

    return sorted((t for t in tables if now - last(t) >= minimum[t.table_name]), key=last)


def idle_rechecks(due: Sequence[TableConfig], marks: Mapping[str, Mapping[str, Any]], now: float) -> set[str]:
    """The due lines whose idle mark expired that get their full check this tick: the
    ``IDLE_RECHECKS_PER_TICK`` longest idle (the others keep their marks until their turn; a line whose table
    moved is checked at once, whatever its mark)."""
    expired = []
    for table in due:
        since = idle_since(marks.get(table.table_name, {}).get("cursor"))
        if since is not None and not 0 <= now - since < IDLE_RECHECK_S:
            expired.append((since, table.table_name))
    return {name for _, name in sorted(expired)[:IDLE_RECHECKS_PER_TICK]}


def merged(results: list[tuple[TableConfig, SensorResult]], cursor: str, job_names: Mapping[str, str]) -> SensorResult:
    """Several tables' tick results as one, each run request naming its table's job (``job_names``: table name
    -> job); skipped only when no table requests a run."""
    requests = [r.with_replaced_attrs(job_name=job_names[table.table_name])
                for table, result in results for r in result.run_requests or []]
    skipped = "; ".join(f"{table.table_name}: {result.skip_reason.skip_message}" for table, result in results
                        if result.skip_reason is not None and result.skip_reason.skip_message)
    added = [p for _, result in results for p in result.dynamic_partitions_requests or []]
    return SensorResult(run_requests=requests, dynamic_partitions_requests=added,
                        asset_events=[e for _, result in results for e in result.asset_events or []], cursor=cursor,
                        skip_reason=None if requests else SkipReason(skipped or "no table is due"))
