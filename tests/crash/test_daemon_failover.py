"""Daemon mode, for real: ``dagster dev`` with the generated ``dagster.yaml`` (MonitoredRunLauncher,
run monitoring, one run per line). The sensor launches the export; mid-batch the whole ``dagster
dev`` process group - daemon, code server, run worker, its JVM - is SIGKILLed (a host crash or an
OOM kill of the service: nobody is left to report the run, which stays STARTED). ``dagster dev`` is
started again and, with no person involved, the run is failed with the dead worker named (run
monitoring or the next sensor tick), the sensor retries the batch, and the replica ends equal to the
source, the export committed once. (When only the run worker dies, Dagster's code server, its
parent, reports it failed by itself.)

That whole scenario (two ``dagster dev`` starts, two cold run workers) runs under ``-m slow``. The
default run has its core with the real daemon: ``dagster-daemon run`` on the generated ``dagster.yaml``
finds a sensor-requested run whose run worker died mid-batch (a real, dead process), fails it with
the worker named and retries the batch in a run worker of its own; the replica ends equal to the
source. (The kill itself is ``tests/dagster_layer/test_sensor_runs.py``'s, and run monitoring on
the generated file is ``test_failover.py``'s, both in the default run.)"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.events import DagsterEvent
from dagster._core.instance.ref import InstanceRef

from icecdc_dagster import run_tags
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.lease.dagster_yaml import ensure_dagster_yaml
from icecdc_dagster.lease.failover import IN_FLIGHT
from icecdc_dagster.lease.holder import Holder, process_state
from icecdc_dagster.sinks.iceberg import SOURCE_SNAPSHOT_PROPERTY
from tests.dagster_layer.harness import create_launchable_run, tick
from tests.helpers import write_pipeline


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout_s: float, what: str, process: subprocess.Popen, log: Path):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def _dead_run_worker() -> Holder:
    """The worker tags of a run worker process that has died (started, then SIGKILLed)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    state = process_state(process.pid)
    holder = Holder(host=socket.gethostname(), pid=process.pid, pid_start=state.start_ticks,
                    boot_id=Holder.current().boot_id, since=time.time(), role="run worker")
    process.send_signal(signal.SIGKILL)
    process.wait()
    return holder


def recovered(instance: DagsterInstance, line: RunsFilter) -> list | None:
    """The line's runs once one succeeded and none is in flight (the failover and its retry are done)."""
    runs = instance.get_runs(line)
    done = [r for r in runs if r.status == DagsterRunStatus.SUCCESS]
    return runs if done and not [r for r in runs if r.status in IN_FLIGHT] else None


def stop_group(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.mark.long
def test_the_daemon_fails_a_dead_workers_run_and_retries_the_batch(spark, catalog_settings, catalog, tmp_path):
    t = f"{catalog_settings.name}.db.items"
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, v STRING) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {t} SELECT id, concat('v', id) FROM range(0, 50)")
    config = write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.items", "identifier_columns": ["id"], "polling_interval": "PT1S", "max_retries": 1,
         "sinks": [{"iceberg": {"table_name": "db.items_copy"}}]}])
    home = tmp_path / "dagster_home"
    home.mkdir()
    assert ensure_dagster_yaml(home)
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
    line = RunsFilter(tags={run_tags.TABLE_TAG: "db.items"})
    daemon = None
    try:
        # The sensor's export run, claimed by a run worker that then died mid-batch (STARTED, nobody left).
        defs = build_definitions(load_config(config))
        (request,) = tick(defs, instance, load_config(config).tables[0], run=False).run_requests
        run = create_launchable_run(defs, instance, request)
        dead = _dead_run_worker()
        instance.add_run_tags(run.run_id, dead.tags())
        instance.report_dagster_event(DagsterEvent(event_type_value=DagsterEventType.PIPELINE_START.value,
                                                   job_name=run.job_name), run_id=run.run_id)
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTED

        log = tmp_path / "daemon.log"
        env = {**os.environ, "ICECDC_CONFIG": str(config), "DAGSTER_HOME": str(home)}
        daemon = subprocess.Popen([str(Path(sys.executable).parent / "dagster-daemon"), "run",
                                   "-m", "icecdc_dagster.definitions"], env=env, stdout=log.open("w"),
                                  stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path)

        runs = wait_for(lambda: recovered(instance, line), 300, "the failover and a successful retry", daemon, log)
    finally:
        if daemon is not None:
            stop_group(daemon)
        instance.dispose()
    assert [r.status for r in runs if r.run_id == run.run_id] == [DagsterRunStatus.FAILURE]
    failures = instance.all_logs(run.run_id, of_type=DagsterEventType.PIPELINE_FAILURE)
    assert failures and all(f"{dead.host}:{dead.pid} (run worker) died" in f.message for f in failures)
    retried = [r for r in runs if r.status == DagsterRunStatus.SUCCESS]
    assert [r.tags[run_tags.FIRST_SNAPSHOT_TAG] for r in retried] == [run.tags[run_tags.FIRST_SNAPSHOT_TAG]]
    assert Holder.from_tags(retried[0].tags).pid not in (os.getpid(), dead.pid)   # a run worker of the daemon's
    source, copy = spark.table(t), spark.table(f"{catalog_settings.name}.db.items_copy")
    assert copy.count() == 50 and source.exceptAll(copy).count() == 0 and copy.exceptAll(source).count() == 0
    applied = [s.summary.additional_properties.get(SOURCE_SNAPSHOT_PROPERTY)
               for s in catalog.load_table("db.items_copy").snapshots()]
    assert [a for a in applied if a] == [run.tags[run_tags.FIRST_SNAPSHOT_TAG]]


@pytest.mark.slow
def test_killed_run_worker_under_dagster_dev_is_failed_and_retried_without_a_person(spark, catalog_settings, catalog,
                                                                                    tmp_path):
    t = f"{catalog_settings.name}.db.items"
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, v STRING) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {t} SELECT id, concat('v', id) FROM range(0, 20000)")
    config = write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.items", "identifier_columns": ["id"], "polling_interval": "PT5S", "max_retries": 2,
         "sinks": [{"iceberg": {"table_name": "db.items_copy"}}]}])
    home = tmp_path / "dagster_home"
    home.mkdir()
    assert ensure_dagster_yaml(home)
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))   # storage created before the daemon
    env = {**os.environ, "ICECDC_CONFIG": str(config), "DAGSTER_HOME": str(home)}
    dagster = Path(sys.executable).parent / "dagster"

    def start(log: Path) -> subprocess.Popen:
        return subprocess.Popen([str(dagster), "dev", "-m", "icecdc_dagster.definitions", "-h", "127.0.0.1",
                                 "-p", str(_free_port())], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=tmp_path)

    line = RunsFilter(tags={run_tags.TABLE_TAG: "db.items"})
    log = tmp_path / "dagster_dev_1.log"
    process = start(log)
    try:
        def started_mid_batch():  # noqa: ANN202
            for run in instance.get_runs(line):
                if Holder.from_tags(run.tags) and instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START):
                    return run
            return None

        run = wait_for(started_mid_batch, 300, "a sensor-launched run reaching its first step", process, log)
        holder = Holder.from_tags(instance.get_run_by_id(run.run_id).tags)
        assert holder.role == "run worker" and holder.pid != process.pid
        assert os.getpgid(holder.pid) == process.pid           # the run worker is in dagster dev's group
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTED   # nobody left to say

        log = tmp_path / "dagster_dev_2.log"
        process = start(log)

        runs = wait_for(lambda: recovered(instance, line), 400, "the failover and a successful retry", process, log)
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE
        failures = instance.all_logs(run.run_id, of_type=DagsterEventType.PIPELINE_FAILURE)
        for failure in failures:
            print("failed by:", failure.message)
        # Run monitoring and the sensor tick may both catch it in the same instant (two reports, one
        # FAILURE, one retry); each names the dead worker.
        assert failures and all(f"{holder.host}:{holder.pid} (run worker) died" in f.message for f in failures)
        assert [r.tags[run_tags.FIRST_SNAPSHOT_TAG] for r in runs if r.status == DagsterRunStatus.SUCCESS] == \
            [run.tags[run_tags.FIRST_SNAPSHOT_TAG]]
    finally:
        stop_group(process)
        instance.dispose()
    source, copy = spark.table(t), spark.table(f"{catalog_settings.name}.db.items_copy")
    assert copy.count() == 20000 and source.exceptAll(copy).count() == 0 and copy.exceptAll(source).count() == 0
    applied = [s.summary.additional_properties.get(SOURCE_SNAPSHOT_PROPERTY)
               for s in catalog.load_table("db.items_copy").snapshots()]
    assert [a for a in applied if a] == [run.tags[run_tags.FIRST_SNAPSHOT_TAG]]
