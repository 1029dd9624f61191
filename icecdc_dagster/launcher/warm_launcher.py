"""``WarmRunLauncher``: runs execute in long-lived worker threads ("lanes") of the process that launches
them (the daemon), sharing one warm SparkSession instead of a cold JVM per run.

``launch_run`` queues the run; a lane executes it with ``core_execute_run`` (Dagster's run worker's
code path) and always leaves it SUCCESS, FAILURE or CANCELED. Operator's manual (enabling, sizing,
guarantees, trade-offs): docs/warm-launcher.md.
"""

import logging
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dagster import DagsterRunStatus, Field, IntSource, RunsFilter, StringSource
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._core.events import EngineEventData
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
from dagster._core.storage.dagster_run import DagsterRun
from dagster._grpc.impl import core_execute_run
from dagster._serdes import ConfigurableClass
from dagster._serdes.config_class import ConfigurableClassData
from dagster._utils.error import serializable_error_info_from_exc_info
from dagster._utils.hosted_user_process import recon_job_from_origin

from icecdc_dagster import run_tags
from icecdc_dagster.launcher.definitions_cache import warm_recon_job
from icecdc_dagster.launcher.lane_logs import route_lane_compute_logs
from icecdc_dagster.launcher.monitored_launcher import MonitoredRunLauncher
from icecdc_dagster.launcher.run_profile import RunProfile
from icecdc_dagster.launcher.sqlite_tuning import check_sqlite_synchronous, set_sqlite_synchronous
from icecdc_dagster.launcher.worker_health import new_session, worker_alive
from icecdc_dagster.lease import failover
from icecdc_dagster.lease.executor import JOB_PREFIX, WARM_WORKER_THREAD
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.instance_connections import keep_connections_open
from icecdc_dagster.lease.logging_reconfiguration import skip_logging_reconfiguration_per_run
from icecdc_dagster.lease.run_thread import adopt_spark_session, cancel_spark_jobs, raise_in_thread, tag_spark_thread
from icecdc_dagster.run_tags import FAILED_OVER_TAG, LAUNCHER_HOST_TAG, LAUNCHER_PID_TAG, LAUNCHER_SESSION_TAG

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from dagster_shared.error import SerializableErrorInfo


CANCEL_POLL_S = 1.0
DAEMON_THREADS = 2  # besides the lanes, the daemon's threads that call the instance at once (sensor, queue)
_IN_FLIGHT = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
_log = logging.getLogger(__name__)


# A lane waits on the JVM for about half its time (py-spy: py4j socket reads), ~1,000 py4j round trips
# per batch; each return has to take the GIL back from the other lanes and the sensor threads, and
# with Python's 5 ms switch interval that wait is up to 5 ms per round trip. 1 ms: 20 tables x 3 lanes,
# p95 31.1 -> 29.5 s, p50 20.0 -> 17.7 s, CPU per run 2.17 -> 2.00 CPU-s (bench/freshness.py, one run each).
DEFAULT_SWITCH_INTERVAL_MS = 1.0


OWN_CODE_LOCATION = "icecdc_dagster.definitions"  # `dagster dev -m icecdc_dagster.definitions`: all ours


def is_ours(run: DagsterRun) -> bool:
    """A run of our lines or jobs: a sensor's or sync's line run (``icecdc/table``), a run of our jobs
    (``icecdc__*``: maintenance), any run of our own code location, or one a warm launcher already took.
    The rest - a user's own jobs, dbt models, a materialisation they launch from the asset graph of their
    project - is theirs: it gets Dagster's default launcher (a new process per run, their executor), never
    a lane of this daemon."""
    if run_tags.line_of(run.tags) is not None or run.job_name.startswith(JOB_PREFIX):
        return True
    if run_tags.read(run.tags, LAUNCHER_PID_TAG) is not None:  # a warm launcher took it (its health is ours)
        return True
    origin = run.job_code_origin
    pointer = origin.repository_origin.code_pointer if origin is not None else None
    return getattr(pointer, "module", None) == OWN_CODE_LOCATION


class WarmRunLauncher(RunLauncher, ConfigurableClass):
    """Runs execute in ``workers`` lanes of this process (docs/warm-launcher.md).

    Raises:
        ValueError: ``workers`` below 1, or ``sqlite_synchronous`` none of ``SQLITE_SYNCHRONOUS``.
    """

    def __init__(self, inst_data: ConfigurableClassData | None = None, workers: int = 1,
                 sqlite_synchronous: str | None = None,
                 switch_interval_ms: float = DEFAULT_SWITCH_INTERVAL_MS) -> None:
        if workers < 1:
            raise ValueError(f"WarmRunLauncher: workers must be at least 1, got {workers}")
        if sqlite_synchronous is not None:
            check_sqlite_synchronous(sqlite_synchronous)
        self._inst_data = inst_data
        self._workers_wanted = workers
        self._sqlite_synchronous = sqlite_synchronous
        self._switch_interval_ms = switch_interval_ms
        self._queue: queue.Queue[Any] = queue.Queue()
        self._workers: list[threading.Thread] = []
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending: set[str] = set()  # accepted, not yet picked up by a worker
        self._current: dict[str, threading.Thread] = {}  # executing now -> the worker thread
        self._spark_groups: set[str] = set()  # running runs whose Spark jobs carry their job group
        self._process_launcher: MonitoredRunLauncher | None = None  # for the runs that are not ours
        self._prepared = False  # the instance keeps its connections and routes compute logs (from the first launch on)
        self._idle = threading.Condition(self._lock)
        self._session = new_session()
        self._host = socket.gethostname()
        self._pid = os.getpid()
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @property
    def workers(self) -> int:
        return self._workers_wanted

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {"workers": Field(IntSource, is_required=False, default_value=1,
                                 description="Runs executing at once (lanes sharing the SparkSession)."),
                "sqlite_synchronous": Field(StringSource, is_required=False,
                                            description="PRAGMA synchronous for the instance's SQLite "
                                                        "storage in this process (OFF, NORMAL, FULL, EXTRA); "
                                                        "unset: SQLite's default. See docs/warm-launcher.md."),
                "switch_interval_ms": Field(float, is_required=False, default_value=DEFAULT_SWITCH_INTERVAL_MS,
                                            description="With workers > 1: the daemon process's GIL switch "
                                                        "interval (Python's default 5 ms; 0: leave it). "
                                                        "See docs/warm-launcher.md.")}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> "WarmRunLauncher":
        return cls(inst_data=inst_data, workers=int(config_value.get("workers", 1)),
                   sqlite_synchronous=config_value.get("sqlite_synchronous"),
                   switch_interval_ms=float(config_value.get("switch_interval_ms", DEFAULT_SWITCH_INTERVAL_MS)))

    def register_instance(self, instance: "DagsterInstance") -> None:
        super().register_instance(instance)
        skip_logging_reconfiguration_per_run(instance)
        if self._sqlite_synchronous is not None:
            set_sqlite_synchronous(instance, self._sqlite_synchronous)
        try:
            self.fail_orphaned_runs()
        except Exception:  # noqa: BLE001 - never break instance loading; monitoring retries later
            _log.exception("icecdc warm launcher: checking for orphaned runs failed")

    # -- launching ---------------------------------------------------------------------------

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        if not is_ours(run):  # a user's own run: as if this launcher were not there
            self._processes().launch_run(context)
            return
        if run.job_code_origin is None:
            raise ValueError(f"run {run.run_id} has no job code origin; the warm launcher cannot load its job")
        instance = self._instance
        with self._lock:
            if not self._prepared:  # here, not at registration: the webserver registers launchers too
                keep_connections_open(instance, threads=self._workers_wanted + DAEMON_THREADS)
                self._route_compute_logs(instance)
                self._prepared = True
        instance.add_run_tags(run.run_id, {LAUNCHER_HOST_TAG: self._host, LAUNCHER_PID_TAG: str(self._pid),
                                           LAUNCHER_SESSION_TAG: self._session,
                                           **Holder.current(role="warm launcher (daemon)").tags()})
        with self._lock:
            self._pending.add(run.run_id)
            self._workers = [w for w in self._workers if w.is_alive()]
            while len(self._workers) < self._workers_wanted:
                if self._workers_wanted > 1 and self._switch_interval_ms:  # once, as the lanes start
                    sys.setswitchinterval(self._switch_interval_ms / 1000)
                worker = threading.Thread(target=self._work, name=f"{WARM_WORKER_THREAD}-{len(self._workers)}",
                                          daemon=True)
                worker.start()
                self._workers.append(worker)
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._watch_cancellation, name="icecdc-warm-cancel",
                                                 daemon=True)
                self._watcher.start()
        self._queue.put(run.run_id)

    @staticmethod
    def _route_compute_logs(instance: "DagsterInstance") -> None:
        if not route_lane_compute_logs(instance):
            _log.warning("icecdc warm launcher: the instance's compute log manager (%s) captures by process; "
                         "the compute logs of runs in concurrent lanes can mix (docs/warm-launcher.md)",
                         type(instance.compute_log_manager).__name__)

    def _work(self) -> None:
        while True:
            try:
                run_id = self._queue.get()
                with self._lock:
                    if run_id not in self._pending:  # terminated while waiting
                        continue
                    self._pending.discard(run_id)
                    self._current[run_id] = threading.current_thread()
                try:
                    self._execute(run_id)
                finally:
                    with self._lock:
                        self._current.pop(run_id, None)
                        self._spark_groups.discard(run_id)
                        self._idle.notify_all()
            except BaseException:  # noqa: BLE001 - incl. a late interrupt: the worker must go on
                _log.exception("icecdc warm launcher: worker error")

    def _watch_cancellation(self) -> None:
        """Like the run worker's cancellation thread: a run marked CANCELING (by ``terminate`` in
        any process, e.g. the webserver) is interrupted here, in the process that executes it.

        One query per poll for all the lanes, of run ids only: reading each running run
        (``get_run_by_id``) cost a query per lane per second, each with a schema inspection of the
        runs table (Dagster's run records), 3.5 % of a busy daemon's CPU (py-spy, 20 tables, 3 lanes)."""
        interrupted: set[str] = set()
        while True:
            time.sleep(CANCEL_POLL_S)
            with self._lock:
                running = dict(self._current)
            interrupted &= set(running)
            watched = set(running) - interrupted
            if not watched or not self.has_instance:
                continue
            try:
                canceling = self._instance.get_run_ids(RunsFilter(run_ids=sorted(watched),
                                                                  statuses=[DagsterRunStatus.CANCELING]))
            except Exception:  # noqa: BLE001 - storage hiccup: try again next poll
                continue
            for run_id in canceling:
                interrupted.add(run_id)
                # Only this run's Spark jobs when they carry its job group (other lanes go on).
                cancel_spark_jobs(run_id if run_id in self._spark_groups else None)
                with self._lock:
                    if self._current.get(run_id) is running[run_id]:
                        raise_in_thread(running[run_id], DagsterExecutionInterruptedError)

    def _execute(self, run_id: str) -> None:
        instance = self._instance
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return
        if run.status == DagsterRunStatus.CANCELING:
            instance.report_run_canceled(run, "terminated before it started")
            return
        profile = RunProfile.start(run_id)
        try:
            adopt_spark_session()
            if tag_spark_thread(run_id):
                with self._lock:
                    self._spark_groups.add(run_id)
            instance.report_engine_event(
                f"Executing in the warm launcher's worker thread (pid: {self._pid}).", run,
                EngineEventData.in_process(self._pid))
            assert run.job_code_origin is not None  # checked in launch_run
            recon_job = warm_recon_job(recon_job_from_origin(run.job_code_origin))
            for _ in core_execute_run(recon_job, run, instance, inject_env_vars=True):
                pass
        except BaseException:  # noqa: BLE001 - reported below; never leave the run in flight
            error = serializable_error_info_from_exc_info(sys.exc_info())
            self._finish_unfinished(run_id, error)
            return
        finally:
            if profile is not None:
                profile.finish()
        self._finish_unfinished(run_id, None)

    def _finish_unfinished(self, run_id: str, error: "SerializableErrorInfo | None") -> None:
        instance = self._instance
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return
        if run.status == DagsterRunStatus.CANCELING:
            instance.report_run_canceled(run, "terminated")
            return
        message = "icecdc warm launcher: the run ended without a final status"
        if error is not None:
            instance.report_engine_event(f"{message}: {error.message}", run, EngineEventData.engine_error(error))
        instance.report_run_failed(run, message)

    # -- termination -------------------------------------------------------------------------

    def _processes(self) -> MonitoredRunLauncher:
        """Dagster's default launcher (a new process per run), for the runs that are not ours."""
        with self._lock:
            if self._process_launcher is None:
                self._process_launcher = MonitoredRunLauncher()
                self._process_launcher.register_instance(self._instance)
            return self._process_launcher

    def terminate(self, run_id: str) -> bool:
        """Mark the run CANCELING; the process executing it interrupts it (see the watcher).
        Called in the webserver (UI) as often as in the daemon, so nothing here assumes the run
        is executing in this process. A run still waiting on this process's queue ends CANCELED
        at once; one waiting in another process's queue when that worker picks it up."""
        instance = self._instance
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        if not is_ours(run):
            return self._processes().terminate(run_id)
        with self._lock:
            waiting = run_id in self._pending
            self._pending.discard(run_id)
        if waiting:
            instance.report_run_canceled(run, "terminated before it started")
            self._notify_idle()
            return True
        instance.report_run_canceling(run)
        return True

    def _notify_idle(self) -> None:
        with self._lock:
            self._idle.notify_all()

    # -- monitoring --------------------------------------------------------------------------

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        if not is_ours(run):
            return self._processes().check_run_worker_health(run)
        with self._lock:
            if run.run_id in self._current or run.run_id in self._pending:
                return CheckRunHealthResult(WorkerStatus.RUNNING)
        if run_tags.read(run.tags, LAUNCHER_SESSION_TAG) == self._session:
            # Launched here but no longer queued or executing: the worker lost it.
            return CheckRunHealthResult(WorkerStatus.FAILED, "the warm launcher's worker no longer runs it")
        if worker_alive(run):
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(WorkerStatus.FAILED, "the process that ran it is gone")

    def fail_orphaned_runs(self) -> list[str]:
        """Fail the in-flight runs this launcher started in a process of this host that is gone."""
        instance = self._instance
        failed = []
        for record in instance.get_run_records(RunsFilter(statuses=_IN_FLIGHT)):
            run = record.dagster_run
            launcher_pid = run_tags.read(run.tags, LAUNCHER_PID_TAG)
            if launcher_pid is None or run_tags.read(run.tags, LAUNCHER_SESSION_TAG) == self._session \
                    or worker_alive(run):
                continue
            holder = Holder.from_tags(run.tags)
            if holder is not None:  # the detailed reason (pid gone / reused / rebooted), as a sync gives it
                if failover.fail_over(instance, run, Holder.current(role="warm launcher (daemon)")):
                    failed.append(run.run_id)
                continue
            # A dead process, not a failed batch: tagged so it never spends the batch's max_retries.
            gone = f"worker died: pid {launcher_pid} is gone"
            instance.add_run_tags(run.run_id, {FAILED_OVER_TAG: gone})
            instance.report_run_failed(
                run, f"icecdc warm launcher: the process that ran it (pid {launcher_pid}) is gone")
            failed.append(run.run_id)
        return failed

    def join(self, timeout: int = 30) -> None:
        """Wait until every accepted run has finished (tests, shutdown)."""
        with self._idle:
            self._idle.wait_for(lambda: not self._pending and not self._current, timeout=timeout)

    def dispose(self) -> None:
        """Runs still waiting when the instance is disposed (daemon shutdown) fail now; a run
        still executing is failed by ``fail_orphaned_runs`` / run monitoring after a restart."""
        if not self.has_instance:
            return
        with self._lock:
            waiting, self._pending = list(self._pending), set()
        for run_id in waiting:
            run = self._instance.get_run_by_id(run_id)
            if run is not None and not run.is_finished:
                self._instance.add_run_tags(run_id, {FAILED_OVER_TAG: "worker died: shut down before the run"})
                self._instance.report_run_failed(run, "icecdc warm launcher: shut down before the run started")
        if self._process_launcher is not None:
            self._process_launcher.dispose()
