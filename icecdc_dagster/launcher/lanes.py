"""The lanes: long-lived worker threads of one process that execute runs one after another, sharing
the process's warm SparkSession. The warm launcher hosts them in the daemon's process, or in a lane
process of their own (``launcher.lane_process``); the code is the same in both.

A lane executes a run with ``core_execute_run`` (Dagster's run worker's code path) and always leaves
it SUCCESS, FAILURE or CANCELED. A watcher thread interrupts the runs marked CANCELING by any
process (the webserver's terminate, a daemon's), here where they execute.
"""

import logging
import os
import queue
import sys
import threading
import time
from typing import TYPE_CHECKING

from dagster import DagsterRunStatus, RunsFilter
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._core.events import EngineEventData
from dagster._grpc.impl import core_execute_run
from dagster._utils.error import serializable_error_info_from_exc_info
from dagster._utils.hosted_user_process import recon_job_from_origin

from icecdc_dagster.launcher.definitions_cache import warm_recon_job
from icecdc_dagster.launcher.lane_logs import route_lane_compute_logs
from icecdc_dagster.launcher.run_profile import RunProfile
from icecdc_dagster.launcher.sqlite_tuning import set_sqlite_synchronous
from icecdc_dagster.lease.executor import WARM_WORKER_THREAD
from icecdc_dagster.lease.instance_connections import keep_connections_open
from icecdc_dagster.lease.logging_reconfiguration import skip_logging_reconfiguration_per_run
from icecdc_dagster.lease.run_thread import adopt_spark_session, cancel_spark_jobs, raise_in_thread, tag_spark_thread
from icecdc_dagster.run_tags import FAILED_OVER_TAG

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster_shared.error import SerializableErrorInfo

CANCEL_POLL_S = 1.0
_log = logging.getLogger(__name__)


class Lanes:
    """``workers`` lanes of this process and their cancellation watcher, started with the first run."""

    def __init__(self, instance: "DagsterInstance", workers: int, where: str) -> None:
        self._instance = instance
        self._workers_wanted = workers
        self._where = where  # "the warm launcher's worker thread (pid: N)": the run's engine event says so
        self._queue: queue.Queue[str] = queue.Queue()
        self._workers: list[threading.Thread] = []
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending: set[str] = set()  # accepted, not yet picked up by a lane
        self._current: dict[str, threading.Thread] = {}  # executing now -> the lane's thread
        self._spark_groups: set[str] = set()  # running runs whose Spark jobs carry their job group

    def submit(self, run_id: str) -> None:
        """Queue the run for the next free lane (starting the lanes and the watcher if needed)."""
        with self._lock:
            self._pending.add(run_id)
            self._workers = [w for w in self._workers if w.is_alive()]
            while len(self._workers) < self._workers_wanted:
                worker = threading.Thread(target=self._work, name=f"{WARM_WORKER_THREAD}-{len(self._workers)}",
                                          daemon=True)
                worker.start()
                self._workers.append(worker)
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._watch_cancellation, name="icecdc-warm-cancel",
                                                 daemon=True)
                self._watcher.start()
        self._queue.put(run_id)

    def holds(self, run_id: str) -> bool:
        """Whether the run waits for a lane or executes in one."""
        with self._lock:
            return run_id in self._current or run_id in self._pending

    def withdraw(self, run_id: str) -> bool:
        """Take back a run still waiting for a lane (it will not start); True if it was waiting."""
        with self._lock:
            waiting = run_id in self._pending
            self._pending.discard(run_id)
            if waiting:
                self._idle.notify_all()
        return waiting

    def join(self, timeout: float = 30) -> None:
        """Wait until every accepted run has finished (tests, shutdown)."""
        with self._idle:
            self._idle.wait_for(lambda: not self._pending and not self._current, timeout=timeout)

    def fail_waiting(self, reason: str) -> list[str]:
        """Fail the runs still waiting for a lane (shutdown): tagged as a dead worker's, so they never
        spend their batch's ``max_retries``."""
        with self._lock:
            waiting, self._pending = sorted(self._pending), set()
        for run_id in waiting:
            run = self._instance.get_run_by_id(run_id)
            if run is not None and not run.is_finished:
                self._instance.add_run_tags(run_id, {FAILED_OVER_TAG: f"worker died: {reason}"})
                self._instance.report_run_failed(run, f"icecdc warm launcher: {reason}")
        return waiting

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
            if not watched:
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

    def _unsettled(self, run_id: str, canceled: str) -> "DagsterRun | None":
        """The run if it still needs a final status; a run being canceled ends CANCELED (``canceled``: why)."""
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return None
        if run.status == DagsterRunStatus.CANCELING:
            self._instance.report_run_canceled(run, canceled)
            return None
        return run

    def _execute(self, run_id: str) -> None:
        instance = self._instance
        run = self._unsettled(run_id, "terminated before it started")
        if run is None:
            return
        profile = RunProfile.start(run_id)
        try:
            adopt_spark_session()
            if tag_spark_thread(run_id):
                with self._lock:
                    self._spark_groups.add(run_id)
            instance.report_engine_event(f"Executing in {self._where}.", run, EngineEventData.in_process(os.getpid()))
            if run.job_code_origin is None:
                raise ValueError(f"run {run_id} has no job code origin; the warm launcher cannot load its job")
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
        run = self._unsettled(run_id, "terminated")
        if run is None:
            return
        message = "icecdc warm launcher: the run ended without a final status"
        if error is not None:
            instance.report_engine_event(f"{message}: {error.message}", run, EngineEventData.engine_error(error))
        instance.report_run_failed(run, message)


def prepare_lane_instance(instance: "DagsterInstance", workers: int, sqlite_synchronous: str | None,
                          other_threads: int) -> None:
    """The instance of the process hosting the lanes: runs do not reconfigure logging, its SQLite storage
    gets ``sqlite_synchronous``, its connections are kept (one per lane and per ``other_threads``), each
    lane's run keeps its own compute logs."""
    skip_logging_reconfiguration_per_run(instance)
    if sqlite_synchronous is not None:
        set_sqlite_synchronous(instance, sqlite_synchronous)
    keep_connections_open(instance, threads=workers + other_threads)
    if not route_lane_compute_logs(instance):
        _log.warning("icecdc warm launcher: the instance's compute log manager (%s) captures by process; "
                     "the compute logs of runs in concurrent lanes can mix (docs/warm-launcher.md)",
                     type(instance.compute_log_manager).__name__)
