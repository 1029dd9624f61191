"""A run launcher that keeps Spark warm: runs execute in long-lived worker threads ("lanes") of
the process that launches them (the daemon), sharing one SparkSession.

Dagster's default launcher starts a new process per run, so every batch pays a
cold JVM and SparkSession (~20 s here) for a few hundred milliseconds of work.
Snapshot batches of a table run strictly one after another anyway, so one warm
process serves them all. Enable it in ``$DAGSTER_HOME/dagster.yaml``::

    run_launcher:
      module: icecdc_dagster.launcher
      class: WarmRunLauncher
      config:
        workers: 2                 # lanes: runs executing at once (default 1)
        sqlite_synchronous: "OFF"  # only with SQLite instance storage; see "SQLite storage" below
    run_queue:                     # the queued run coordinator (Dagster's default)
      max_concurrent_runs: 2       # = workers: runs wait as QUEUED, not in the launcher
      dequeue_interval_seconds: 1  # default 5 s: up to 5 s added to every batch
      tag_concurrency_limits:      # one run per line at a time, whatever the number of lanes
        - key: icecdc/table
          value:
            applyLimitPerUniqueValue: true
          limit: 1
    run_monitoring:                # fails runs whose worker died with the daemon
      enabled: true
      max_resume_run_attempts: 0   # this launcher cannot resume a run
      poll_interval_seconds: 30
    sensors:                       # many tables: their sensors tick in parallel (default: one
      use_threads: true            # thread for every sensor; 20 tables at PT5S kept it 100 % busy
      num_workers: 4               # with Dagster's own tick bookkeeping)

Lanes and the GIL: the lanes, the sensor threads and the run queue share the daemon's one Python
interpreter. A lane spends about half its time waiting on the JVM through py4j; every answer has to
take the GIL back, which under Python's default switch interval (5 ms) can wait that long each time,
a thousand times per batch. With ``workers`` > 1 the launcher sets the process's switch interval to
``switch_interval_ms`` (default 1 ms; 0 leaves it alone) when its lanes start.

How a run goes: ``launch_run`` (called by the queued run coordinator daemon)
puts the run on an in-process queue; ``workers`` threads take runs from it and execute them
with ``core_execute_run`` - the same code path as Dagster's run worker
(``dagster api execute_run``), so the job definition is loaded from the run's
code origin (module / file / python package), the cached repository load data
is used and events go to the instance exactly as from a run worker. The
definitions module is imported once and stays imported; so does the
SparkSession its resources start. The definitions are built once per code origin
(again when ``$ICECDC_CONFIG``'s file changes), not per run or step (``_warm_recon_job``).

Guarantees: a run this launcher accepts always ends SUCCESS, FAILURE or
CANCELED in the instance, also when loading the code or the framework raises
(the worker reports the failure and carries on with the next run). A run that
was waiting on the queue when it is terminated is CANCELED without running.
Runs record the worker's host and pid (hidden tags ``.dagster/icecdc/warm_launcher_*``, see ``run_tags``) and,
like every icecdc run, its process start time (``lease.holder`` tags, so a
reused pid is told apart); when the daemon dies with a run in flight,
``check_run_worker_health`` (run monitoring) reports the worker FAILED and
Dagster fails the run, so the sensor's retry/blocking rule takes over; the same
check also runs once when the launcher starts (a restarted daemon fails the
orphans of the dead one at once, so the table's line is not blocked by a run
stuck in STARTED). The line's sensor fails such runs over too (``lease.failover``).

``MonitoredRunLauncher`` (end of this module) is Dagster's default launcher with
the same health check, for process-per-run setups (the generated dagster.yaml).

Trade-offs:

- Runs share the daemon's process: no isolation. A run that exhausts memory
  or crashes the JVM/interpreter takes the daemon (sensors, schedules, queue)
  down with it; a run that leaks state (module globals, Spark conf) leaks it
  into the next. Code or config changes need a daemon restart (the default
  launcher picks them up per run).
- Runs must use the in-process executor (our definitions do): the
  multiprocess executor would start a process (and a JVM) per step again.
- ``workers`` runs at a time for the whole instance (all tables, all code
  locations); runs of one table stay one at a time (the sensor requests the next
  batch only after the previous one ends, the line lock, and the run queue's tag
  limit above). Each run's Spark jobs run in their own FAIR scheduler pool and
  job group (cancelled alone). Keep ``max_concurrent_runs`` equal to
  ``workers`` so waiting runs stay QUEUED - with more, runs would wait on this
  launcher's queue in STARTING and run monitoring's ``start_timeout_seconds``
  (180 s) could fail them. Size: one lane per table that must not wait behind
  another's export, up to about one per driver core (the lanes share the
  driver's Python/JVM; Spark executors do the row work).
- Termination is cooperative: ``terminate`` (UI or daemon) marks the run
  CANCELING; within a second the daemon's watcher thread cancels the running
  Spark jobs and raises ``DagsterExecutionInterruptedError`` in the worker
  thread at its next Python instruction, and the run ends CANCELED (Dagster's
  run worker signals its main thread instead, which a worker thread cannot
  receive). A step blocked in C code stops when that call returns; the
  interrupt may land in framework code rather than at a step boundary. A run
  stuck beyond that can be force-terminated in the UI.
- Step compute logs are captured per process: output of the daemon's own
  threads printed during a run can land in that run's captured logs.
- SQLite instance storage (Dagster's default, no PostgreSQL): every event, run and tick write of
  the daemon process goes through one lock in Dagster's SQLite event log storage, and each is a
  new connection and a commit that waits for the disk (fsync; ~18 ms per transaction measured
  here, several per event). The lanes and the sensor daemon queue behind each other there: with
  20 tables and 2 lanes, ~30 % of a lane's time and ~55 % of the sensor thread's were that lock
  (py-spy, ``bench/freshness.py``). ``sqlite_synchronous: "OFF"`` sets SQLite's
  ``PRAGMA synchronous`` on this process's connections to the instance's own database files
  (not the Iceberg catalog's): commits no longer wait for the disk (~0.7 ms). A crash of the
  process loses nothing; an OS crash or power loss can lose the last writes or corrupt the
  instance database (the sinks' checkpoints still keep every target exact: a lost
  materialisation is re-run and skipped as already applied). Unset (default): SQLite's own
  setting. With PostgreSQL storage it has no effect; prefer PostgreSQL for production.
- Launches must happen in the daemon: with the queued coordinator (default)
  they do. With ``DefaultRunCoordinator`` a run launched from the UI would
  execute inside the webserver process instead.
"""

import logging
import os
import queue
import socket
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dagster import DagsterRunStatus, Field, IntSource, RunsFilter, StringSource
from dagster._core.definitions.reconstruct import ReconstructableJob, ReconstructableRepository
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._core.events import EngineEventData
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher
from dagster._core.storage.dagster_run import DagsterRun
from dagster._serdes import ConfigurableClass
from dagster._serdes.config_class import ConfigurableClassData
from dagster._utils.error import serializable_error_info_from_exc_info

from icecdc_dagster import run_tags
from icecdc_dagster.lease import failover
from icecdc_dagster.lease.executor import WARM_WORKER_THREAD
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.run_thread import adopt_spark_session, tag_spark_thread
from icecdc_dagster.lease.run_thread import cancel_spark_jobs as _cancel_spark_jobs
from icecdc_dagster.lease.run_thread import raise_in_thread as _raise_in_thread
from icecdc_dagster.run_tags import FAILED_OVER_TAG, LAUNCHER_HOST_TAG, LAUNCHER_PID_TAG, LAUNCHER_SESSION_TAG

if TYPE_CHECKING:
    from dagster import DagsterInstance, RepositoryDefinition
    from dagster_shared.error import SerializableErrorInfo


CANCEL_POLL_S = 1.0
_IN_FLIGHT = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
_log = logging.getLogger("icecdc_dagster.launcher")
# Sessions of the launchers alive in this process (several instance objects may share a process).
_LIVE_SESSIONS: set[str] = set()


def _no_logging_reconfiguration_per_run(instance: "DagsterInstance") -> None:
    """Keep run start from calling ``logging.config.dictConfig`` when no ``python_logs`` handlers are set.

    Dagster (1.13) builds every run's log manager through ``get_yaml_python_handlers``, which calls
    ``dictConfig`` whenever the instance has any settings, configured handlers or not. ``dictConfig``
    holds logging's module lock while it takes every handler's lock to close it; a run in another
    lane that is emitting an event holds its handler's lock and waits for the module lock (a logger
    cache miss after the reconfiguration): both lanes, and then every daemon thread, hang.
    Found by ``bench/freshness.py`` with 2 lanes. With no handlers configured the call returns no
    handlers anyway, so it is skipped; configured ``python_logs`` handlers keep Dagster's own path.
    """
    if instance.get_python_log_dagster_handler_config():
        if _log.isEnabledFor(logging.WARNING):
            _log.warning("icecdc warm launcher: python_logs.dagster_handler_config reconfigures logging at "
                         "every run start; with workers > 1 that can deadlock the lanes (a Dagster issue)")
        return
    instance.get_yaml_python_handlers = list  # type: ignore[method-assign]  # what dictConfig yields here: none


SQLITE_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_SQLITE_DIRS: dict[str, str] = {}  # directory -> PRAGMA synchronous for SQLite files under it (this process)
_SQLITE_HOOK = threading.Lock()
_sqlite_hook_installed = False


def _sqlite_storage_dirs(instance: "DagsterInstance") -> set[str]:
    dirs = {os.path.abspath(instance.root_directory)}
    base = getattr(instance.event_log_storage, "_base_dir", None)  # SQLite event log: <storage>/history
    if isinstance(base, str):
        dirs |= {os.path.abspath(base), os.path.dirname(os.path.abspath(base))}
    return dirs


def set_sqlite_synchronous(instance: "DagsterInstance", mode: str) -> None:
    """``PRAGMA synchronous = mode`` on every SQLite connection this process opens to a file under
    the instance's directories (its SQLite storage), from now on. Other SQLite files (an Iceberg SQL
    catalog) keep their settings. See "SQLite storage" in the module docstring."""
    global _sqlite_hook_installed
    mode = mode.upper()
    if mode not in SQLITE_SYNCHRONOUS:
        raise ValueError(f"WarmRunLauncher: sqlite_synchronous must be one of {', '.join(SQLITE_SYNCHRONOUS)}, "
                         f"got {mode!r}")
    with _SQLITE_HOOK:
        for directory in _sqlite_storage_dirs(instance):
            _SQLITE_DIRS[directory + os.sep] = mode
        if _sqlite_hook_installed:
            return
        from sqlalchemy import event
        from sqlalchemy.pool import Pool

        event.listen(Pool, "connect", _on_connect)
        _sqlite_hook_installed = True


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    import sqlite3

    if not isinstance(dbapi_connection, sqlite3.Connection) or not _SQLITE_DIRS:
        return
    files = [row[2] for row in dbapi_connection.execute("PRAGMA database_list").fetchall() if row[1] == "main"]
    path = os.path.abspath(files[0]) if files and files[0] else ""
    for directory, mode in _SQLITE_DIRS.items():
        if path.startswith(directory):
            dbapi_connection.execute(f"PRAGMA synchronous = {mode}")
            return


class _WarmRepository(ReconstructableRepository):
    """A code location whose definitions are built once per process (see :func:`_definitions`)."""

    def get_definition(self) -> "RepositoryDefinition":
        return _definitions(self)


def _warm_recon_job(recon_job: ReconstructableJob) -> ReconstructableJob:
    """The run's job, reading its definitions from this process's cache.

    Dagster rebuilds the code location's definitions whenever its one-entry cache
    (``ReconstructableJob.get_definition``, ``lru_cache(maxsize=1)`` shared by every job) misses:
    at every step when two lanes alternate, and at least once per run. For icecdc that is the
    whole ``definitions.build_definitions`` - the pipeline file read and every source table loaded
    from the catalog (20 tables: 20 catalog loads) - several times per batch (py-spy:
    ~14 % of a lane's time with 2 lanes and 20 tables). Subsets and copies of the job keep the
    cached repository (``_replace`` keeps the class).
    """
    return recon_job._replace(repository=_WarmRepository._make(recon_job.repository))


_DEFINITIONS: dict[tuple[Any, ...], "RepositoryDefinition"] = {}
_DEFINITIONS_LOCK = threading.Lock()


def _config_stamp() -> tuple[Any, ...] | None:
    """The pipeline file the definitions are built from (``$ICECDC_CONFIG``): a change rebuilds them."""
    path = os.environ.get("ICECDC_CONFIG")
    if not path:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return (path,)
    return (path, stat.st_mtime_ns, stat.st_size)


def _definitions(repository: ReconstructableRepository) -> "RepositoryDefinition":
    """The repository definition of a code origin, built once per process (and again when the
    pipeline file changes). Code changes still need a daemon restart (module docstring)."""
    from dagster._core.definitions.reconstruct import reconstruct_repository_def_from_pointer
    from dagster_shared.serdes import serialize_value

    load_data = repository.repository_load_data
    key = (repository.pointer, serialize_value(load_data) if load_data is not None else None, _config_stamp())
    with _DEFINITIONS_LOCK:
        cached = _DEFINITIONS.get(key)
        if cached is None:
            cached = reconstruct_repository_def_from_pointer(repository.pointer, load_data)
            for stale in [k for k in _DEFINITIONS if k[:2] == key[:2]]:
                del _DEFINITIONS[stale]
            _DEFINITIONS[key] = cached
        return cached


# A lane waits on the JVM for about half its time (py-spy: py4j socket reads), ~1,000 py4j round trips
# per batch; each return has to take the GIL back from the other lanes and the sensor threads, and
# with Python's 5 ms switch interval that wait is up to 5 ms per round trip. 1 ms: 20 tables x 3 lanes,
# p95 31.1 -> 29.5 s, p50 20.0 -> 17.7 s, CPU per run 2.17 -> 2.00 CPU-s (bench/freshness.py, one run each).
DEFAULT_SWITCH_INTERVAL_MS = 1.0


class WarmRunLauncher(RunLauncher, ConfigurableClass):
    def __init__(self, inst_data: ConfigurableClassData | None = None, workers: int = 1,
                 sqlite_synchronous: str | None = None,
                 switch_interval_ms: float = DEFAULT_SWITCH_INTERVAL_MS) -> None:
        if workers < 1:
            raise ValueError(f"WarmRunLauncher: workers must be at least 1, got {workers}")
        if sqlite_synchronous is not None and sqlite_synchronous.upper() not in SQLITE_SYNCHRONOUS:
            raise ValueError(f"WarmRunLauncher: sqlite_synchronous must be one of {', '.join(SQLITE_SYNCHRONOUS)}, "
                             f"got {sqlite_synchronous!r}")
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
        self._idle = threading.Condition(self._lock)
        self._session = uuid.uuid4().hex
        _LIVE_SESSIONS.add(self._session)
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
                                                        "unset: SQLite's default. See the module docs."),
                "switch_interval_ms": Field(float, is_required=False, default_value=DEFAULT_SWITCH_INTERVAL_MS,
                                            description="With workers > 1: the daemon process's GIL switch "
                                                        "interval (Python's default 5 ms; 0: leave it). "
                                                        "See the module docs.")}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> "WarmRunLauncher":
        return cls(inst_data=inst_data, workers=int(config_value.get("workers", 1)),
                   sqlite_synchronous=config_value.get("sqlite_synchronous"),
                   switch_interval_ms=float(config_value.get("switch_interval_ms", DEFAULT_SWITCH_INTERVAL_MS)))

    def register_instance(self, instance: "DagsterInstance") -> None:
        super().register_instance(instance)
        _no_logging_reconfiguration_per_run(instance)
        if self._sqlite_synchronous is not None:
            set_sqlite_synchronous(instance, self._sqlite_synchronous)
        try:
            self.fail_orphaned_runs()
        except Exception:  # noqa: BLE001 - never break instance loading; monitoring retries later
            _log.exception("icecdc warm launcher: checking for orphaned runs failed")

    # -- launching ---------------------------------------------------------------------------

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        if run.job_code_origin is None:
            raise ValueError(f"run {run.run_id} has no job code origin; the warm launcher cannot load its job")
        instance = self._instance
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
        any process, e.g. the webserver) is interrupted here, in the process that executes it."""
        interrupted: set[str] = set()
        while True:
            time.sleep(CANCEL_POLL_S)
            with self._lock:
                running = dict(self._current)
            interrupted &= set(running)
            for run_id in set(running) - interrupted:
                if not self.has_instance:
                    break
                try:
                    run = self._instance.get_run_by_id(run_id)
                except Exception:  # noqa: BLE001 - storage hiccup: try again next poll
                    continue
                if run is None or run.status != DagsterRunStatus.CANCELING:
                    continue
                interrupted.add(run_id)
                # Only this run's Spark jobs when they carry its job group (other lanes go on).
                _cancel_spark_jobs(run_id if run_id in self._spark_groups else None)
                with self._lock:
                    if self._current.get(run_id) is running[run_id]:
                        _raise_in_thread(running[run_id], DagsterExecutionInterruptedError)

    def _execute(self, run_id: str) -> None:
        from dagster._grpc.impl import core_execute_run
        from dagster._utils.hosted_user_process import recon_job_from_origin

        instance = self._instance
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return
        if run.status == DagsterRunStatus.CANCELING:
            instance.report_run_canceled(run, "terminated before it started")
            return
        profile = _RunProfile.start(run_id)
        try:
            adopt_spark_session()
            if tag_spark_thread(run_id):
                with self._lock:
                    self._spark_groups.add(run_id)
            instance.report_engine_event(
                f"Executing in the warm launcher's worker thread (pid: {self._pid}).", run,
                EngineEventData.in_process(self._pid))
            assert run.job_code_origin is not None  # checked in launch_run
            recon_job = _warm_recon_job(recon_job_from_origin(run.job_code_origin))
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

    def terminate(self, run_id: str) -> bool:
        """Mark the run CANCELING; the process executing it interrupts it (see the watcher).
        Called in the webserver (UI) as often as in the daemon, so nothing here assumes the run
        is executing in this process. A run still waiting on this process's queue ends CANCELED
        at once; one waiting in another process's queue when that worker picks it up."""
        instance = self._instance
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
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
        with self._lock:
            if run.run_id in self._current or run.run_id in self._pending:
                return CheckRunHealthResult(WorkerStatus.RUNNING)
        if run_tags.read(run.tags, LAUNCHER_SESSION_TAG) == self._session:
            # Launched here but no longer queued or executing: the worker lost it.
            return CheckRunHealthResult(WorkerStatus.FAILED, "the warm launcher's worker no longer runs it")
        if _worker_alive(run):
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
                    or _worker_alive(run):
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


PROFILE_ENV = "ICECDC_RUN_PROFILE"


class _RunProfile:
    """Opt-in (``$ICECDC_RUN_PROFILE`` = a file): one JSON line per run executed here - its wall
    time, the Python CPU time of its worker thread and the Spark jobs of its job group. What
    ``bench/freshness.py`` reads to split a run's cost; unset (default), nothing is measured."""

    _write = threading.Lock()

    def __init__(self, path: str, run_id: str) -> None:
        self.path, self.run_id = path, run_id
        self.wall, self.cpu = time.monotonic(), time.thread_time()

    @classmethod
    def start(cls, run_id: str) -> "_RunProfile | None":
        path = os.environ.get(PROFILE_ENV)
        return cls(path, run_id) if path else None

    def finish(self) -> None:
        import json

        record: dict[str, Any] = {"run_id": self.run_id, "lane": threading.current_thread().name,
                                  "ended": time.time(), "wall_s": round(time.monotonic() - self.wall, 3),
                                  "thread_cpu_s": round(time.thread_time() - self.cpu, 3)}
        context = _spark_context_or_none()
        if context is not None:
            try:
                record["spark_jobs"] = len(context.statusTracker().getJobIdsForGroup(self.run_id))
            except Exception:  # noqa: BLE001 - a measurement only
                pass
        with self._write, open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


def _spark_context_or_none() -> Any:
    pyspark = sys.modules.get("pyspark")
    context = getattr(getattr(pyspark, "SparkContext", None), "_active_spark_context", None)
    return context if context is not None and context._jsc is not None else None


def _worker_alive(run: DagsterRun) -> bool:
    """Whether the process recorded on the run may still be executing it."""
    session = run_tags.read(run.tags, LAUNCHER_SESSION_TAG)
    if session and run_tags.read(run.tags, LAUNCHER_PID_TAG) == str(os.getpid()):
        # This process, or an earlier one whose pid it reuses: alive if the session is ours.
        return session in _LIVE_SESSIONS
    judged = failover.judge(run)
    if judged is not None:  # host, pid and process start time (a reused pid is told apart)
        return judged[1].alive
    if run_tags.read(run.tags, LAUNCHER_HOST_TAG) != socket.gethostname():
        return True  # another host: we cannot tell; leave it to that host's daemon
    try:
        pid = int(run_tags.read(run.tags, LAUNCHER_PID_TAG, "") or "")
    except ValueError:
        return False
    if pid == os.getpid():
        # This process, or an earlier one whose pid it reuses: alive if the session is ours.
        return session in _LIVE_SESSIONS
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class MonitoredRunLauncher(DefaultRunLauncher):
    """Dagster's default launcher (a new process per run) with a worker health check, so run
    monitoring fails a run whose process died instead of leaving it STARTED forever.

    The run worker records itself on the run (host, pid, process start time; ``lease.holder``):
    on this host the check is exact (a reused pid is told apart), for another host's worker it
    reads the run's heartbeat. A run no icecdc worker has recorded itself on yet counts as running
    (run monitoring's ``start_timeout_seconds`` covers a worker that never starts).
    """

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        judged = failover.judge(run)
        if judged is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING, "no icecdc worker recorded on the run yet")
        holder, verdict = judged
        if verdict.alive:
            return CheckRunHealthResult(WorkerStatus.RUNNING, verdict.reason)
        return CheckRunHealthResult(
            WorkerStatus.FAILED, f"icecdc: worker {holder.host}:{holder.pid} ({holder.role}) died: {verdict.reason}")
