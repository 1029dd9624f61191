"""The executor of every run the daemon (or the UI) launches: Dagster's in-process executor that
first records the worker on the run (holder tags + heartbeat) and takes the line's lock.

It runs in whatever process executes the run - a run worker of Dagster's default launcher, the
``WarmRunLauncher``'s thread in the daemon - so sensor-launched runs and ``icecdc sync`` exclude
each other through the same lock, and a dead run worker can be recognised and failed over.
(``icecdc sync`` executes with ``execute_in_process``, which brings its own executor: the sync
records itself and holds the lock around its runs.) A run that finds the line held waits for it,
reporting the holder in its event log, and can be terminated while it waits.
"""

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from dagster import DagsterRunStatus, define_asset_job
from dagster._core.definitions.executor_definition import (
    IN_PROC_CONFIG,
    ExecutorDefinition,
    _core_in_process_executor_creation,
)
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.executor.in_process import InProcessExecutor
from dagster._utils.interrupts import check_captured_interrupt

from icecdc_dagster import run_tags
from icecdc_dagster.lease.holder import Holder, process_role, run_heartbeat
from icecdc_dagster.lease.line_lock import LineLock, busy_message
from icecdc_dagster.lease.lock_contract import LineLockContract

if TYPE_CHECKING:
    from dagster import InitExecutorContext
    from dagster._core.definitions.asset_selection import CoercibleToAssetSelection
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition
    from dagster._core.execution.context.system import PlanOrchestrationContext
    from dagster._core.execution.plan.plan import ExecutionPlan

WARM_WORKER_THREAD = "icecdc-warm-runs"  # prefix of the WarmRunLauncher's worker threads (lanes)
LANE_PROCESS_ROLE = "warm launcher (lane process)"


def lane_role() -> str:
    """Who holds a lane's run: the warm launcher's lane process, or the daemon that hosts the lanes."""
    return LANE_PROCESS_ROLE if process_role() == LANE_PROCESS_ROLE else "warm launcher (daemon)"
WAIT_POLL_S = 0.5
WAIT_REPORT_EVERY_S = 60.0


class LineExecutor(InProcessExecutor):
    def execute(self, plan_context: "PlanOrchestrationContext",
                execution_plan: "ExecutionPlan") -> Iterator[DagsterEvent]:
        run = plan_context.dagster_run
        line_id = run_tags.line_of(run.tags)
        if line_id is None:  # not a line's run (e.g. a manual materialisation of a check)
            yield from super().execute(plan_context, execution_plan)
            return
        instance = plan_context.instance
        in_warm_launcher = threading.current_thread().name.startswith(WARM_WORKER_THREAD)
        holder = Holder.current(role=lane_role() if in_warm_launcher else "run worker")
        instance.add_run_tags(run.run_id, holder.tags())
        lock = LineLock.for_instance(instance, line_id)
        with run_heartbeat(instance, run.run_id):
            yield from self._acquire(plan_context, lock, holder)
            try:
                yield DagsterEvent.engine_event(
                    plan_context, f"Holding the line lock of {line_id} ({lock.where}) as {holder.describe()}.",
                    EngineEventData())
                yield from super().execute(plan_context, execution_plan)
            finally:
                lock.release()

    def _acquire(self, plan_context: "PlanOrchestrationContext", lock: LineLockContract,
                 holder: Holder) -> Iterator[DagsterEvent]:
        if lock.try_acquire(holder):
            return
        reported = 0.0
        while not lock.try_acquire(holder, grace_s=0):
            if time.monotonic() - reported >= WAIT_REPORT_EVERY_S:
                reported = time.monotonic()
                yield DagsterEvent.engine_event(
                    plan_context, f"Waiting for the line lock: {busy_message(lock)}.", EngineEventData())
            current = plan_context.instance.get_run_by_id(plan_context.run_id)
            if check_captured_interrupt() or (current is not None and current.status == DagsterRunStatus.CANCELING):
                raise DagsterExecutionInterruptedError(f"terminated while waiting for the line lock of {lock.line_id}")
            time.sleep(WAIT_POLL_S)


def _create_line_executor(init_context: "InitExecutorContext") -> LineExecutor:
    base = _core_in_process_executor_creation(init_context.executor_config)
    return LineExecutor(retries=base.retries, step_dependency_config=base.step_dependency_config,
                        marker_to_close=base.marker_to_close)


line_executor = ExecutorDefinition(
    name="icecdc_line_in_process",
    config_schema=IN_PROC_CONFIG,
    executor_creation_fn=_create_line_executor,
    description="In-process executor that records the worker on the run and holds the line's lock.",
)


def line_job(name: str, selection: "CoercibleToAssetSelection") -> "UnresolvedAssetJobDefinition":
    """The job our sensors and schedules launch: ``selection`` with :data:`line_executor` on the job itself.

    Not on the code location (``Definitions(executor=...)``): merged into a user's project, that would
    conflict with their executor or silently become the executor of their own jobs. Our runs carry it
    wherever our definitions go; theirs keep theirs. The name is prefixed so it cannot collide with a
    user's job."""
    return define_asset_job(name=JOB_PREFIX + name, selection=selection, executor_def=line_executor)


JOB_PREFIX = "icecdc__"
