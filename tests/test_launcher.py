"""WarmRunLauncher with a real DagsterInstance: real runs of small jobs, loaded through the
run's job code origin (this module), executed in the launcher's worker thread."""

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, in_process_executor, job, op, reconstructable
from dagster._core.test_utils import instance_for_test

from icecdc_dagster import run_tags
from icecdc_dagster.launcher import DEFAULT_SWITCH_INTERVAL_MS, WarmRunLauncher
from icecdc_dagster.lease.executor import WARM_WORKER_THREAD, line_executor
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.line_lock import LineLock
from icecdc_dagster.run_tags import LAUNCHER_HOST_TAG, LAUNCHER_PID_TAG, LAUNCHER_SESSION_TAG, LEGACY, WORKER_ROLE_TAG

LAUNCHER = {"run_launcher": {"module": "icecdc_dagster.launcher", "class": "WarmRunLauncher"}}


@op
def where_am_i(context):  # noqa: ANN001, ANN201
    context.add_output_metadata({"pid": os.getpid(), "thread": threading.get_ident()})
    return 1


@op
def boom() -> None:
    raise RuntimeError("boom")


@op
def slow() -> None:
    for _ in range(300):  # 30 s unless terminated
        time.sleep(0.1)


# Two runs meet here only if they execute at the same time (two lanes); one lane would time out.
RENDEZVOUS = threading.Barrier(2, timeout=20)


@op
def meet(context):  # noqa: ANN001, ANN201
    RENDEZVOUS.wait()
    context.add_output_metadata({"thread": threading.get_ident()})
    return 1


def _tails_started_by_this_process() -> int:
    """Dagster's process capture starts ``tail -F`` children; the lanes' capture must not."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = stat.parent.joinpath("comm").read_text().strip()
        except OSError:
            continue
        count += int(fields[1]) == os.getpid() and command == "tail"
    return count


@op
def first_printer(context):  # noqa: ANN001, ANN201
    print("first run: hello")                # noqa: T201
    time.sleep(1.0)                          # the second run starts meanwhile and ends after this one
    return 1


@op
def second_printer(context):  # noqa: ANN001, ANN201
    print("second run: started")             # noqa: T201
    time.sleep(2.0)                          # the first run ends meanwhile
    print("second run: ended")               # noqa: T201
    context.add_output_metadata({"tails": _tails_started_by_this_process()})
    return 1


@job(executor_def=in_process_executor)
def first_printing_job() -> None:
    first_printer()


@job(executor_def=in_process_executor)
def second_printing_job() -> None:
    second_printer()


@job(executor_def=in_process_executor)
def meeting_job() -> None:
    meet()


@job(executor_def=in_process_executor)
def ok_job() -> None:
    where_am_i()


@job(executor_def=in_process_executor)
def failing_job() -> None:
    boom()


@job(executor_def=in_process_executor)
def slow_job() -> None:
    slow()


@pytest.fixture
def instance():  # noqa: ANN201
    with instance_for_test(overrides=LAUNCHER) as instance:
        assert isinstance(instance.run_launcher, WarmRunLauncher)
        yield instance


def launch(instance, job_def, origin=None):  # noqa: ANN001, ANN201
    """A run of a line (``icecdc/table``), as our sensors launch: the warm launcher's own kind of run."""
    origin = origin or reconstructable(job_def).get_python_origin()
    run = instance.create_run_for_job(job_def=job_def, job_code_origin=origin, tags={run_tags.TABLE_TAG: "test"})
    instance.launch_run(run.run_id, workspace=None)
    return run.run_id


def wait_status(instance, run_id: str, statuses: set, timeout: float = 20) -> DagsterRunStatus:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = instance.get_run_by_id(run_id).status
        if status in statuses:
            return status
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} still {instance.get_run_by_id(run_id).status}")


def output_metadata(instance, run_id: str) -> dict:  # noqa: ANN001
    (event,) = instance.all_logs(run_id, of_type=DagsterEventType.STEP_OUTPUT)
    return {k: v.value for k, v in event.dagster_event.step_output_data.metadata.items()}


def test_runs_succeed_in_one_warm_worker_thread(instance):  # noqa: ANN001
    first, second = launch(instance, ok_job), launch(instance, ok_job)
    instance.run_launcher.join(timeout=20)
    assert instance.get_run_by_id(first).status == DagsterRunStatus.SUCCESS
    assert instance.get_run_by_id(second).status == DagsterRunStatus.SUCCESS
    a, b = output_metadata(instance, first), output_metadata(instance, second)
    assert a["pid"] == b["pid"] == os.getpid()  # no new process per run
    assert a["thread"] == b["thread"] != threading.get_ident()  # the same long-lived worker thread
    tags = instance.get_run_by_id(first).tags
    assert tags[LAUNCHER_PID_TAG] == str(os.getpid()) and tags[LAUNCHER_HOST_TAG] == socket.gethostname()


def test_failing_run_ends_failure_and_the_worker_goes_on(instance):  # noqa: ANN001
    failed = launch(instance, failing_job)
    after = launch(instance, ok_job)
    instance.run_launcher.join(timeout=20)
    assert instance.get_run_by_id(failed).status == DagsterRunStatus.FAILURE
    assert instance.get_run_by_id(after).status == DagsterRunStatus.SUCCESS


def test_job_that_cannot_be_loaded_ends_failure(instance):  # noqa: ANN001
    origin = reconstructable(ok_job).get_python_origin()
    missing = origin._replace(job_name="no_such_job")
    run_id = launch(instance, ok_job, origin=missing)
    instance.run_launcher.join(timeout=20)
    assert instance.get_run_by_id(run_id).status == DagsterRunStatus.FAILURE


def test_terminate_running_and_waiting_runs(instance):  # noqa: ANN001
    running = launch(instance, slow_job)
    waiting = launch(instance, ok_job)
    wait_status(instance, running, {DagsterRunStatus.STARTED})
    assert instance.run_launcher.terminate(waiting)
    assert instance.get_run_by_id(waiting).status == DagsterRunStatus.CANCELED
    # Terminate from another instance object (the webserver's): the executing process interrupts.
    webserver = DagsterInstance.from_ref(instance.get_ref())
    started = time.monotonic()
    assert webserver.run_launcher.terminate(running)
    assert wait_status(instance, running, {DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE}) == \
        DagsterRunStatus.CANCELED
    assert time.monotonic() - started < 5
    after = launch(instance, ok_job)  # the worker survived the interrupt
    instance.run_launcher.join(timeout=20)
    assert instance.get_run_by_id(after).status == DagsterRunStatus.SUCCESS


def _released(tags: dict, previous_release: bool) -> dict:
    """``tags`` as this release writes them, or under the keys the previous release wrote (runs in
    flight across an upgrade: crash recovery must still read them)."""
    return {LEGACY.get(k, k): v for k, v in tags.items()} if previous_release else tags


@pytest.mark.parametrize("previous_release", [False, True])
def test_runs_of_a_dead_worker_process_are_failed(instance, previous_release):  # noqa: ANN001
    run = instance.create_run_for_job(job_def=ok_job,
                                      job_code_origin=reconstructable(ok_job).get_python_origin())
    from dagster._core.events import DagsterEvent

    instance.report_dagster_event(DagsterEvent(event_type_value=DagsterEventType.PIPELINE_START.value,
                                               job_name=run.job_name), run_id=run.run_id)
    gone = 2 ** 22 + 12345  # above the default pid_max: no such process
    instance.add_run_tags(run.run_id, _released({LAUNCHER_HOST_TAG: socket.gethostname(), LAUNCHER_PID_TAG: str(gone),
                                                 LAUNCHER_SESSION_TAG: "old"}, previous_release))
    launcher = instance.run_launcher
    stale = instance.get_run_by_id(run.run_id)
    assert stale.status == DagsterRunStatus.STARTED
    assert launcher.check_run_worker_health(stale).status.value == "FAILED"
    assert launcher.fail_orphaned_runs() == [run.run_id]
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE
    from icecdc_dagster.run_tags import FAILED_OVER_TAG

    # A dead process is not a failed batch: the tag keeps it out of the batch's max_retries.
    assert instance.get_run_by_id(run.run_id).tags[FAILED_OVER_TAG] == f"worker died: pid {gone} is gone"


@job(executor_def=line_executor)
def line_job() -> None:
    where_am_i()


def test_warm_runs_record_their_worker_and_wait_for_a_busy_line_until_terminated(instance):  # noqa: ANN001
    """The warm launcher's runs go through the line executor: the worker (the daemon's process) is
    recorded on the run, and a run of a line an ``icecdc sync`` holds waits - terminating it then
    ends it CANCELED without applying anything; once the line is free, runs of it succeed."""
    sync_lock = LineLock.for_instance(instance, "db.orders")
    assert sync_lock.try_acquire(Holder.current(role="icecdc sync"))
    origin = reconstructable(line_job).get_python_origin()
    run = instance.create_run_for_job(job_def=line_job, job_code_origin=origin, tags={run_tags.TABLE_TAG: "db.orders"})
    instance.launch_run(run.run_id, workspace=None)
    deadline = time.monotonic() + 30
    while not [e for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ENGINE_EVENT)
               if "Waiting for the line lock" in (e.message or "")]:
        assert time.monotonic() < deadline, "the run did not report waiting for the line"
        time.sleep(0.05)
    tags = instance.get_run_by_id(run.run_id).tags
    assert tags[WORKER_ROLE_TAG] == "warm launcher (daemon)" and Holder.from_tags(tags).pid == os.getpid()
    assert instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run.run_id)).status.value == "RUNNING"
    assert instance.run_launcher.terminate(run.run_id)
    assert wait_status(instance, run.run_id, {DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE}) == \
        DagsterRunStatus.CANCELED
    assert not instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START)
    sync_lock.release()
    after = instance.create_run_for_job(job_def=line_job, job_code_origin=origin,
                                        tags={run_tags.TABLE_TAG: "db.orders"})
    instance.launch_run(after.run_id, workspace=None)
    instance.run_launcher.join(timeout=30)
    assert instance.get_run_by_id(after.run_id).status == DagsterRunStatus.SUCCESS
    assert not LineLock.for_instance(instance, "db.orders").is_busy()


@pytest.mark.parametrize("previous_release", [False, True])
def test_orphan_whose_pid_was_reused_is_failed(instance, previous_release):  # noqa: ANN001
    """A dead daemon's run whose pid now belongs to another live process (pid reuse) is failed,
    with the reason; a liveness check by pid alone would have kept it STARTED forever."""
    import subprocess
    import sys

    from icecdc_dagster.lease.holder import process_state

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = instance.create_run_for_job(job_def=ok_job,
                                          job_code_origin=reconstructable(ok_job).get_python_origin())
        from dagster._core.events import DagsterEvent

        instance.report_dagster_event(DagsterEvent(event_type_value=DagsterEventType.PIPELINE_START.value,
                                                   job_name=run.job_name), run_id=run.run_id)
        dead = Holder(host=socket.gethostname(), pid=other.pid, pid_start=process_state(other.pid).start_ticks - 1,
                      boot_id=Holder.current().boot_id, since=time.time() - 60, role="warm launcher (daemon)")
        instance.add_run_tags(run.run_id, _released({LAUNCHER_HOST_TAG: socket.gethostname(),
                                                     LAUNCHER_PID_TAG: str(other.pid), LAUNCHER_SESSION_TAG: "old",
                                                     **dead.tags()}, previous_release))
        assert instance.run_launcher.fail_orphaned_runs() == [run.run_id]
        (failure,) = instance.all_logs(run.run_id, of_type=DagsterEventType.PIPELINE_FAILURE)
        assert f"pid {other.pid} now belongs to another process" in failure.message
    finally:
        other.kill()
        other.wait()


@pytest.fixture
def two_lane_instance():  # noqa: ANN201
    overrides = {"run_launcher": {**LAUNCHER["run_launcher"], "config": {"workers": 2}}}
    interval = sys.getswitchinterval()
    with instance_for_test(overrides=overrides) as instance:
        assert instance.run_launcher.workers == 2
        yield instance
    sys.setswitchinterval(interval)


def test_lanes_take_the_gil_back_within_the_configured_interval(two_lane_instance):  # noqa: ANN001
    """Lanes wait on the JVM through py4j and must get the GIL back quickly (see DEFAULT_SWITCH_INTERVAL_MS);
    one lane leaves the process's interval alone."""
    assert launch(two_lane_instance, ok_job)
    two_lane_instance.run_launcher.join(timeout=30)
    assert sys.getswitchinterval() == pytest.approx(DEFAULT_SWITCH_INTERVAL_MS / 1000)


def test_two_lanes_execute_two_runs_at_once_and_cancel_one_alone(two_lane_instance):  # noqa: ANN001
    instance = two_lane_instance
    RENDEZVOUS.reset()
    first, second = launch(instance, meeting_job), launch(instance, meeting_job)
    instance.run_launcher.join(timeout=30)
    assert {instance.get_run_by_id(r).status for r in (first, second)} == {DagsterRunStatus.SUCCESS}
    assert output_metadata(instance, first)["thread"] != output_metadata(instance, second)["thread"]
    slow_run = launch(instance, slow_job)
    wait_status(instance, slow_run, {DagsterRunStatus.STARTED})
    quick = launch(instance, ok_job)   # the other lane is free: it does not wait for the slow run
    assert wait_status(instance, quick, {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE}) == DagsterRunStatus.SUCCESS
    assert instance.get_run_by_id(slow_run).status == DagsterRunStatus.STARTED
    assert instance.run_launcher.terminate(slow_run)
    assert wait_status(instance, slow_run, {DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE}) == \
        DagsterRunStatus.CANCELED


def _captured(instance, run_id: str) -> tuple[str, str]:  # noqa: ANN001
    """The run's stdout and stderr as the UI reads them (the manager of a fresh instance, same storage)."""
    (event,) = instance.all_logs(run_id, of_type=DagsterEventType.LOGS_CAPTURED)
    reader = DagsterInstance.from_ref(instance.get_ref()).compute_log_manager
    key = reader.build_log_key_for_run(run_id, event.dagster_event.logs_captured_data.file_key)
    assert reader.is_capture_complete(key)
    data = reader.get_log_data(key)
    return (data.stdout or b"").decode(), (data.stderr or b"").decode()


def test_concurrent_lanes_keep_their_own_compute_logs_and_the_daemons_output(two_lane_instance):  # noqa: ANN001
    """Dagster's capture points the process's descriptors 1 and 2 at a run's files: with two lanes, the
    runs wrote into each other's logs, and the run that ended first pointed them back while the other
    still ran, losing its last lines. Each run's log now holds its own lines, all of them."""
    instance = two_lane_instance
    descriptors = [os.readlink(f"/proc/self/fd/{fd}") for fd in (1, 2)]
    first = launch(instance, first_printing_job)
    wait_status(instance, first, {DagsterRunStatus.STARTED})
    second = launch(instance, second_printing_job)
    instance.run_launcher.join(timeout=30)
    assert {instance.get_run_by_id(r).status for r in (first, second)} == {DagsterRunStatus.SUCCESS}
    (first_out, first_err), (second_out, second_err) = _captured(instance, first), _captured(instance, second)
    assert first_out == "first run: hello\n"
    assert second_out == "second run: started\nsecond run: ended\n"
    assert "first_printer" in first_err and "second_printer" not in first_err
    assert "second_printer" in second_err and "first_printer" not in second_err
    assert output_metadata(instance, second)["tails"] == 0          # no tail process per run
    assert [os.readlink(f"/proc/self/fd/{fd}") for fd in (1, 2)] == descriptors


def _lane_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(WARM_WORKER_THREAD)}


def _event_times(instance, run_id: str, event_type: DagsterEventType) -> list[float]:  # noqa: ANN001
    """When the run's events of this type were written (storage ids are per run on SQLite: not comparable)."""
    return [entry.timestamp for entry in instance.all_logs(run_id, of_type=event_type)]


def test_one_lane_runs_one_run_at_a_time(instance):  # noqa: ANN001
    """The queued run starts only after the running one has ended, in the same (only) lane: proved by
    the order of the two runs' events in the event log, not by waiting a while and looking."""
    before = _lane_threads()
    slow_run = launch(instance, slow_job)
    wait_status(instance, slow_run, {DagsterRunStatus.STARTED})
    queued = launch(instance, ok_job)
    assert len(_lane_threads() - before) == 1                    # two runs accepted, one lane
    assert instance.get_run_by_id(queued).status not in (DagsterRunStatus.STARTED, DagsterRunStatus.SUCCESS)
    instance.run_launcher.terminate(slow_run)
    instance.run_launcher.join(timeout=30)
    assert instance.get_run_by_id(slow_run).status == DagsterRunStatus.CANCELED
    assert instance.get_run_by_id(queued).status == DagsterRunStatus.SUCCESS
    (slow_ended,) = _event_times(instance, slow_run, DagsterEventType.RUN_CANCELED)
    (queued_started,) = _event_times(instance, queued, DagsterEventType.RUN_START)
    assert queued_started >= slow_ended                          # it waited for the lane
    (lane,) = _lane_threads() - before
    assert output_metadata(instance, queued)["thread"] == lane.ident


def test_run_start_does_not_reconfigure_logging_when_no_python_logs_handlers_are_set(two_lane_instance,
                                                                                        monkeypatch):
    """dictConfig at every run start deadlocks two lanes when the other lane is logging (see
    ``_no_logging_reconfiguration_per_run``): with no handlers configured it is never called."""
    import logging.config

    def refuse(*_args, **_kwargs):
        raise AssertionError("logging.config.dictConfig called at run start")

    monkeypatch.setattr(logging.config, "dictConfig", refuse)
    assert two_lane_instance._settings  # noqa: SLF001 - settings present: Dagster's own path would call it
    assert list(two_lane_instance.get_handlers())  # the event log handler, and no dictConfig
    runs = [launch(two_lane_instance, ok_job) for _ in range(2)]
    two_lane_instance.run_launcher.join(timeout=30)
    assert {two_lane_instance.get_run_by_id(r).status for r in runs} == {DagsterRunStatus.SUCCESS}


def test_sqlite_synchronous_applies_to_the_instance_storage_only(tmp_path):  # noqa: ANN001
    """``sqlite_synchronous``: this process's connections to the instance's SQLite files get the
    PRAGMA (event log, runs); another SQLite file (an Iceberg SQL catalog) keeps SQLite's default."""
    from sqlalchemy import create_engine, text

    overrides = {"run_launcher": {**LAUNCHER["run_launcher"], "config": {"sqlite_synchronous": "OFF"}}}
    with instance_for_test(overrides=overrides) as instance:
        assert isinstance(instance.run_launcher, WarmRunLauncher)
        run_id = launch(instance, ok_job)
        instance.run_launcher.join(timeout=30)
        assert instance.get_run_by_id(run_id).status == DagsterRunStatus.SUCCESS
        with instance.event_log_storage.index_connection() as conn:  # type: ignore[attr-defined]
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 0
        with instance.event_log_storage.run_connection(run_id) as conn:  # type: ignore[attr-defined]
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 0
        other = create_engine(f"sqlite:///{tmp_path}/catalog.db")
        with other.connect() as conn:
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 2  # FULL, SQLite's default
        other.dispose()


def test_sqlite_synchronous_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="sqlite_synchronous"):
        WarmRunLauncher(sqlite_synchronous="sometimes")


def test_definitions_are_built_once_per_process_until_the_pipeline_file_changes(instance, tmp_path, monkeypatch):  # noqa: ANN001
    """Runs of one code origin share one build of its definitions: Dagster's own cache holds one
    job for the whole process, so runs of two jobs taking turns (two tables, two lanes) rebuilt
    them at every run and step; a changed pipeline file rebuilds them."""
    from dagster._core.definitions import reconstruct

    from icecdc_dagster.launcher import definitions_cache

    builds = []
    real = reconstruct.reconstruct_repository_def_from_pointer

    def counting(pointer, load_data):  # noqa: ANN001, ANN202 - the real build, counted
        builds.append(pointer)
        return real(pointer, load_data)

    monkeypatch.setattr(reconstruct, "reconstruct_repository_def_from_pointer", counting)
    definitions_cache.clear_definitions()
    reconstruct.ReconstructableJob.get_definition.cache_clear()
    reconstruct.ReconstructableJob.get_repository_definition.cache_clear()
    config = tmp_path / "pipeline.yaml"
    config.write_text("tables: []\n")
    monkeypatch.setenv("ICECDC_CONFIG", str(config))
    runs = [launch(instance, job) for job in (ok_job, failing_job, ok_job, failing_job)]
    instance.run_launcher.join(timeout=30)
    assert [instance.get_run_by_id(r).status for r in runs] == [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE] * 2
    assert len(builds) == 2  # one per job's code origin, not one per run
    config.write_text("tables: []  # changed\n")
    again = launch(instance, ok_job)
    instance.run_launcher.join(timeout=30)
    assert instance.get_run_by_id(again).status == DagsterRunStatus.SUCCESS
    assert len(builds) == 3
    # A pipeline file a component (or icecdc_definitions) loaded is watched exactly like $ICECDC_CONFIG.
    from icecdc_dagster.config import load_config

    component_file = tmp_path / "defs" / "pipeline.yaml"
    component_file.parent.mkdir()
    component_file.write_text("tables: []\n")
    before = definitions_cache._config_stamp()
    load_config(component_file)
    watched = definitions_cache._config_stamp()
    assert watched != before and str(component_file.resolve()) in {part[0] for part in watched}
    component_file.write_text("tables: []  # changed\n")
    assert definitions_cache._config_stamp() != watched  # the next run rebuilds the definitions


@pytest.mark.parametrize("name", ["WarmRunLauncher", "MonitoredRunLauncher"])
def test_the_module_path_in_existing_dagster_yaml_files_still_loads(name):
    """``dagster.yaml`` files name a launcher by module path (``module: icecdc_dagster.launcher``):
    the launcher package keeps that path working after the split into modules."""
    from dagster._serdes.config_class import ConfigurableClassData

    launcher = ConfigurableClassData("icecdc_dagster.launcher", name, "{}").rehydrate()
    assert type(launcher).__name__ == name
    assert type(launcher).__module__.startswith("icecdc_dagster.launcher.")


def test_a_users_own_run_gets_a_process_of_its_own_not_a_lane(instance):  # noqa: ANN001
    """Merged into a user's project, the launcher is instance-wide: their runs (no ``icecdc/table`` tag,
    not our ``icecdc__*`` jobs, not our code location) go to Dagster's default launcher - a new process per
    run with their executor - and never wait behind, or share a process with, our lines."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import PythonFileTarget

    from icecdc_dagster.launcher.warm_launcher import is_ours

    target = PythonFileTarget(python_file=__file__, attribute="ok_job", working_directory=os.getcwd(),
                              location_name="team")
    with WorkspaceProcessContext(instance, target) as workspace_process:
        workspace = workspace_process.create_request_context()
        location = workspace.get_code_location("team")
        remote_job = location.get_repository("__repository__ok_job").get_full_job("ok_job")
        run = instance.create_run_for_job(job_def=ok_job, remote_job_origin=remote_job.get_remote_origin(),
                                          job_code_origin=remote_job.get_python_origin())
        assert not is_ours(run)
        instance.launch_run(run.run_id, workspace)
        assert wait_status(instance, run.run_id, {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE},
                           timeout=180) == DagsterRunStatus.SUCCESS
    assert output_metadata(instance, run.run_id)["pid"] != os.getpid()  # a run worker process, not a lane
    assert LAUNCHER_PID_TAG not in instance.get_run_by_id(run.run_id).tags
    line_run = launch(instance, ok_job)
    instance.run_launcher.join(timeout=30)
    assert output_metadata(instance, line_run)["pid"] == os.getpid()  # ours: a lane of this process


def test_a_syncs_run_does_not_reconfigure_logging_either(monkeypatch):
    """``icecdc sync`` executes its runs in a thread of its own process, beside whatever else runs there (a
    maintenance run in tests/dagster_layer/test_maintenance.py deadlocked with one in CI): its run start must
    not call dictConfig either."""
    import logging.config

    from icecdc_dagster.sync import execute_in_process_run

    def refuse(*_args, **_kwargs):
        raise AssertionError("logging.config.dictConfig called at run start")

    with instance_for_test(overrides={"telemetry": {"enabled": False}}) as instance:
        assert instance._settings  # noqa: SLF001 - settings present: Dagster's own path would call it
        monkeypatch.setattr(logging.config, "dictConfig", refuse)
        run = instance.create_run_for_job(ok_job)
        execute_in_process_run(ok_job, run, instance)
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.SUCCESS


def test_a_compute_log_manager_of_another_kind_keeps_its_own_capture():
    """Only Dagster's local manager is routed by thread (same files); another kind is left as configured."""
    from icecdc_dagster.launcher.lane_logs import LaneComputeLogManager, route_lane_compute_logs

    noop = {"compute_logs": {"module": "dagster._core.storage.noop_compute_log_manager",
                             "class": "NoOpComputeLogManager"}}
    with instance_for_test(overrides=noop) as instance:
        assert not route_lane_compute_logs(instance)
        assert type(instance.compute_log_manager).__name__ == "NoOpComputeLogManager"
    with instance_for_test() as instance:
        assert route_lane_compute_logs(instance) and route_lane_compute_logs(instance)    # once, then kept
        assert isinstance(instance.compute_log_manager, LaneComputeLogManager)
