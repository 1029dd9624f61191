"""Apply every pending batch now, in order, through the Dagster definitions.

What the sensors and daemon do over time, done in one process with one warm
SparkSession: same ordering logic, same assets, every run and materialisation
recorded in the Dagster instance (``DAGSTER_HOME``), so the UI shows it all.
Ingest entries go first, so tables they write are synced onward in the same call.

Crash safety: each line is synced while holding its line lock (one writer per line; the loser
waits or reports the holder), its runs carry this process as their holder, and runs of a dead
worker are failed over before planning. A stop request (SIGINT/SIGTERM) abandons the batch in
flight before its commit where it can (run CANCELED) and stops before the next one.
"""

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    AssetObservation,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    Definitions,
    IntMetadataValue,
)
from dagster._core.definitions.job_base import InMemoryJob
from dagster._core.execution.api import create_execution_plan
from dagster._core.execution.execute_in_process import merge_run_tags
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.snap import snapshot_from_execution_plan
from dagster._core.utils import make_new_run_id
from pyiceberg.exceptions import NoSuchTableError

from icecdc_dagster import sync_plan
from icecdc_dagster.assets import naming
from icecdc_dagster.assets.source_table import source_observations
from icecdc_dagster.config import IngestConfig, PipelineConfig, TableConfig
from icecdc_dagster.errors import LineBusyError, SyncInterruptedError, TableHasNoSnapshotError
from icecdc_dagster.lease import failover
from icecdc_dagster.lease.holder import Holder, run_heartbeat
from icecdc_dagster.lease.line_lock import LineLock, holding
from icecdc_dagster.lease.logging_reconfiguration import skip_logging_reconfiguration_per_run
from icecdc_dagster.lease.run_thread import adopt_spark_session, interrupt_run
from icecdc_dagster.lines import line as lines
from icecdc_dagster.lines.window import diagnose
from icecdc_dagster.progress import SyncProgress
from icecdc_dagster.resources.keys import CATALOG_KEY
from icecdc_dagster.resources.resolved import resolved_resource
from icecdc_dagster.run_tags import LAUNCHED_BY_TAG, WORKER_HEARTBEAT_TAG
from icecdc_dagster.sensors import ingest_sensor, snapshots
from icecdc_dagster.steps import lifecycle
from icecdc_dagster.steps.ordering import Blocked, NextRun

if TYPE_CHECKING:
    from types import FrameType

    from dagster import JobDefinition
    from dagster._core.storage.dagster_run import DagsterRun
    from pyiceberg.table import Table

JOIN_POLL_S = 0.2


class StopRequest:
    """SIGINT/SIGTERM during a sync. The handler only records the signal: the sync stops before
    its next batch, and the batch in flight is canceled by the main thread (``execute_run``). A
    second signal exits at once; the run left behind is failed over by the next sync."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "-"

    def request(self, signum: int, _frame: "FrameType | None" = None) -> None:
        if self.signum is not None:
            os._exit(128 + self.signum)
        self.signum = signum

    @contextmanager
    def installed(self) -> Iterator["StopRequest"]:
        """Handle SIGINT and SIGTERM for the block (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self.request) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


@dataclass(frozen=True)
class FailedCheck:
    """A check a batch run of this sync evaluated as failed: which asset, which check, at which snapshot."""
    asset: str
    check: str
    snapshot: str

    def render(self) -> str:
        return f"{self.asset} {self.check} at snapshot {self.snapshot}"


@dataclass
class TableSyncReport:
    table_name: str  # a table name, or "ingest:<name>" for an ingest entry
    runs: list[tuple[str, str, bool]] = field(default_factory=list)  # (first, last, success)
    blocked: str | None = None      # the line waits for an operator (or its batch failed again)
    busy: str | None = None         # another writer holds the line
    stopped: str | None = None      # where a stop request (SIGINT/SIGTERM) left the line
    waiting: str | None = None      # a transient failure's backoff: the line retries by itself later
    failed_over: list[str] = field(default_factory=list)  # runs of dead workers failed over first
    # Checks whose latest evaluation in this sync failed (a later passing evaluation clears a check).
    failed_checks: list[FailedCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.blocked is None and self.busy is None and self.stopped is None and self.waiting is None
                and all(success for *_, success in self.runs))

    def render(self) -> str:
        done = sum(1 for *_, ok in self.runs if ok)
        head = f"{self.table_name}: {done}/{len(self.runs)} runs succeeded; "
        if self.stopped:
            return head + f"STOPPED: {self.stopped}"
        if self.busy:
            return head + f"BUSY: {self.busy}"
        if self.waiting:
            return head + f"WAITING: {self.waiting}"
        if not self.ok:
            return head + f"BLOCKED: {self.blocked or 'a run failed'}" + self.render_checks("; ")
        return head + (self.render_checks("") or "ok")

    def render_checks(self, separator: str) -> str:
        """Every failed check, or nothing: a line whose batches applied but whose data check failed is not ok."""
        if not self.failed_checks:
            return ""
        return f"{separator}CHECKS FAILED: " + "; ".join(check.render() for check in self.failed_checks)

    def record_checks(self, instance: DagsterInstance, run_id: str, batch: str) -> None:
        """The check evaluations of run ``run_id`` (of ``batch``, the snapshot a check's metadata does not
        name): a failed one is added, a passed one clears that check's earlier failures of this sync."""
        records = instance.get_records_for_run(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION).records
        for record in records:
            event = record.event_log_entry.dagster_event
            evaluation = event.event_specific_data if event is not None else None
            if not isinstance(evaluation, AssetCheckEvaluation):
                continue
            asset, check = evaluation.asset_key.to_user_string(), evaluation.check_name
            self.failed_checks = [c for c in self.failed_checks if (c.asset, c.check) != (asset, check)
                                  or not evaluation.passed]
            if not evaluation.passed:
                snapshot = getattr(evaluation.metadata.get("snapshot_id"), "value", None) or batch
                self.failed_checks.append(FailedCheck(asset, check, str(snapshot)))


@dataclass
class SyncContext:
    defs: Definitions
    instance: DagsterInstance
    holder: Holder
    retry_failed: bool = False
    wait: bool = False
    stop: StopRequest = field(default_factory=StopRequest)
    say: Callable[[str], None] = lambda message: None
    log_level: str = "INFO"  # of the runs' console log: one line per step at INFO; DEBUG adds Dagster's events
    config_path: str | None = None  # named in recovery commands (icecdc resync --config ...)
    # The CLI's progress display: every line's plan first, then each line's batches as they run.
    progress: SyncProgress | None = None
    batches_run: int = 0  # in this sync so far (a line planned at the start may have more pending since)


@dataclass(frozen=True)
class LineDisplay:
    """What the progress display asks of a line (``sync_plan``): its pending keys, a batch's state and records."""
    plan: Callable[[], "sync_plan.LinePlan"]
    batch: Callable[[NextRun], tuple[str, int | None]]


def show_plan(progress: SyncProgress, line_id: str, view: LineDisplay) -> None:
    """The line's pending count from its plan; a display never fails the sync (unknown: "?")."""
    try:
        plan = view.plan()
    except Exception:  # noqa: BLE001 - the sync reports the line's real problem when it runs it
        progress.planned(line_id, None)
        return
    progress.planned(line_id, plan.pending_keys, plan.per_batch, plan.export_first, plan.state)


def outcome(report: "TableSyncReport") -> str:
    """A finished line's state in the display (the report says why)."""
    for state, reason in (("stopped", report.stopped), ("busy", report.busy), ("waiting out a retry backoff",
                                                                               report.waiting)):
        if reason:
            return state
    return "done" if report.ok else "blocked"


def console_log_config(level: str) -> dict[str, Any]:
    """Run config for Dagster's console logger at ``level`` (the event log keeps everything)."""
    return {"loggers": {"console": {"config": {"log_level": level.upper()}}}}


def execute_run(context: SyncContext, line: lines.Line, planned: NextRun) -> tuple[str, DagsterRunStatus | None]:
    """Execute one batch in a worker thread, this process recorded as its holder. The main thread
    waits and, on a stop request, cancels the run (it ends CANCELED)."""
    instance = context.instance
    request = lines.run_request(line, planned)
    assets, checks = lines.run_selection(line, planned)
    run_id = make_new_run_id()
    tags = {**request.tags, **context.holder.tags(), WORKER_HEARTBEAT_TAG: f"{time.time():.3f}",
            LAUNCHED_BY_TAG: context.holder.role}
    errors: list[BaseException] = []

    def target() -> None:
        try:
            adopt_spark_session()
            job, run = create_selected_run(instance, context.defs, run_id, tags, request.partition_key,
                                           console_log_config(context.log_level), assets, checks)
            execute_in_process_run(job, run, instance)
        except BaseException as exc:  # noqa: BLE001 - recorded on the run below
            errors.append(exc)

    worker = threading.Thread(target=target, name="icecdc-sync-run", daemon=True)
    canceling = False
    with run_heartbeat(instance, run_id):
        worker.start()
        while worker.is_alive():
            worker.join(JOIN_POLL_S)
            if context.stop.requested and not canceling and worker.is_alive():
                canceling = interrupt_run(instance, run_id, worker,
                                          f"icecdc sync received {context.stop.name}: the batch is abandoned")
    return run_id, _finish(instance, run_id, errors)


def create_selected_run(instance: DagsterInstance, defs: Definitions, run_id: str, tags: Mapping[str, str],
                        partition_key: str | None, run_config: Mapping[str, Any], assets: Sequence[AssetKey],
                        checks: Sequence[AssetCheckKey] | None) -> tuple["JobDefinition", "DagsterRun"]:
    """The run of a batch as the daemon creates a sensor's: its asset (and check) selection recorded,
    so the runs page's Target column names the line's assets (``execute_in_process`` on a subset
    records none, and given a selection it would run every check of the assets). Returns the job to
    execute it with: the implicit asset job with ``execute_in_process``'s executor (the sync holds
    the line's lock itself)."""
    job = defs.resolve_implicit_global_asset_job_def().as_ephemeral_job(resource_defs={}, input_values={})
    check_selection = frozenset(checks) if checks is not None else None
    subset = job.get_subset(asset_selection=set(assets), asset_check_selection=check_selection)
    merged = merge_run_tags(job_def=subset, partition_key=partition_key, tags=tags, asset_selection=list(assets),
                            instance=instance, run_config=run_config)
    plan = create_execution_plan(subset, run_config=run_config, tags=merged,
                                 instance_ref=instance.get_ref() if instance.is_persistent else None)
    run = instance.create_run(
        job_name=subset.name, run_id=run_id, run_config=run_config, status=DagsterRunStatus.NOT_STARTED,
        tags=merged, root_run_id=None, parent_run_id=None, step_keys_to_execute=plan.step_keys_to_execute,
        execution_plan_snapshot=snapshot_from_execution_plan(plan, subset.get_job_snapshot_id()),
        job_snapshot=subset.get_job_snapshot(), parent_job_snapshot=subset.get_parent_job_snapshot(),
        asset_selection=frozenset(assets), asset_check_selection=check_selection, resolved_op_selection=None,
        op_selection=None, remote_job_origin=remote_origin(subset.name), job_code_origin=None,
        asset_graph=subset.asset_layer.asset_graph)
    return job, run


# The code location a run made in process names: the one ``dagster dev -m icecdc_dagster.definitions`` (and the
# demo's workspace) loads. The UI's Overview -> Timeline draws only runs with a repository origin (a run without
# one is dropped: ``useRunsForTimeline``), grouped by location and job; under another location name the runs
# still show, in a row of their own.
CODE_LOCATION = "icecdc_dagster.definitions"
REPOSITORY = "__repository__"  # a Definitions object's repository (dagster's SINGLETON_REPOSITORY_NAME)


def remote_origin(job_name: str) -> RemoteJobOrigin:
    """Where the UI files a run made in process: :data:`CODE_LOCATION`'s repository, by name only (nothing
    loads code from it: the run has no code origin, so no launcher or monitor re-launches it)."""
    location = RegisteredCodeLocationOrigin(CODE_LOCATION)
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, REPOSITORY), job_name)


def execute_in_process_run(job: "JobDefinition", run: "DagsterRun", instance: DagsterInstance) -> None:
    """Execute a run made by :func:`create_selected_run` in this thread (Dagster subsets ``job`` by
    the run's selection)."""
    from dagster._core.execution.api import execute_run  # a name clash: this module's own execute_run

    skip_logging_reconfiguration_per_run(instance)  # another run in this process may be logging meanwhile
    execute_run(InMemoryJob(job), run, instance, raise_on_error=False)


def _finish(instance: DagsterInstance, run_id: str, errors: list[BaseException]) -> DagsterRunStatus | None:
    """Every run this sync started ends final, also when the framework raised."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        if errors:
            raise errors[0]
        return None
    if not run.is_finished:
        if run.status == DagsterRunStatus.CANCELING:
            instance.report_run_canceled(run, "icecdc sync: stopped")
        else:
            instance.report_run_failed(run, f"icecdc sync: the run ended without a final status: {errors[:1]}")
        run = instance.get_run_by_id(run_id)
    return run.status if run is not None else None


def _drain(context: SyncContext, line: lines.Line, evaluate: Callable[[], tuple[list[str], NextRun | Blocked | None]],
           max_runs: int, report: TableSyncReport, view: LineDisplay | None = None) -> str | None:
    """Run the line's batches in order while holding its lock. Returns the id of a live run of
    another worker that keeps the line busy (to wait for), else None."""
    instance = context.instance
    retried: set[str] = set()
    for _ in range(max_runs):
        if context.stop.requested:
            report.stopped = f"{context.stop.name} received before the next batch; the next sync continues here"
            return None
        report.failed_over += [f.message for f in failover.fail_dead_runs(instance, line.line_id, context.holder)]
        new_keys, planned = evaluate()
        if new_keys:
            instance.add_dynamic_partitions(line.partitions_name, new_keys)
        if isinstance(planned, Blocked) and planned.failed and context.retry_failed and planned.key not in retried:
            # The operator's re-execution, once per sync: the line continues only if it succeeds.
            retried.add(planned.key)
            planned = NextRun(planned.key, planned.key, (planned.key,), attempt=0, assets=planned.assets)
        if isinstance(planned, Blocked):
            running = lines.active_run(instance, line)
            if running is not None:  # a live worker (e.g. a daemon run waiting for this lock)
                report.busy = planned.reason
                return running.run_id
            if planned.retry_at is not None:  # transient: the line is not stopped, it retries after the backoff
                report.waiting = planned.reason
                return None
            report.blocked = planned.reason
            return None
        if planned is None:
            return None
        if report.runs and not report.runs[-1][2] and report.runs[-1][0] == planned.first_key:
            report.blocked = f"{planned.first_key} failed again; see the run's logs"
            return None
        show_batch(context, line, planned, view)
        run_id, status = execute_run(context, line, planned)
        report.runs.append((planned.first_key, planned.last_key, status == DagsterRunStatus.SUCCESS))
        report.record_checks(instance, run_id, planned.last_key)
        context.batches_run += 1
        if context.progress is not None:
            events = run_events(instance, run_id)
            context.progress.batch_finished(line.line_id, status == DagsterRunStatus.SUCCESS, events)
        if context.stop.requested and status != DagsterRunStatus.SUCCESS:
            applied = next((last for _, last, ok in reversed(report.runs) if ok), None)
            report.stopped = (f"{context.stop.name} received: batch {planned.first_key}..{planned.last_key} abandoned "
                              f"(run {run_id} {status.value if status else 'not created'}); applied through "
                              f"{applied or 'the previous sync'}; the next sync continues at {planned.first_key}")
            return None
    return None


def run_events(instance: DagsterInstance, run_id: str) -> int | None:
    """The change events a run's batch applied, as its materialisations count them (a changelog's or a
    sink's ``rows``, an ingest's ``events_read``); None when none says (a failed run). For the display only:
    never raises."""
    try:
        records = instance.get_records_for_run(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records
    except Exception:  # noqa: BLE001 - the display never fails the sync
        return None
    counts = [int(value.value or 0) for record in records if (m := record.asset_materialization) is not None
              for key in ("rows", "events_read") if isinstance(value := m.metadata.get(key), IntMetadataValue)]
    return max(counts, default=None)


def show_batch(context: SyncContext, line: lines.Line, planned: NextRun, view: LineDisplay | None) -> None:
    """The batch about to run, in the display: its state and the records its plan knows."""
    if context.progress is None:
        return
    batch = planned.first_key if planned.first_key == planned.last_key else f"{planned.first_key}..{planned.last_key}"
    try:
        state, records = view.batch(planned) if view is not None else (f"batch {batch}", None)
    except Exception:  # noqa: BLE001 - metadata for the display only
        state, records = f"batch {batch}", None
    context.progress.batch_started(line.line_id, batch, state, len(planned.keys), records)


def _sync_line(context: SyncContext, line: lines.Line,
               evaluate: Callable[[], tuple[list[str], NextRun | Blocked | None]], max_runs: int,
               view: LineDisplay | None = None) -> TableSyncReport:
    if context.progress is None:
        return _sync_line_locked(context, line, evaluate, max_runs, view)
    if view is not None and context.batches_run:  # earlier lines wrote: an ingest target has new snapshots
        show_plan(context.progress, line.line_id, view)
    context.progress.line_started(line.line_id)
    report = _sync_line_locked(context, line, evaluate, max_runs, view)
    context.progress.line_finished(line.line_id, outcome(report), drained=report.ok)
    return report


def _sync_line_locked(context: SyncContext, line: lines.Line,
                      evaluate: Callable[[], tuple[list[str], NextRun | Blocked | None]], max_runs: int,
                      view: LineDisplay | None) -> TableSyncReport:
    report = TableSyncReport(line.line_id)
    if context.stop.requested:
        report.stopped = f"{context.stop.name} received before this line started; nothing applied"
        return report
    lock = LineLock.for_instance(context.instance, line.line_id)
    while True:
        try:
            with holding(lock, context.holder, wait=context.wait, on_wait=context.say,
                         stop_requested=lambda: context.stop.requested):
                busy_run = _drain(context, line, evaluate, max_runs, report, view)
        except LineBusyError as busy:
            report.busy = str(busy)
            return report
        except SyncInterruptedError as stopped:
            report.stopped = str(stopped)
            return report
        if busy_run is None or not context.wait:
            return report
        context.say(f"waiting: {report.busy}")
        report.busy = None
        lines.wait_for_run_end(context.instance, busy_run, stop_requested=lambda: context.stop.requested)


def _context(defs: Definitions, instance: DagsterInstance, retry_failed: bool = False,
             context: SyncContext | None = None) -> SyncContext:
    if context is not None:
        return context
    return SyncContext(defs=defs, instance=instance, holder=Holder.current(), retry_failed=retry_failed)


def sync_table(defs: Definitions, instance: DagsterInstance, table: TableConfig, max_runs: int = 1000,
               retry_failed: bool = False, context: SyncContext | None = None) -> TableSyncReport:
    catalog = resolved_resource(defs, CATALOG_KEY)
    context = _context(defs, instance, retry_failed, context)
    loaded: dict[str, Table] = {}  # the source as the latest evaluation read it (the display's summaries)

    def evaluate() -> tuple[list[str], NextRun | Blocked | None]:
        try:
            source = loaded["source"] = catalog.load_table(table.table_name)
        except NoSuchTableError:  # written by an auto-creating ingest entry that has not run yet
            return [], None
        # An operator's sync re-executes a batch whose worker died at once, however often it did.
        new_keys, planned = snapshots.evaluate(instance, table, source, context.config_path, patient=False)
        # As the sensor does: each new partition observed with its snapshot id as data version.
        for observation in source_observations(table, catalog.name, source, new_keys):
            instance.report_runless_asset_event(observation)
        return new_keys, planned

    return _sync_line(context, naming.table_line(table), evaluate, max_runs, table_view(context, table, loaded))


def table_view(context: SyncContext, table: TableConfig, loaded: "dict[str, Table] | None" = None) -> LineDisplay:
    """The display's view of a table line; ``loaded``: where the line's evaluation leaves the source it read."""
    catalog, table_line = resolved_resource(context.defs, CATALOG_KEY), naming.table_line(table)
    read = loaded if loaded is not None else {}
    return LineDisplay(lambda: sync_plan.table_plan(context.instance, table, catalog, context.config_path),
                    lambda planned: sync_plan.table_batch(context.instance, table_line, planned, read.get("source")))


def ingest_view(context: SyncContext, entry: IngestConfig) -> LineDisplay:
    return LineDisplay(lambda: sync_plan.ingest_plan(context.instance, entry),
                    lambda planned: sync_plan.ingest_batch(entry, planned))


def sync_ingest(defs: Definitions, instance: DagsterInstance, entry: IngestConfig,
                max_runs: int = 1000, retry_failed: bool = False,
                context: SyncContext | None = None) -> TableSyncReport:
    context = _context(defs, instance, retry_failed, context)
    return _sync_line(context, ingest_sensor.ingest_line(entry),
                      lambda: ingest_sensor.evaluate(instance, entry, patient=False), max_runs,
                      ingest_view(context, entry))


def sync_all(config: PipelineConfig, defs: Definitions, instance: DagsterInstance,
             retry_failed: bool = False, context: SyncContext | None = None) -> list[TableSyncReport]:
    """Every line is synced independently: one blocked or busy line does not stop the others.
    ``retry_failed``: re-execute (once) a batch that used up its retries, as an operator would."""
    context = _context(defs, instance, retry_failed, context)
    if context.config_path is None:
        context.config_path = config.source
    if context.progress is not None:  # every line shows from the start, with what its plan has pending
        for entry in config.ingest:
            show_plan(context.progress, ingest_sensor.ingest_line(entry).line_id, ingest_view(context, entry))
        for table in config.tables:
            show_plan(context.progress, table.table_name, table_view(context, table))
    return ([sync_ingest(defs, instance, entry, context=context) for entry in config.ingest]
            + [sync_table(defs, instance, table, context=context) for table in config.tables])




@dataclass
class ResyncReport:
    table_name: str
    key: str                    # the new bootstrap partition
    snapshot_id: int
    superseded: int             # partitions of the old line (kept for lineage, never applied again)
    diagnosis: str | None       # why the old line could not continue (None: it could; resynced anyway)
    sync: TableSyncReport

    def render(self) -> str:
        why = self.diagnosis or "the line could continue; re-bootstrapped on request"
        return (f"{self.table_name}: resync: {why}\n"
                f"{self.table_name}: new bootstrap partition {self.key} at snapshot {self.snapshot_id} "
                f"(full export into every sink); {self.superseded} earlier partitions superseded\n"
                + self.sync.render())


def resync_table(config: PipelineConfig, defs: Definitions, instance: DagsterInstance, table_name: str,
                 context: SyncContext | None = None) -> ResyncReport:
    """Re-bootstrap a table's line: a new bootstrap partition ``<current snapshot>@resync<n>`` whose export
    converges every sink (OpenSearch: index, then delete documents the export lacks; replica: one
    overwrite), then the usual sync. Earlier partitions stay (lineage) but are superseded. The partition
    is added under the line's lock, with no run of the line in flight, so no old batch can interleave."""
    table = config.table(table_name)
    context = _context(defs, instance, False, context)
    if context.config_path is None:
        context.config_path = config.source
    source = resolved_resource(defs, CATALOG_KEY).load_table(table.table_name)
    current = source.current_snapshot()
    if current is None:
        raise TableHasNoSnapshotError(f"{table.table_name} has no snapshot yet: nothing to re-bootstrap from; "
                                      f"commit to it, then run icecdc sync")
    line = naming.table_line(table)
    with holding(LineLock.for_instance(instance, line.line_id), context.holder, wait=context.wait,
                 on_wait=context.say, stop_requested=lambda: context.stop.requested):
        failover.fail_dead_runs(instance, line.line_id, context.holder)
        running = lines.active_run(instance, line)
        if running is not None:
            raise LineBusyError(f"{table.table_name}: {lines.describe_run(running)} is in flight; resync when it "
                                f"has ended")
        known = list(instance.get_dynamic_partitions(line.partitions_name))
        problem = diagnose(instance, line, source, known, context.config_path)
        key = lifecycle.resync_key(current.snapshot_id, known)
        instance.add_dynamic_partitions(line.partitions_name, [key])
        for observation in source_observations(table, resolved_resource(defs, CATALOG_KEY).name, source, [key]):
            instance.report_runless_asset_event(observation)
        superseded = lifecycle.superseded_keys([*known, key])
        instance.report_runless_asset_event(AssetObservation(
            asset_key=naming.changelog_key(table),
            metadata={"resync_bootstrap": key, "resync_snapshot_id": str(current.snapshot_id),
                      "superseded_partitions": len(superseded),
                      "superseded_range": f"{superseded[0]}..{superseded[-1]}" if superseded else "none",
                      "reason": problem.message if problem else "requested",
                      "table_uuid": lifecycle.table_uuid(source)}))
    report = sync_table(defs, instance, table, context=context)
    return ResyncReport(table.table_name, key, current.snapshot_id, len(superseded),
                        problem.message if problem else None, report)


__all__ = ["FailedCheck", "NextRun", "ResyncReport", "StopRequest", "SyncContext", "TableSyncReport", "resync_table",
           "sync_all", "sync_ingest", "sync_table"]
