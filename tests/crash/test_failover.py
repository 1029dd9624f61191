"""Failing over runs of dead workers, with a real Dagster instance and real processes: the run
ends FAILURE (CANCELED if it was being canceled) with the reason in its event log; live runs,
fresh remote heartbeats and runs no icecdc worker has claimed are left alone. Also: the
executor's line lock, and run monitoring (the daemon's own code) with the generated dagster.yaml."""

import logging
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from dagster import (
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    RunsFilter,
    execute_job,
    job,
    op,
    reconstructable,
)
from dagster._core.events import DagsterEvent
from dagster._core.instance.ref import InstanceRef
from dagster._core.test_utils import instance_for_test
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

from icecdc_dagster import run_tags
from icecdc_dagster.launcher import MonitoredRunLauncher
from icecdc_dagster.lease import failover
from icecdc_dagster.lease.dagster_yaml import ensure_dagster_yaml
from icecdc_dagster.lease.executor import line_executor
from icecdc_dagster.lease.holder import Holder, process_state
from icecdc_dagster.lease.line_lock import LineLock
from icecdc_dagster.run_tags import WORKER_HEARTBEAT_TAG, WORKER_ROLE_TAG

LINE = "db.orders"


@op
def step() -> int:
    return 1


@job(executor_def=line_executor)
def line_job() -> None:
    step()


@pytest.fixture
def instance():
    with instance_for_test() as dagster_instance:
        yield dagster_instance


def _dead_holder() -> Holder:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    state = process_state(process.pid)
    holder = Holder(host=socket.gethostname(), pid=process.pid, pid_start=state.start_ticks,
                    boot_id=Holder.current().boot_id, since=time.time(), role="icecdc sync")
    process.send_signal(signal.SIGKILL)
    process.wait()
    return holder


def _started_run(instance, holder: Holder | None, first: str = "101", extra: dict | None = None,  # noqa: ANN001
                 previous_release: bool = False):
    """A STARTED run of the line held by ``holder``; ``previous_release``: its bookkeeping under the keys
    the release before the hidden tags wrote (a run in flight across the upgrade)."""
    bookkeeping = {**(holder.tags() if holder else {}), **(extra or {})}
    if previous_release:
        bookkeeping = {run_tags.LEGACY.get(k, k): v for k, v in bookkeeping.items()}
    tags = {run_tags.TABLE_TAG: LINE, run_tags.FIRST_SNAPSHOT_TAG: first, run_tags.LAST_SNAPSHOT_TAG: first,
            **bookkeeping}
    run = instance.create_run_for_job(job_def=line_job, tags=tags)
    instance.report_dagster_event(DagsterEvent(event_type_value=DagsterEventType.PIPELINE_START.value,
                                               job_name=run.job_name), run_id=run.run_id)
    return instance.get_run_by_id(run.run_id)


def _failure_message(instance, run_id: str) -> str:  # noqa: ANN001
    (event,) = instance.all_logs(run_id, of_type=DagsterEventType.PIPELINE_FAILURE)
    return event.message


@pytest.mark.parametrize("previous_release", [False, True])
def test_runs_of_a_dead_worker_are_failed_with_the_reason_in_their_event_log(instance, previous_release):
    dead = _dead_holder()
    orphan = _started_run(instance, dead, previous_release=previous_release)
    alive = _started_run(instance, Holder.current(role="icecdc sync"), first="102", previous_release=previous_release)
    unclaimed = _started_run(instance, None, first="103")       # no icecdc worker recorded: not ours to judge
    sweeper = Holder.current(role="sensor")
    done = failover.fail_dead_runs(instance, LINE, sweeper)
    assert [d.run_id for d in done] == [orphan.run_id]
    assert instance.get_run_by_id(orphan.run_id).status == DagsterRunStatus.FAILURE
    message = _failure_message(instance, orphan.run_id)
    assert f"worker {dead.host}:{dead.pid} (icecdc sync) died" in message
    assert f"no process {dead.pid}" in message and "batch 101 of db.orders is re-executed" in message
    assert f"by sensor {sweeper.host}:{sweeper.pid}" in message
    assert instance.get_run_by_id(orphan.run_id).tags[run_tags.FAILED_OVER_TAG].startswith("worker died")
    assert instance.get_run_by_id(alive.run_id).status == DagsterRunStatus.STARTED
    assert instance.get_run_by_id(unclaimed.run_id).status == DagsterRunStatus.STARTED
    assert failover.fail_dead_runs(instance, LINE, sweeper) == []   # idempotent: nothing twice


def test_a_dead_worker_being_canceled_ends_canceled(instance):
    run = _started_run(instance, _dead_holder())
    instance.report_run_canceling(run)
    (done,) = failover.fail_dead_runs(instance, LINE)
    assert done.run_id == run.run_id
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELED


@pytest.mark.parametrize("previous_release", [False, True])
def test_another_hosts_worker_is_failed_over_when_its_heartbeat_is_stale(instance, previous_release):
    remote = Holder(host="other-host.example", pid=4242, pid_start=99, boot_id="b", since=time.time() - 3600,
                    role="run worker")
    fresh = _started_run(instance, remote, first="101", extra={WORKER_HEARTBEAT_TAG: f"{time.time():.3f}"},
                         previous_release=previous_release)
    stale = _started_run(instance, remote, first="102", extra={WORKER_HEARTBEAT_TAG: f"{time.time() - 600:.3f}"},
                         previous_release=previous_release)
    done = failover.fail_dead_runs(instance, LINE)
    assert [d.run_id for d in done] == [stale.run_id]
    assert "no heartbeat from other-host.example:4242" in _failure_message(instance, stale.run_id)
    assert instance.get_run_by_id(fresh.run_id).status == DagsterRunStatus.STARTED


def test_generated_dagster_yaml_lets_run_monitoring_fail_a_dead_worker(tmp_path):
    assert ensure_dagster_yaml(tmp_path) and not ensure_dagster_yaml(tmp_path)   # never overwritten
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path)))
    try:
        assert isinstance(instance.run_launcher, MonitoredRunLauncher)
        assert instance.run_monitoring_enabled and instance.run_monitoring_max_resume_run_attempts == 0
        limits = instance.run_coordinator.get_run_queue_config().tag_concurrency_limits
        assert {"key": "icecdc/table", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits
        dead, alive = _started_run(instance, _dead_holder()), _started_run(instance, Holder.current(), first="102")
        logger = logging.getLogger("test.run_monitoring")
        for run in (dead, alive):   # what the daemon's monitoring loop does for each STARTED run
            monitor_started_run(instance, None, instance.get_run_record_by_id(run.run_id), logger)
        assert instance.get_run_by_id(dead.run_id).status == DagsterRunStatus.FAILURE
        assert "no process" in _failure_message(instance, dead.run_id)
        assert instance.get_run_by_id(alive.run_id).status == DagsterRunStatus.STARTED
    finally:
        instance.dispose()


def test_a_launched_run_records_its_worker_and_waits_for_the_line(instance):
    """The executor of daemon-launched runs: while an ``icecdc sync`` holds the line, the run
    waits (saying who holds it); it applies only after the holder releases."""
    sync_lock = LineLock.for_instance(instance, LINE)
    assert sync_lock.try_acquire(Holder.current(role="icecdc sync"))
    results = []
    runner = threading.Thread(target=lambda: results.append(execute_job(
        reconstructable(line_job), instance, tags={run_tags.TABLE_TAG: LINE})))
    runner.start()
    deadline = time.monotonic() + 60
    waiting = []
    while not waiting and time.monotonic() < deadline:
        runs = instance.get_runs(RunsFilter(tags={run_tags.TABLE_TAG: LINE}))
        logs = instance.all_logs(runs[0].run_id, of_type=DagsterEventType.ENGINE_EVENT) if runs else []
        waiting = [e for e in logs if "Waiting for the line lock" in (e.message or "")]
        time.sleep(0.05)
    assert waiting and "icecdc sync on" in waiting[0].message
    (run,) = instance.get_runs(RunsFilter(tags={run_tags.TABLE_TAG: LINE}))
    assert not instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START)   # nothing applied meanwhile
    assert run.tags[WORKER_ROLE_TAG] == "run worker" and Holder.from_tags(run.tags).pid == Holder.current().pid
    sync_lock.release()
    runner.join(60)
    assert results[0].success
    assert not LineLock.for_instance(instance, LINE).is_busy()    # released when the run ended


def test_a_run_that_timed_out_before_starting_is_retried_as_a_dead_worker_spending_no_retry():
    """A run handed to the warm launcher ahead of a free lane (``max_concurrent_runs`` = lanes + 1) waits in
    STARTING; if every lane runs a long export past ``start_timeout_seconds``, run monitoring fails it. It did no
    work: it must not spend the batch's ``max_retries`` (a line would stop, needing ``--retry-failed``)."""
    from dagster._daemon.monitoring.run_monitoring import monitor_starting_run

    from icecdc_dagster.lease import retry

    with instance_for_test(overrides={"run_monitoring": {"enabled": True, "start_timeout_seconds": 0}}) as instance:
        tags = {run_tags.TABLE_TAG: LINE, run_tags.FIRST_SNAPSHOT_TAG: "101", run_tags.LAST_SNAPSHOT_TAG: "101"}
        waiting = instance.create_run_for_job(job_def=line_job, tags=tags)
        instance.report_dagster_event(DagsterEvent(event_type_value=DagsterEventType.PIPELINE_STARTING.value,
                                                   job_name=waiting.job_name), run_id=waiting.run_id)
        (record,) = instance.get_run_records(RunsFilter(run_ids=[waiting.run_id]))
        monitor_starting_run(instance, record, logging.getLogger("test"))
        assert instance.get_run_by_id(waiting.run_id).status == DagsterRunStatus.FAILURE
        attempts = retry.attempts_at(instance, LINE, "101")
        assert (attempts.spent, attempts.dead_streak, attempts.latest) == (0, 1, None)

        # A run that failed for any other reason still spends one.
        failed = instance.create_run_for_job(job_def=line_job, tags=tags)
        instance.report_run_failed(failed, "boom")
        assert retry.attempts_at(instance, LINE, "101").spent == 1
