"""The per-table sensor: new snapshots become partitions, and runs are requested in order.

Each tick: (1) walk the table's current ancestry after the newest known
partition and add the new snapshot ids as partitions, in commit order; (2) ask
``plan_next_run`` for the first batch that is not done. Only one run per
table is ever in flight, a failed batch is retried up to ``max_retries`` and
then blocks the line until it is re-executed; other tables keep flowing. A run whose worker
died is failed over on the next tick (and retried); while an ``icecdc sync`` holds the table's
line lock the sensor requests nothing.
The partitions themselves are the cursor, so a daemon restart loses nothing. The sensor's own
cursor only marks an idle line (nothing to do at a given table metadata file and newest partition):
until either changes, for at most ``IDLE_RECHECK_S``, a tick reads the table and one partition key
and skips the line's queries.

When the table changed under the line (rolled back, a needed snapshot expired, dropped and
recreated: ``pipeline.lifecycle.diagnose``), the tick skips with a reason that names what happened
and the ``icecdc resync`` command that recovers; it never raises on every tick. Partitions before
the latest resync bootstrap are superseded and never planned again.
"""

import dataclasses
import json
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dagster import (AssetKey, DefaultSensorStatus, RunRequest, SensorDefinition,
                     SensorEvaluationContext, SensorResult, SkipReason, sensor)

from icecdc_dagster import changelog
from icecdc_dagster.assets import naming
from icecdc_dagster.assets.source import source_observations
from icecdc_dagster.config import TableConfig
from icecdc_dagster.errors import SnapshotNotFoundError
from icecdc_dagster.pipeline import lifecycle
from icecdc_dagster.pipeline.ordering import Blocked, KeyStatus, NextRun
from icecdc_dagster.sensors import line

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from pyiceberg.table import Table

    from icecdc_dagster.resources import IcebergCatalogResource


def discover_new_keys(table: "Table", newest_known: str | None) -> list[str]:
    """Snapshot ids after the newest known key along the current ancestry (the bootstrap if none).
    Raises a ``LineDivergedError`` when the newest key is not in that ancestry (see ``diagnose``)."""
    current = table.current_snapshot()
    if current is None:
        return []
    if newest_known is None:
        return [str(current.snapshot_id)]
    return [str(sid) for sid in changelog.ancestry_ids(table, lifecycle.snapshot_id_of(newest_known))]


def recorded_table_uuid(instance: "DagsterInstance", table: TableConfig, active: list[str]) -> str | None:
    """The source table uuid recorded by the line's latest changelog batch, if it is on the active line."""
    from dagster import AssetRecordsFilter

    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=naming.changelog_key(table)),
                                              limit=1).records
    if not records or records[0].partition_key not in set(active):
        return None
    materialization = records[0].asset_materialization
    value = materialization.metadata.get(naming.SOURCE_UUID_METADATA) if materialization else None
    return str(getattr(value, "value", value)) if value is not None else None


def diagnose(instance: "DagsterInstance", table: TableConfig, source_table: "Table", known: list[str],
             config_path: str | None, done: set[str] | None = None) -> lifecycle.LineProblem | None:
    """Why the line cannot continue (rollback, expiry, recreation), or None. ``done``: the active
    keys done in every asset, when the caller already has them."""
    active = lifecycle.active_keys(known)
    # Materialisation records, not Dagster's cached partition status (stale under concurrent writers).
    if done is None:
        done = line.done_in_every_asset(instance, table_line(table), active)
    return lifecycle.diagnose(source_table, table.table_name, known, done,
                              recorded_table_uuid(instance, table, active), config_path)


def asset_keys(table: TableConfig) -> list[AssetKey]:
    return [naming.changelog_key(table), *(naming.sink_key(s) for s in table.sinks)]


def table_line(table: TableConfig) -> line.Line:
    return line.Line(line_id=table.table_name, partitions_def=naming.partitions_def(table),
                     asset_keys=tuple(asset_keys(table)), max_keys_per_run=table.max_snapshots_per_run,
                     max_retries=table.max_retries, check_keys=naming.batch_check_keys(table),
                     joinable=tuple(naming.sink_key(s) for s in table.sinks))


def key_statuses(instance: "DagsterInstance", table: TableConfig, keys: list[str]) -> dict[str, KeyStatus]:
    """Per key, the combined status over the changelog asset and every sink asset."""
    return line.key_statuses(instance, table_line(table), keys)


def run_request(table: TableConfig, planned: NextRun) -> RunRequest:
    return line.run_request(table_line(table), planned)


@dataclass(frozen=True)
class TableWindow:
    keys: list[str]   # the snapshots that can still be pending, in commit order (known or new)
    line: str | None  # the active line's token (its resync key), None for the original line
    applied: int      # the newest snapshot every asset has applied (the window starts after it)
    # Sinks added to the running line (never materialised) and the key the others applied last.
    joining: tuple[AssetKey, ...] = ()
    applied_key: str | None = None
    anchors: tuple[tuple[AssetKey, int], ...] = ()  # each asset's latest materialised snapshot

    def done(self, instance: "DagsterInstance", assets: tuple[AssetKey, ...]) -> set[str]:
        """The window's keys done in every one of ``assets``. The line runs in order, so an asset has
        applied every key up to its latest one even without a materialisation of each (a sink that
        joined the line at its export has none before it)."""
        position = {str(sid): i for i, sid in enumerate(self.keys)}
        latest = dict(self.anchors)
        done = set(self.keys)
        for asset_key in assets:
            reached = set(self.keys[:position.get(str(latest.get(asset_key)), -1) + 1])
            rest = [key for key in done if key not in reached]
            done = (done & reached) | line.materialised_keys(instance, asset_key, rest)
        return done


def ancestry_window(instance: "DagsterInstance", table_line_: line.Line, source_table: "Table") -> list[str] | None:
    """The snapshots that can still be pending, in commit order: the table's ancestry after the oldest
    of the line's assets' latest materialisations (metadata and indexed queries only, whatever the
    history).

    None - the caller then diagnoses the whole line - when an asset has never been materialised, when
    a latest key left the ancestry (rollback, expiry, a recreated table), or when a resync started a
    new line that the latest materialisations do not all belong to yet.
    """
    window = table_window(instance, table_line_, source_table)
    return window.keys if window is not None else None


def table_window(instance: "DagsterInstance", table_line_: line.Line, source_table: "Table") -> TableWindow | None:
    """:func:`ancestry_window`, with the active line's token: the line every asset's latest batch
    recorded (no later resync exists when there is a window).

    Assets whose latest batches recorded different lines (a resync whose sink step failed: the changelog
    is on the new line, the sink still on the old one) give None: the window of the older key would
    hold the plain ids of the snapshots the resync partition covers.

    A sink never materialised (added to the pipeline file while the line runs) does not hold the
    window back: it is named in ``joining`` and takes its own export with the next batch.
    """
    anchors: set[int] = set()
    lines: set[str | None] = set()
    joining: list[AssetKey] = []
    keys: dict[int, str] = {}
    latest: dict[AssetKey, int] = {}
    for asset_key in table_line_.asset_keys:
        records = instance.fetch_materializations(asset_key, limit=1).records
        if not records or records[0].partition_key is None:
            if asset_key in table_line_.joinable:
                joining.append(asset_key)
                continue
            return None
        anchors.add(lifecycle.snapshot_id_of(records[0].partition_key))
        keys[lifecycle.snapshot_id_of(records[0].partition_key)] = records[0].partition_key
        latest[asset_key] = lifecycle.snapshot_id_of(records[0].partition_key)
        materialization = records[0].asset_materialization
        token = materialization.metadata.get("line") if materialization else None
        text = getattr(token, "value", token)
        lines.add(str(text) if text is not None else None)
    if len(lines) > 1:
        return None
    current_line = lines.pop()
    epoch = lifecycle.line_epoch(current_line)
    windows: dict[int, list[str]] = {}
    for anchor in anchors:
        try:
            windows[anchor] = [str(sid) for sid in changelog.ancestry_ids(source_table, anchor)]
        except (SnapshotNotFoundError, ValueError):
            return None
    applied = max(windows, key=lambda anchor: len(windows[anchor]))
    window = windows[applied]
    # A resync adds "<snapshot>@resync<n>" at the table's current snapshot: the anchors or the window.
    next_resync = [f"{sid}{lifecycle.RESYNC_MARK}{epoch + 1}" for sid in [*anchors, *window]]
    if instance.get_existing_dynamic_partitions(table_line_.partitions_name, next_resync):
        return None
    return TableWindow(window, current_line, applied, tuple(joining), keys[applied], tuple(latest.items()))


def evaluate(instance: "DagsterInstance", table: TableConfig, source_table: "Table",
             config_path: str | None = None, patient: bool = True) -> tuple[list[str], NextRun | Blocked | None]:
    """New keys to add and the next run to request, for this tick (shared by the CLI's sync).
    A table that changed under the line gives ``Blocked`` with the diagnosis (no new keys).
    ``patient``: see ``line.plan`` (False for ``icecdc sync``)."""
    table_line_ = table_line(table)
    fast = evaluate_window(instance, table_line_, source_table, config_path, patient)
    if fast is not None:
        _, planned = fast
        # The window starts after applied keys, so its first key is never a bootstrap: it may need its
        # parent's rows (merge-on-read diff), and that parent may have been expired once applied.
        if isinstance(planned, NextRun) and not planned.assets:
            problem = lifecycle.pending_problem(source_table, table.table_name, planned.first_key, config_path)
            if problem is not None:
                return [], Blocked(planned.first_key, problem.message)
        return fast
    # The line does not simply follow the table: read the whole line once and diagnose it.
    known = list(instance.get_dynamic_partitions(naming.partitions_name(table)))
    problem = diagnose(instance, table, source_table, known, config_path)
    if problem is not None:
        return [], Blocked(lifecycle.active_keys(known)[-1], problem.message)
    active = lifecycle.active_keys(known)
    new_keys = discover_new_keys(source_table, active[-1] if active else None)
    return new_keys, line.plan(instance, table_line_, window=active + new_keys, config_path=config_path,
                               patient=patient)


def evaluate_window(instance: "DagsterInstance", table_line_: line.Line, source_table: "Table",
                    config_path: str | None = None,
                    patient: bool = True) -> tuple[list[str], NextRun | Blocked | None] | None:
    """:func:`evaluate` when the line follows the table (the usual tick): its cost follows the
    backlog, not the history. None when :func:`table_window` cannot tell."""
    window = table_window(instance, table_line_, source_table)
    if window is None:
        return None
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
    from icecdc_dagster.lease import retry

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
UNCHANGED_SKIP = "all snapshots are applied (table and line unchanged since the last full check)"
NOT_IDLE = "{}"  # a cursor that marks nothing (Dagster keeps the previous cursor when a result has none)


def idle_fingerprint(instance: "DagsterInstance", table: TableConfig, source_table: "Table | str") -> str:
    """What an idle line's next tick compares: the table's metadata file (every commit, rollback,
    expiry or property change writes a new one) and the line's newest partition key (a resync adds
    one). ``source_table``: the table, or its metadata location as the catalog records it (a SQL
    catalog answers that with one query, without reading the metadata file); one indexed query."""
    location = source_table if isinstance(source_table, str) else source_table.metadata_location
    sinks = ",".join(s.name for s in table.sinks)  # a sink added to the file is not idle
    return f"{location}|{line.newest_key(instance, table_line(table)) or ''}|{sinks}"


def idle_cursor(fingerprint: str, now: float | None = None) -> str:
    return json.dumps({"idle": fingerprint, "at": time.time() if now is None else now})


def still_idle(cursor: str | None, fingerprint: str, now: float | None = None) -> bool:
    """The last full check found nothing to do, nothing changed since, and it is recent.

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
    return mark.get("idle") == fingerprint and 0 <= now - at < IDLE_RECHECK_S


class ResolvedCatalog:
    """The pipeline's catalog resource with its config resolved (``EnvVar`` secrets), once per process.

    The sensor takes it from the definitions instead of declaring a resource: a tick with resources
    makes Dagster's code server build a ``DagsterInstance`` from the instance ref for that tick alone
    (see ``line.share_instance``), the largest cost of an idle tick.
    """

    def __init__(self, resource: "IcebergCatalogResource") -> None:
        self._resource = resource
        self._resolved: IcebergCatalogResource | None = None
        self._lock = threading.Lock()

    def get(self) -> "IcebergCatalogResource":
        with self._lock:
            if self._resolved is None:
                self._resolved = self._resource.process_config_and_initialize()
            return self._resolved


def build_snapshot_sensor(table: TableConfig, config_path: str | None = None,
                          catalog_resource: "IcebergCatalogResource | None" = None) -> SensorDefinition:
    """``catalog_resource``: the definitions' catalog resource (None: the sensor declares the
    ``catalog`` resource and Dagster builds it per tick)."""
    resolved = ResolvedCatalog(catalog_resource) if catalog_resource is not None else None

    @sensor(
        name=naming.sensor_name(table),
        minimum_interval_seconds=line.minimum_interval(table.polling_interval_s),
        asset_selection=asset_keys(table),
        default_status=DefaultSensorStatus.RUNNING,
        required_resource_keys=set() if resolved is not None else {"catalog"},
        description=f"Adds each new snapshot of {table.table_name} as a partition and syncs them in order.",
    )
    def _sensor(context: SensorEvaluationContext) -> SensorResult | SkipReason:
        from pyiceberg.exceptions import NoSuchTableError

        line.share_instance(context)
        catalog = resolved.get() if resolved is not None else context.resources.catalog
        if context.cursor:  # an idle mark to compare: the catalog's record first, the table only if it moved
            location = catalog.metadata_location(table.table_name)
            if location is not None and still_idle(context.cursor, idle_fingerprint(context.instance, table, location)):
                return SensorResult(skip_reason=SkipReason(UNCHANGED_SKIP), cursor=context.cursor)
        try:
            source = catalog.load_table(table.table_name)
        except NoSuchTableError:  # an ingest entry with auto_create has not created it yet
            return SkipReason(f"table {table.table_name} does not exist yet")
        fingerprint = idle_fingerprint(context.instance, table, source)
        if still_idle(context.cursor, fingerprint):
            return SensorResult(skip_reason=SkipReason(UNCHANGED_SKIP), cursor=context.cursor)
        new_keys, planned = evaluate(context.instance, table, source, config_path)
        # Nothing to do and nothing new: the next ticks skip the line's queries until the table or
        # the line changes (or IDLE_RECHECK_S pass). Any other outcome clears the mark.
        cursor = idle_cursor(fingerprint) if planned is None and not new_keys else NOT_IDLE
        partitions = naming.partitions_def(table)
        add = [partitions.build_add_request(new_keys)] if new_keys else []
        # Record the source's new state on its observable asset (data version = snapshot id).
        events = source_observations(table, catalog.name, source, new_keys)
        busy = line.held_elsewhere(context.instance, table_line(table)) if isinstance(planned, NextRun) else None
        if isinstance(planned, NextRun) and busy is None:
            return SensorResult(run_requests=[run_request(table, planned)], dynamic_partitions_requests=add,
                                asset_events=events, cursor=cursor)
        reason = busy or (planned.reason if isinstance(planned, Blocked) else "all snapshots are applied")
        return SensorResult(skip_reason=SkipReason(reason), dynamic_partitions_requests=add, asset_events=events,
                            cursor=cursor)

    return _sensor
