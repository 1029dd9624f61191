"""Runs executed in a worker thread of this process (the warm launcher's, a sync's): Spark in that
thread, and stopping the run.

Spark resolves catalogs through the calling thread's *active* session (``SQLConf.get``); PySpark's
``getOrCreate`` returns an existing session without making it active in a new thread, so
``adopt_spark_session`` does that before a run starts.

Python delivers signals to the main thread only, and Dagster's own interrupt handling
(``capture_interrupts``) is a no-op outside it; so the run is stopped as Dagster's run worker would
(status CANCELING first, so the run ends CANCELED, not FAILED) and then interrupted: the running
Spark jobs are cancelled (a thread blocked in a py4j call returns) and
``DagsterExecutionInterruptedError`` is raised in the thread at its next Python instruction.
"""

import ctypes
import logging
import sys
import threading
from typing import TYPE_CHECKING

from dagster import DagsterRunStatus
from dagster._core.errors import DagsterExecutionInterruptedError

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from pyspark import SparkContext

_log = logging.getLogger("icecdc_dagster.lease")


def _spark_context() -> "SparkContext | None":
    pyspark = sys.modules.get("pyspark")
    context = getattr(getattr(pyspark, "SparkContext", None), "_active_spark_context", None)
    # A context still starting up has no ``_jsc`` yet: there is nothing to cancel then.
    return context if getattr(context, "_jsc", None) is not None else None


def cancel_spark_jobs(group: str | None = None) -> None:
    """Cancel the running Spark jobs of this process's SparkContext (only ``group``'s, when the run
    was tagged by :func:`tag_spark_thread`), if Spark is in use here."""
    context = _spark_context()
    if context is not None:
        try:
            if group is None:
                context.cancelAllJobs()
            else:
                context.cancelJobGroup(group)
        except Exception:  # noqa: BLE001 - best effort
            _log.exception("icecdc: cancelling Spark jobs failed")


def tag_spark_thread(run_id: str) -> bool:
    """Spark jobs of the calling thread: job group ``run_id`` (cancelled alone) and FAIR scheduler
    pool ``run_id`` (runs of several tables share the executors fairly, a big export does not starve
    a small batch). PySpark pins each Python thread to a JVM thread, so the properties are per run
    thread. False when no SparkContext runs yet (the run that starts it is not tagged)."""
    context = _spark_context()
    if context is None:
        return False
    context.setJobGroup(run_id, f"icecdc run {run_id}", interruptOnCancel=True)
    context.setLocalProperty("spark.scheduler.pool", run_id)
    return True


def adopt_spark_session() -> None:
    """Make this process's SparkSession (if one is running) the active one of the calling thread."""
    pyspark = sys.modules.get("pyspark")
    context = getattr(getattr(pyspark, "SparkContext", None), "_active_spark_context", None)
    if context is None or context._jsc is None:
        return
    jvm = context._jvm
    default = jvm.SparkSession.getDefaultSession()
    if default.isDefined():
        jvm.SparkSession.setActiveSession(default.get())


def raise_in_thread(thread: threading.Thread, error: type[BaseException] = DagsterExecutionInterruptedError) -> None:
    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(error))


def interrupt_run(instance: "DagsterInstance", run_id: str, thread: threading.Thread, reason: str) -> bool:
    """Mark the run CANCELING and interrupt the thread executing it. False while the run has not
    started yet (it cannot end CANCELED before it starts: try again a moment later)."""
    run = instance.get_run_by_id(run_id)
    if run is None or run.status in (DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING):
        return False
    if not run.is_finished and run.status != DagsterRunStatus.CANCELING:
        instance.report_run_canceling(run, reason)
    cancel_spark_jobs()
    raise_in_thread(thread)
    return True
