"""Daemon mode, for real: ``dagster dev`` with the generated ``dagster.yaml`` (MonitoredRunLauncher,
run monitoring, one run per line). The sensor launches the export; mid-batch the whole ``dagster
dev`` process group - daemon, code server, run worker, its JVM - is SIGKILLed (a host crash or an
OOM kill of the service: nobody is left to report the run, which stays STARTED). ``dagster dev`` is
started again and, with no person involved, the run is failed with the dead worker named (run
monitoring or the next sensor tick), the sensor retries the batch, and the replica ends equal to the
source, the export committed once. (When only the run worker dies, Dagster's code server, its
parent, reports it failed by itself.)"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.instance.ref import InstanceRef

from icecdc_dagster import run_tags
from icecdc_dagster.lease.dagster_yaml import ensure_dagster_yaml
from icecdc_dagster.lease.failover import IN_FLIGHT
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.sinks.iceberg import SOURCE_SNAPSHOT_PROPERTY
from tests.helpers import write_pipeline


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(condition, timeout_s: float, what: str, process: subprocess.Popen, log: Path):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


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

        run = _wait(started_mid_batch, 300, "a sensor-launched run reaching its first step", process, log)
        holder = Holder.from_tags(instance.get_run_by_id(run.run_id).tags)
        assert holder.role == "run worker" and holder.pid != process.pid
        assert os.getpgid(holder.pid) == process.pid           # the run worker is in dagster dev's group
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTED   # nobody left to say

        log = tmp_path / "dagster_dev_2.log"
        process = start(log)

        def recovered():  # noqa: ANN202
            runs = instance.get_runs(line)
            done = [r for r in runs if r.status == DagsterRunStatus.SUCCESS]
            return done and not [r for r in runs if r.status in IN_FLIGHT] and runs

        runs = _wait(recovered, 400, "the failover and a successful retry", process, log)
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
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        instance.dispose()
    source, copy = spark.table(t), spark.table(f"{catalog_settings.name}.db.items_copy")
    assert copy.count() == 20000 and source.exceptAll(copy).count() == 0 and copy.exceptAll(source).count() == 0
    applied = [s.summary.additional_properties.get(SOURCE_SNAPSHOT_PROPERTY)
               for s in catalog.load_table("db.items_copy").snapshots()]
    assert [a for a in applied if a] == [run.tags[run_tags.FIRST_SNAPSHOT_TAG]]
