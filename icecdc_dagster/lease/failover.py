"""Fail over the runs of a line whose worker is gone, so the line continues without a person.

A run stays STARTED forever when the process executing it dies (SIGKILL, OOM kill, a closed
laptop, a deploy): Dagster only learns of the death from the launcher, and neither ``icecdc sync``
nor Dagster's default launcher can tell it. Every sync and every sensor tick of the line calls
``fail_dead_runs`` first: a run whose recorded holder is gone is marked FAILURE (CANCELED if it was
being canceled) with the reason in its event log, so the line's retry rule re-executes the batch.
Re-executing is safe: the sinks' checkpoints and the ingest ledger make a redo apply nothing twice.
"""

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dagster import DagsterRunStatus, RunsFilter
from dagster._core.storage.dagster_run import DagsterRun

from icecdc_dagster.lease.holder import Holder, Verdict, heartbeat_of, iso, verdict
from icecdc_dagster.run_tags import FAILED_OVER_TAG, first_key_of, last_key_of, line_filters, line_of

if TYPE_CHECKING:
    from dagster import DagsterInstance

# NOT_STARTED: ``execute_in_process`` creates the run, then starts it (a sync may die in between).
# QUEUED runs have no worker yet: the daemon's run queue owns them.
IN_FLIGHT = [DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED,
             DagsterRunStatus.CANCELING]


@dataclass(frozen=True)
class FailedOver:
    run_id: str
    holder: Holder
    reason: str
    message: str


def judge(run: DagsterRun, now: float | None = None) -> tuple[Holder, Verdict] | None:
    """The run's holder and whether it lives; None when no icecdc worker has recorded itself."""
    holder = Holder.from_tags(run.tags)
    if holder is None:
        return None
    return holder, verdict(holder, heartbeat_of(run.tags), now=now)


def death_notice(holder: Holder, reason: str) -> str:
    """What a health check says of a run whose worker is gone (run monitoring's message names it)."""
    return f"icecdc: worker {holder.host}:{holder.pid} ({holder.role}) died: {reason}"


def failover_message(run: DagsterRun, holder: Holder, reason: str, detected_by: Holder, now: float) -> str:
    first, last = first_key_of(run.tags), last_key_of(run.tags)
    batch = f"batch {first}..{last}" if first and first != last else f"batch {first}" if first else "the run"
    return (f"icecdc: worker {holder.host}:{holder.pid} ({holder.role}) died before the run ended: {reason}. "
            f"Detected at {iso(now)} by {detected_by.role} {detected_by.host}:{detected_by.pid}. "
            f"{batch} of {line_of(run.tags) or '?'} is re-executed under the line's retry policy; "
            f"the sinks' checkpoints make the redo apply nothing twice.")


def fail_over(instance: "DagsterInstance", run: DagsterRun, detected_by: Holder,
              now: float | None = None) -> FailedOver | None:
    """Fail ``run`` if its holder is gone (re-read first: another sweeper may have done it)."""
    now = time.time() if now is None else now
    current = instance.get_run_by_id(run.run_id)
    if current is None or current.is_finished:
        return None
    judged = judge(current, now)
    if judged is None or judged[1].alive:
        return None
    holder, result = judged
    message = failover_message(current, holder, result.reason, detected_by, now)
    instance.add_run_tags(current.run_id, {FAILED_OVER_TAG: f"worker died: {result.reason}"})
    current = instance.get_run_by_id(run.run_id)
    if current is None or current.is_finished:
        return None
    if current.status == DagsterRunStatus.CANCELING:
        instance.report_run_canceled(current, message)
    else:
        instance.report_run_failed(current, message)
    return FailedOver(current.run_id, holder, result.reason, message)


def fail_dead_runs(instance: "DagsterInstance", line_id: str, detected_by: Holder | None = None) -> list[FailedOver]:
    """Fail every in-flight run of the line whose worker is gone."""
    detected_by = detected_by or Holder.current()
    records = [r for tags in line_filters(line_id)
               for r in instance.get_run_records(RunsFilter(tags=tags, statuses=IN_FLIGHT))]
    now = time.time()
    return [done for record in records if (done := fail_over(instance, record.dagster_run, detected_by, now))]
