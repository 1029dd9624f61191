"""WarmRunLauncher with ``lane_process: true``: the lanes in a long-lived process of their own. Real
runs of small jobs (loaded by that process through the run's job code origin, this module), a real
SQLite instance, a real child process: killed, terminated and shut down as a deploy or an OOM would."""

import os
import signal
import threading
import time

import pytest
from dagster import DagsterEventType, DagsterRunStatus, in_process_executor, job, op, reconstructable
from dagster._core.test_utils import instance_for_test

from icecdc_dagster import run_tags
from icecdc_dagster.launcher import WarmRunLauncher
from icecdc_dagster.lease.executor import LANE_PROCESS_ROLE, line_executor
from icecdc_dagster.lease.holder import Holder, local_verdict
from icecdc_dagster.run_tags import FAILED_OVER_TAG, LAUNCHER_PID_TAG, WORKER_ROLE_TAG

START_S = 90  # the lane process imports Dagster and this module before its first run
ENDED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


@op
def where_am_i(context):  # noqa: ANN001, ANN201
    context.add_output_metadata({"pid": os.getpid(), "thread": threading.get_ident()})
    return 1


@op
def slow(context):  # noqa: ANN001, ANN201
    seconds = float(os.environ.get("ICECDC_TEST_SLOW_S", "60"))
    context.log.info(f"sleeping {seconds} s")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
    return 1


@job(executor_def=in_process_executor)
def ok_job() -> None:
    where_am_i()


@job(executor_def=line_executor)
def line_job() -> None:
    where_am_i()


@job(executor_def=line_executor)
def slow_line_job() -> None:
    slow()


@pytest.fixture
def instance():  # noqa: ANN201
    config = {"run_launcher": {"module": "icecdc_dagster.launcher", "class": "WarmRunLauncher",
                               "config": {"workers": 2, "lane_process": True}}}
    with instance_for_test(overrides=config) as instance:
        assert isinstance(instance.run_launcher, WarmRunLauncher)
        yield instance


def launch(instance, job_def, table: str = "db.t") -> str:  # noqa: ANN001
    origin = reconstructable(job_def).get_python_origin()
    run = instance.create_run_for_job(job_def=job_def, job_code_origin=origin, tags={run_tags.TABLE_TAG: table})
    instance.launch_run(run.run_id, workspace=None)
    return run.run_id


def wait_status(instance, run_id: str, statuses: set, timeout: float = START_S) -> DagsterRunStatus:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = instance.get_run_by_id(run_id).status
        if status in statuses:
            return status
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} still {instance.get_run_by_id(run_id).status}")


def wait_step_started(instance, run_id: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + START_S
    while not instance.all_logs(run_id, of_type=DagsterEventType.STEP_START):
        assert time.monotonic() < deadline, f"run {run_id} did not start its step"
        time.sleep(0.1)


def output_pid(instance, run_id: str) -> int:  # noqa: ANN001
    (event,) = instance.all_logs(run_id, of_type=DagsterEventType.STEP_OUTPUT)
    return int(event.dagster_event.step_output_data.metadata["pid"].value)


def ran_in(instance, run_id: str) -> int:  # noqa: ANN001
    """The pid the run's step ran in, once it succeeded."""
    assert wait_status(instance, run_id, ENDED) == DagsterRunStatus.SUCCESS
    return output_pid(instance, run_id)


def wait_gone(pid: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while local_verdict(Holder.of(pid)).alive:
        assert time.monotonic() < deadline, f"lane process {pid} is still running"
        time.sleep(0.1)


def test_runs_execute_in_one_lane_process_and_record_it_as_their_holder(instance):  # noqa: ANN001
    runs = [launch(instance, ok_job, table=f"db.t{i}") for i in range(3)] + [launch(instance, line_job)]
    instance.run_launcher.join(timeout=START_S)
    assert [instance.get_run_by_id(r).status for r in runs] == [DagsterRunStatus.SUCCESS] * 4
    lane_pid = instance.run_launcher.lane_process_pid
    assert lane_pid is not None and lane_pid != os.getpid()
    assert {output_pid(instance, r) for r in runs} == {lane_pid}  # one process for every run, not the daemon's
    tags = instance.get_run_by_id(runs[-1]).tags
    assert tags[LAUNCHER_PID_TAG] == str(lane_pid)
    assert tags[WORKER_ROLE_TAG] == LANE_PROCESS_ROLE and Holder.from_tags(tags).pid == lane_pid
    engine = [e.message for e in instance.all_logs(runs[0], of_type=DagsterEventType.ENGINE_EVENT)]
    assert f"Executing in the warm launcher's lane process (pid: {lane_pid})." in engine


def test_terminate_from_another_process_cancels_the_run_in_the_lane_process(instance, monkeypatch):  # noqa: ANN001
    monkeypatch.setenv("ICECDC_TEST_SLOW_S", "60")
    run_id = launch(instance, slow_line_job)
    wait_step_started(instance, run_id)
    assert instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run_id)).status.value == "RUNNING"
    assert instance.run_launcher.terminate(run_id)
    assert wait_status(instance, run_id, ENDED, timeout=30) == DagsterRunStatus.CANCELED
    assert ran_in(instance, launch(instance, line_job)) == instance.run_launcher.lane_process_pid  # the lane goes on


def test_a_killed_lane_process_fails_its_runs_over_and_the_next_run_gets_a_new_one(instance, monkeypatch):  # noqa: ANN001
    monkeypatch.setenv("ICECDC_TEST_SLOW_S", "60")
    launcher = instance.run_launcher
    stuck = launch(instance, slow_line_job)
    wait_step_started(instance, stuck)
    killed = launcher.lane_process_pid
    os.kill(killed, signal.SIGKILL)
    wait_gone(killed)
    run = instance.get_run_by_id(stuck)
    assert run.status == DagsterRunStatus.STARTED
    health = launcher.check_run_worker_health(run)
    assert health.status.value == "FAILED" and f":{killed} ({LANE_PROCESS_ROLE}) died" in health.msg, health.msg
    assert launcher.fail_orphaned_runs() == [stuck]
    failed = instance.get_run_by_id(stuck)
    assert failed.status == DagsterRunStatus.FAILURE
    assert failed.tags[FAILED_OVER_TAG].startswith("worker died: ")  # keeps the batch's retries
    assert ran_in(instance, launch(instance, line_job)) == launcher.lane_process_pid not in (killed, os.getpid())


def test_shutting_the_daemon_down_lets_the_lane_process_finish_its_run_then_exit(instance, monkeypatch):  # noqa: ANN001
    monkeypatch.setenv("ICECDC_TEST_SLOW_S", "3")
    launcher = instance.run_launcher
    running = launch(instance, slow_line_job)
    wait_step_started(instance, running)
    pid = launcher.lane_process_pid
    launcher.dispose()  # the daemon's shutdown: the lane process's stdin closes
    wait_gone(pid)
    assert instance.get_run_by_id(running).status == DagsterRunStatus.SUCCESS
