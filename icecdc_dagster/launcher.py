"""A run launcher that keeps Spark warm: runs execute one after another in a
long-lived worker thread of the process that launches them (the daemon).

Dagster's default launcher starts a new process per run, so every batch pays a
cold JVM and SparkSession (~20 s here) for a few hundred milliseconds of work.
Snapshot batches of a table run strictly one after another anyway, so one warm
process serves them all. Enable it in ``$DAGSTER_HOME/dagster.yaml``::

    run_launcher:
      module: icecdc_dagster.launcher
      class: WarmRunLauncher

Trade-offs: runs of all code locations share the daemon's process (a run that
crashes the JVM takes the daemon down; Dagster's run monitoring then fails the
run and the sensor retries it) and run one at a time. Use the default or a
container launcher when that matters more than latency.
"""

import queue
import threading
from collections.abc import Mapping
from typing import Any

from dagster import DagsterRunStatus
from dagster._core.execution.api import execute_run
from dagster._core.launcher import LaunchRunContext, RunLauncher
from dagster._serdes import ConfigurableClass
from dagster._serdes.config_class import ConfigurableClassData
from dagster._utils.hosted_user_process import recon_job_from_origin


class WarmRunLauncher(RunLauncher, ConfigurableClass):
    def __init__(self, inst_data: ConfigurableClassData | None = None):
        self._inst_data = inst_data
        self._queue: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict:
        return {}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> "WarmRunLauncher":
        return cls(inst_data=inst_data)

    def launch_run(self, context: LaunchRunContext) -> None:
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="icecdc-warm-runs", daemon=True)
                self._worker.start()
        self._queue.put((context.job_code_origin, context.dagster_run.run_id))

    def _work(self) -> None:
        while True:
            origin, run_id = self._queue.get()
            instance = self._instance
            run = instance.get_run_by_id(run_id)
            if run is None or run.status in (DagsterRunStatus.CANCELED, DagsterRunStatus.CANCELING):
                continue
            try:
                execute_run(recon_job_from_origin(origin), run, instance)
            except Exception as exc:  # noqa: BLE001 - the run is marked failed; the worker goes on
                instance.report_run_failed(run, f"icecdc warm launcher: {type(exc).__name__}: {exc}")

    def terminate(self, run_id: str) -> bool:
        return False

    def join(self, timeout: int = 30) -> None:
        return None
