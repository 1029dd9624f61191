"""How a line retries a failed batch: by what failed, never by how often a worker died.

A failed run of a batch is one of four things, told apart by tags on the run:

- its worker died (``lease.failover`` tagged it ``icecdc/failed_over``), or it never started (run
  monitoring failed it after ``start_timeout_seconds``, Dagster's ``dagster/failure_reason`` tag: e.g.
  a run handed to the warm launcher ahead of a free lane while every lane ran a long export): not a
  failure of the batch, which did no work.
  It never spends the batch's ``max_retries``, whatever the number of kills; ``icecdc sync`` re-executes
  it at once. Unattended (the sensor), a batch whose worker died ``DEAD_STREAK_FREE`` times in a row
  (an OOM kill every time?) is retried with the backoff below, so it cannot loop hot;
- a *transient* error (``errors.IcecdcError.transient``: a service away, another writer): retried with
  exponential backoff (``RETRY_BACKOFF_S`` doubling up to ``RETRY_BACKOFF_MAX_S``), never stops the line
  and never spends ``max_retries``;
- a *terminal* error: retrying gives the same answer, so the line stops at once; the stop names the
  error and the one command that continues the line (the class's ``recovery``);
- anything else (an error from outside the project: Py4J, the OS): retried up to ``max_retries``, as
  before, then the line stops and names ``icecdc sync --retry-failed``.

The asset steps record the kind on their run (:func:`classified`); a run that failed outside them (no
tag) counts as unclassified.
"""

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dagster import DagsterRunStatus, RunsFilter
from dagster._core.events import RunFailureReason
from dagster._core.storage.tags import RUN_FAILURE_REASON_TAG

from icecdc_dagster.errors import (
    RETRY_COMMAND,
    TERMINAL,
    TRANSIENT,
    UNCLASSIFIED,
    classify,
    recovery_command,
    recovery_of,
)
from icecdc_dagster.run_tags import (
    FAILED_OVER_TAG,
    FAILURE_CLASS_TAG,
    FAILURE_KIND_TAG,
    FAILURE_MESSAGE_TAG,
    line_filters,
)

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from dagster._core.storage.dagster_run import RunRecord

MESSAGE_CHARS = 1500
RETRY_BACKOFF_S = float(os.environ.get("ICECDC_RETRY_BACKOFF_S", "5"))
RETRY_BACKOFF_MAX_S = float(os.environ.get("ICECDC_RETRY_BACKOFF_MAX_S", "300"))
DEAD_STREAK_FREE = 3  # dead workers in a row retried at once by the sensor; then with backoff
RECORDS_READ = 200  # failed runs of one key read to judge it (newest first)
_SEVERITY = {TRANSIENT: 0, UNCLASSIFIED: 1, TERMINAL: 2}


def record_failure(instance: "DagsterInstance", run_id: str, exc: BaseException) -> None:
    """Tag the run with the failure's kind; with several failing steps the most severe one stays."""
    kind, name = classify(exc)
    run = instance.get_run_by_id(run_id)
    if run is None:
        return
    recorded = run.tags.get(FAILURE_KIND_TAG)
    if recorded is not None and _SEVERITY.get(recorded, 1) > _SEVERITY[kind]:
        return
    message = " ".join(str(exc).split())[:MESSAGE_CHARS]
    instance.add_run_tags(run_id, {FAILURE_KIND_TAG: kind, FAILURE_CLASS_TAG: name, FAILURE_MESSAGE_TAG: message})


@contextmanager
def classified(instance: "DagsterInstance", run_id: str) -> Iterator[None]:
    """Wrap a step's body: an exception leaving it is recorded on the run (then re-raised)."""
    try:
        yield
    except Exception as exc:
        record_failure(instance, run_id, exc)
        raise


@dataclass(frozen=True)
class Failure:
    kind: str
    class_name: str
    message: str
    ended_at: float  # epoch seconds (0: unknown)

    def describe(self) -> str:
        return f"{self.class_name}: {self.message}" if self.message else self.class_name


@dataclass(frozen=True)
class Attempts:
    """The failed runs that started at one key of a line."""

    runs: int                  # every failed run (the next run's attempt number follows it)
    spent: int                 # those that count against max_retries (unclassified and terminal)
    transient_streak: int      # transient failures since the last unclassified or terminal one
    latest: Failure | None     # the newest failure that was not a dead worker
    dead_streak: int = 0       # the newest failed runs that did no work (worker died, never started), in a row
    dead_ended_at: float = 0.0  # when the newest of those was failed over
    unstarted: int = 0         # of the dead streak, the runs that never started (start timeouts)

    def backoff_s(self) -> float:
        if not self.transient_streak:
            return 0.0
        return min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_S * 2 ** (self.transient_streak - 1))

    def dead_retry_at(self) -> float | None:
        """When the sensor may retry a batch whose worker keeps dying (None: at once)."""
        if self.dead_streak < DEAD_STREAK_FREE:
            return None
        backoff = min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_S * 2 ** (self.dead_streak - DEAD_STREAK_FREE))
        return self.dead_ended_at + backoff

    def retry_at(self) -> float | None:
        """When a transient failure may be retried (None: not waiting for one)."""
        if self.latest is None or self.latest.kind != TRANSIENT:
            return None
        return self.latest.ended_at + self.backoff_s()


def _failure(record: "RunRecord") -> Failure:
    tags = record.dagster_run.tags
    ended = record.end_time or (record.update_timestamp.timestamp() if record.update_timestamp else 0.0)
    return Failure(tags.get(FAILURE_KIND_TAG, UNCLASSIFIED), tags.get(FAILURE_CLASS_TAG, "run failure"),
                   tags.get(FAILURE_MESSAGE_TAG, ""), float(ended or 0.0))


def never_started(tags: Mapping[str, str]) -> bool:
    """Run monitoring failed the run before it started (``start_timeout_seconds``)."""
    return tags.get(RUN_FAILURE_REASON_TAG) == RunFailureReason.START_TIMEOUT.value


def did_no_work(tags: Mapping[str, str]) -> bool:
    """The run's worker died (failed over) or the run never started (a start timeout)."""
    return bool(tags.get(FAILED_OVER_TAG)) or never_started(tags)


def attempts_at(instance: "DagsterInstance", line_id: str, key: str) -> Attempts:
    """Judge the failed runs of the line that started at ``key``, newest first, down to its newest
    successful run (a failure before a success is settled; a sink joining at an applied key starts
    afresh)."""
    found = [r for of_key in line_filters(line_id, key) for r in instance.get_run_records(RunsFilter(
        tags=of_key, statuses=[DagsterRunStatus.FAILURE, DagsterRunStatus.SUCCESS]), limit=RECORDS_READ)]
    records = sorted(found, key=lambda r: r.create_timestamp, reverse=True)[:RECORDS_READ]
    spent, streak, latest, streak_open, runs = 0, 0, None, True, 0
    settled, dead, dead_open, dead_at, unstarted = False, 0, True, 0.0, 0
    for record in records:
        if record.dagster_run.status == DagsterRunStatus.SUCCESS:
            settled = True
            continue
        runs += 1
        if settled:
            continue
        if did_no_work(record.dagster_run.tags):
            dead_at = dead_at or _failure(record).ended_at
            dead += 1 if dead_open else 0
            unstarted += 1 if dead_open and never_started(record.dagster_run.tags) else 0
            continue
        dead_open = False
        failure = _failure(record)
        latest = latest or failure
        if failure.kind == TRANSIENT:
            streak += 1 if streak_open else 0
            continue
        streak_open = False
        spent += 1
    if len(records) >= RECORDS_READ:
        runs = sum(instance.get_runs_count(RunsFilter(tags=of_key, statuses=[DagsterRunStatus.FAILURE]))
                   for of_key in line_filters(line_id, key))
    return Attempts(runs=runs, spent=spent, transient_streak=streak, latest=latest, dead_streak=dead,
                    dead_ended_at=dead_at, unstarted=unstarted)


def recovery(failure: Failure, line_id: str, config_path: str | None) -> str:
    """The command that continues the line after ``failure`` (its class's, else re-execute)."""
    template = recovery_of(failure.class_name) or RETRY_COMMAND
    return recovery_command(template, line_id, config_path)


def dead_streak_reason(key: str, attempts: Attempts, wait_s: float) -> str:
    """Why a batch whose runs keep doing no work waits: the cause said as it is (a worker that died is
    not a run that never found a free worker)."""
    n, unstarted = attempts.dead_streak, attempts.unstarted
    if unstarted == n:
        what = (f"the runs of {key} never started {n} times in a row (no free worker within run monitoring's "
                f"start_timeout_seconds: every worker busy with a long run?)")
    elif unstarted:
        what = (f"the runs of {key} did no work {n} times in a row ({n - unstarted} workers died, killed or "
                f"out of memory?; {unstarted} runs never started)")
    else:
        what = f"the worker running {key} died {n} times in a row (killed, or out of memory?)"
    return f"{what}: retried in {wait_s:.0f}s; icecdc sync retries it at once"


def waiting_reason(key: str, attempts: Attempts, now: float | None = None) -> str:
    assert attempts.latest is not None
    at = attempts.retry_at() or 0.0
    wait = max(0.0, at - (time.time() if now is None else now))
    return (f"{key} failed with a transient error ({attempts.transient_streak} in a row): "
            f"{attempts.latest.describe()}; retried in {wait:.0f}s (backoff {attempts.backoff_s():.0f}s)")


def terminal_reason(key: str, attempts: Attempts, line_id: str, config_path: str | None) -> str:
    assert attempts.latest is not None
    return (f"{key} stopped the line: {attempts.latest.describe()}; to continue: "
            f"{recovery(attempts.latest, line_id, config_path)}")
