"""``WarmRunLauncher``: runs execute in long-lived worker threads ("lanes") sharing one warm
SparkSession instead of a cold JVM per run: lanes of the process that launches them (the daemon), or,
with ``lane_process: true``, of one long-lived process of their own (``lane_process``).

``launch_run`` tags the run with the process that will execute it and queues it there; a lane
(``lanes``) executes it and always leaves it SUCCESS, FAILURE or CANCELED. Operator's manual
(enabling, sizing, guarantees, trade-offs): docs/warm-launcher.md.
"""

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dagster import DagsterRunStatus, Field, IntSource, RunsFilter, StringSource
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
from dagster._core.storage.dagster_run import DagsterRun
from dagster._serdes import ConfigurableClass
from dagster._serdes.config_class import ConfigurableClassData

from icecdc_dagster import run_tags
from icecdc_dagster.errors import RuntimeSetupError
from icecdc_dagster.launcher.lane_process import LaneProcess, LaneSetup
from icecdc_dagster.launcher.lanes import Lanes, prepare_lane_instance
from icecdc_dagster.launcher.monitored_launcher import MonitoredRunLauncher
from icecdc_dagster.launcher.sqlite_tuning import check_sqlite_synchronous, set_sqlite_synchronous
from icecdc_dagster.launcher.worker_health import new_session, worker_alive
from icecdc_dagster.lease import failover
from icecdc_dagster.lease.executor import JOB_PREFIX, lane_role
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.instance_connections import keep_connections_open
from icecdc_dagster.lease.logging_reconfiguration import skip_logging_reconfiguration_per_run
from icecdc_dagster.run_tags import FAILED_OVER_TAG, LAUNCHER_HOST_TAG, LAUNCHER_PID_TAG, LAUNCHER_SESSION_TAG

if TYPE_CHECKING:
    from dagster import DagsterInstance


DAEMON_THREADS = 2  # besides the lanes, the daemon's threads that call the instance at once (sensor, queue)
_IN_FLIGHT = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
_UNFINISHED = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, *_IN_FLIGHT]
JOIN_POLL_S = 0.2
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
    """Runs execute in ``workers`` lanes of this process, or of a lane process of its own with
    ``lane_process`` (docs/warm-launcher.md).

    Raises:
        ValueError: ``workers`` below 1, or ``sqlite_synchronous`` none of ``SQLITE_SYNCHRONOUS``.
    """

    def __init__(self, inst_data: ConfigurableClassData | None = None, workers: int = 1,
                 sqlite_synchronous: str | None = None,
                 switch_interval_ms: float = DEFAULT_SWITCH_INTERVAL_MS, lane_process: bool = False) -> None:
        if workers < 1:
            raise ValueError(f"WarmRunLauncher: workers must be at least 1, got {workers}")
        if sqlite_synchronous is not None:
            check_sqlite_synchronous(sqlite_synchronous)
        self._inst_data = inst_data
        self._workers_wanted = workers
        self._sqlite_synchronous = sqlite_synchronous
        self._switch_interval_ms = switch_interval_ms
        self._use_lane_process = lane_process
        self._lock = threading.Lock()
        self._lanes: Lanes | None = None  # the lanes of this process (started with the first run)
        self._lane_process: LaneProcess | None = None  # or the lane process (started with the first run)
        self._sent: set[str] = set()  # runs handed to a lane process, until they are seen finished
        self._process_launcher: MonitoredRunLauncher | None = None  # for the runs that are not ours
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

    @property
    def lane_process_pid(self) -> int | None:
        """The pid of the lane process while one runs (``lane_process: true``, after the first run)."""
        with self._lock:
            process = self._lane_process
        return process.pid if process is not None and process.alive() else None

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {"workers": Field(IntSource, is_required=False, default_value=1,
                                 description="Runs executing at once (lanes sharing the SparkSession)."),
                "sqlite_synchronous": Field(StringSource, is_required=False,
                                            description="PRAGMA synchronous for the instance's SQLite "
                                                        "storage in this process (OFF, NORMAL, FULL, EXTRA); "
                                                        "unset: SQLite's default. See docs/warm-launcher.md."),
                "switch_interval_ms": Field(float, is_required=False, default_value=DEFAULT_SWITCH_INTERVAL_MS,
                                            description="With workers > 1: the GIL switch interval of the "
                                                        "process hosting the lanes (Python's default 5 ms; "
                                                        "0: leave it). See docs/warm-launcher.md."),
                "lane_process": Field(bool, is_required=False, default_value=False,
                                      description="Host the lanes (and the SparkSession) in one long-lived "
                                                  "process of their own, not in the daemon's. See "
                                                  "docs/warm-launcher.md.")}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> "WarmRunLauncher":
        return cls(inst_data=inst_data, workers=int(config_value.get("workers", 1)),
                   sqlite_synchronous=config_value.get("sqlite_synchronous"),
                   switch_interval_ms=float(config_value.get("switch_interval_ms", DEFAULT_SWITCH_INTERVAL_MS)),
                   lane_process=bool(config_value.get("lane_process", False)))

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
        if self._use_lane_process:
            self._send_to_lane_process(run.run_id)
            return
        self._instance.add_run_tags(run.run_id, {LAUNCHER_HOST_TAG: self._host, LAUNCHER_PID_TAG: str(self._pid),
                                                 LAUNCHER_SESSION_TAG: self._session,
                                                 **Holder.current(role=lane_role()).tags()})
        self._own_lanes().submit(run.run_id)

    def _own_lanes(self) -> Lanes:
        """The lanes of this process, started with the first run: here, not at registration, because
        the webserver registers launchers too."""
        with self._lock:
            if self._lanes is None:
                prepare_lane_instance(self._instance, self._workers_wanted, None, other_threads=DAEMON_THREADS)
                if self._workers_wanted > 1 and self._switch_interval_ms:
                    sys.setswitchinterval(self._switch_interval_ms / 1000)
                self._lanes = Lanes(self._instance, self._workers_wanted,
                                    where=f"the warm launcher's worker thread (pid: {self._pid})")
            return self._lanes

    def _send_to_lane_process(self, run_id: str) -> None:
        """Tag the run with the lane process that gets it, then hand it over (a new process if the last
        one has exited: its own runs are failed over as any dead worker's).

        Raises:
            RuntimeSetupError: two lane processes in a row exited before they could take the run.
        """
        process = None
        for _ in range(2):
            process = self._live_lane_process()
            self._instance.add_run_tags(run_id, {LAUNCHER_HOST_TAG: self._host, LAUNCHER_PID_TAG: str(process.pid),
                                                 LAUNCHER_SESSION_TAG: process.session, **process.holder.tags()})
            if process.send(run_id):
                with self._lock:
                    self._sent.add(run_id)
                return
        raise RuntimeSetupError(f"icecdc warm launcher: the {process.describe() if process else 'lane process'} "
                                f"could not take run {run_id}; its output (the daemon's) says why")

    def _live_lane_process(self) -> LaneProcess:
        with self._lock:
            if self._lane_process is None or not self._lane_process.alive():
                if self._lane_process is None:  # the daemon's own connections: sensors and queue only
                    keep_connections_open(self._instance, threads=DAEMON_THREADS)
                else:
                    _log.warning("icecdc warm launcher: lane process %s exited; starting another",
                                 self._lane_process.pid)
                self._lane_process = LaneProcess(LaneSetup(
                    instance_ref=self._instance.get_ref(), workers=self._workers_wanted, session=new_session(),
                    switch_interval_ms=self._switch_interval_ms, sqlite_synchronous=self._sqlite_synchronous))
            return self._lane_process

    # -- termination -------------------------------------------------------------------------

    def _processes(self) -> MonitoredRunLauncher:
        """Dagster's default launcher (a new process per run), for the runs that are not ours."""
        with self._lock:
            if self._process_launcher is None:
                self._process_launcher = MonitoredRunLauncher()
                self._process_launcher.register_instance(self._instance)
            return self._process_launcher

    def terminate(self, run_id: str) -> bool:
        """Mark the run CANCELING; the process executing it interrupts it (see ``Lanes``' watcher).
        Called in the webserver (UI) as often as in the daemon, so nothing here assumes the run
        is executing in this process. A run still waiting for a lane of this process ends CANCELED
        at once; one waiting in another process's queue when that process's lane picks it up."""
        instance = self._instance
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        if not is_ours(run):
            return self._processes().terminate(run_id)
        if self._lanes is not None and self._lanes.withdraw(run_id):
            instance.report_run_canceled(run, "terminated before it started")
            return True
        instance.report_run_canceling(run)
        return True

    # -- monitoring --------------------------------------------------------------------------

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        if not is_ours(run):
            return self._processes().check_run_worker_health(run)
        if self._lanes is not None and self._lanes.holds(run.run_id):
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        if run_tags.read(run.tags, LAUNCHER_SESSION_TAG) == self._session:
            # Launched into this process's lanes but no longer queued or executing: the worker lost it.
            return CheckRunHealthResult(WorkerStatus.FAILED, "the warm launcher's worker no longer runs it")
        if worker_alive(run):  # a lane process's run: alive while that process is (it always ends its runs)
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        judged = failover.judge(run)
        if judged is not None and not judged[1].alive:  # name the dead worker, as a failover does
            return CheckRunHealthResult(WorkerStatus.FAILED, failover.death_notice(judged[0], judged[1].reason))
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

    def join(self, timeout: float = 30) -> None:
        """Wait until every accepted run has finished (tests, shutdown)."""
        if self._lanes is not None:
            self._lanes.join(timeout)
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                sent = sorted(self._sent)
            unfinished = set(self._instance.get_run_ids(RunsFilter(run_ids=sent, statuses=_UNFINISHED))) \
                if sent else set()
            with self._lock:
                self._sent &= unfinished
            if not unfinished or time.monotonic() >= deadline:
                return
            time.sleep(JOIN_POLL_S)

    def dispose(self) -> None:
        """Runs still waiting for a lane of this process when the instance is disposed (daemon shutdown)
        fail now; a run still executing is failed by ``fail_orphaned_runs`` / run monitoring after a
        restart. A lane process is asked to end: it fails its waiting runs and finishes the others."""
        if not self.has_instance:
            return
        if self._lanes is not None:
            self._lanes.fail_waiting("shut down before the run started")
        with self._lock:
            process, self._lane_process = self._lane_process, None
        if process is not None:
            process.close()
        if self._process_launcher is not None:
            self._process_launcher.dispose()
