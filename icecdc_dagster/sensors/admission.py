"""Room in the run queue: how many runs a snapshot sensor may request this tick.

A run's range is fixed when the sensor requests it (its partition keys are in its tags). A sensor that
requests every line's next run at once, when the lanes are behind, queues runs that start minutes later
for ranges that were current minutes ago: each table commits again meanwhile, its next run waits behind
the whole queue, and the backlog grows with the queue (``bench/freshness.py --sustained 100``: 91 runs
queued, ~100 s from request to start, the backlog still growing after 10 minutes). Requesting only
what the lanes will start within about two sensor intervals keeps that wait short: a line left waiting is
planned again on a later tick and its run then takes every snapshot committed meanwhile (up to
``max_snapshots_per_run``): the queue converts a backlog into wider batches, not a longer queue.

The budget follows the instance's ``run_queue.max_concurrent_runs`` (with the warm launcher, its lanes)
and how long recent runs of these jobs took; every queued run of the instance counts against it (a
user's own runs wait in the same queue). A coordinator without a limit (or one that does not queue) has
no budget: every run is requested at once.
"""

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dagster import DagsterRunStatus, RunsFilter

if TYPE_CHECKING:
    from dagster import DagsterInstance

WAITING_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED]
RECENT_RUNS_READ = 30  # the instance's latest runs read to find those of the tick's jobs (whose wall sizes it)
UNKNOWN_RUN_WALL_S = 10.0  # before any run of these jobs ended: a cautious guess, a budget of 2 per lane
QUEUE_HORIZON_INTERVALS = 2  # runs queued: what the lanes start within this many sensor intervals


def queue_budget(concurrency: int, interval_s: float, run_wall_s: float) -> int:
    """Runs that may wait in the queue: what ``concurrency`` lanes, each taking ``run_wall_s`` per run, start
    within ``QUEUE_HORIZON_INTERVALS`` sensor intervals, and at least two per lane (a lane never waits
    for the next tick for want of a queued run)."""
    per_lane = math.ceil(QUEUE_HORIZON_INTERVALS * interval_s / max(run_wall_s, 0.1))
    return concurrency * max(2, per_lane)


class Admission:
    """One tick's room in the run queue, measured when a line first asks (an idle tick asks nothing).

    ``admit`` says why a run may not be requested now (None: it may; the room shrinks by one). Lines
    refused are recorded in ``deferred``: the sensor plans them again first on its next tick."""

    def __init__(self, instance: "DagsterInstance", job_names: Sequence[str], interval_s: float) -> None:
        self._instance = instance
        self._job_names = list(job_names)
        self._interval_s = interval_s
        self._room: int | None = None
        self._measured = False
        self._why_full = ""
        self.deferred: set[str] = set()

    def admit(self, line_name: str) -> str | None:
        if not self._measured:
            self._measure()
        if self._room is None:
            return None
        if self._room > 0:
            self._room -= 1
            return None
        return self.refuse(line_name)

    def refuse(self, line_name: str) -> str:
        """Defer the line to a later tick; why."""
        self.deferred.add(line_name)
        return self._why_full

    def full(self) -> bool:
        """No run can be requested for the rest of this tick (measured: a line asked and was refused)."""
        return self._measured and self._room is not None and self._room <= 0

    def _measure(self) -> None:
        self._measured = True
        config = self._instance.get_concurrency_config().run_queue_config
        if config is None or config.max_concurrent_runs < 0:  # nothing queues, or no limit: no budget
            return
        concurrency = max(1, config.max_concurrent_runs)
        waiting = self._instance.get_runs_count(RunsFilter(statuses=WAITING_STATUSES))
        wall = recent_run_wall_s(self._instance, self._job_names)
        budget = queue_budget(concurrency, self._interval_s, wall)
        self._room = max(0, budget - waiting)
        self._why_full = (f"waiting for room in the run queue: {waiting} runs queued, {budget} at most "
                          f"({concurrency} at a time, ~{wall:.1f}s each); the run requested later takes every "
                          f"snapshot committed meanwhile")


def recent_run_wall_s(instance: "DagsterInstance", job_names: Sequence[str]) -> float:
    """The median wall time of the latest successful runs of ``job_names`` among the instance's last few (one
    query; a filter takes one job name, a tick has a job per table)."""
    names = set(job_names)
    records = instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.SUCCESS]), limit=RECENT_RUNS_READ)
    walls = [r.end_time - r.start_time for r in records
             if r.dagster_run.job_name in names and r.start_time is not None and r.end_time is not None]
    return statistics.median(walls) if walls else UNKNOWN_RUN_WALL_S
