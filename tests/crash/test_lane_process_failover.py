"""The warm launcher's lane process killed mid-batch, under a real ``dagster-daemon``.

``lane_process: true`` puts the lanes and the SparkSession in one long-lived child of the daemon. Here
the sensor launches the export, the lane process reaches the run's step, and it is SIGKILLed (an OOM
kill picks the biggest process: this one, with the JVM under it). The daemon lives on: without a
person, the run is failed with the dead lane process named (run monitoring or the line's next sensor
tick), the sensor retries the batch, the launcher starts a new lane process for it, the replica ends
equal to the source with the export committed once, and the killed process's JVM does not outlive it.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.instance.ref import InstanceRef

from icecdc_dagster import run_tags
from icecdc_dagster.lease.dagster_yaml import RECOMMENDED_DAGSTER_YAML
from icecdc_dagster.lease.executor import LANE_PROCESS_ROLE
from icecdc_dagster.lease.holder import Holder, local_verdict
from icecdc_dagster.sinks.iceberg import SOURCE_SNAPSHOT_PROPERTY
from tests.crash.test_daemon_failover import recovered, stop_group, wait_for
from tests.helpers import write_pipeline

LANE_PROCESS_LAUNCHER = "WarmRunLauncher\n  config:\n    workers: 2\n    lane_process: true"


def _jvms_under(pid: int) -> list[int]:
    """The java processes whose parent is ``pid`` (PySpark's gateway JVM of a lane process)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = stat.parent.joinpath("cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            continue
        if int(fields[1]) == pid and command.endswith(b"java"):
            found.append(int(stat.parent.name))
    return found


@pytest.mark.long
def test_a_killed_lane_process_is_failed_over_and_a_new_one_applies_the_batch_once(spark, catalog_settings, catalog,
                                                                                   tmp_path):
    t = f"{catalog_settings.name}.db.items"
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, v STRING) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {t} SELECT id, concat('v', id) FROM range(0, 5000)")
    config = write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.items", "identifier_columns": ["id"], "polling_interval": "PT1S", "max_retries": 1,
         "sinks": [{"iceberg": {"table_name": "db.items_copy"}}]}])
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(RECOMMENDED_DAGSTER_YAML.replace("MonitoredRunLauncher", LANE_PROCESS_LAUNCHER))
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))  # storage created before the daemon
    assert type(instance.run_launcher).__name__ == "WarmRunLauncher"
    line = RunsFilter(tags={run_tags.TABLE_TAG: "db.items"})
    log = tmp_path / "daemon.log"
    env = {**os.environ, "ICECDC_CONFIG": str(config), "DAGSTER_HOME": str(home)}
    daemon = subprocess.Popen([str(Path(sys.executable).parent / "dagster-daemon"), "run",
                               "-m", "icecdc_dagster.definitions"], env=env, stdout=log.open("w"),
                              stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path)
    try:
        def in_its_step():  # noqa: ANN202
            for run in instance.get_runs(line):
                holder = Holder.from_tags(run.tags)
                if holder and holder.role == LANE_PROCESS_ROLE and \
                        instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START):
                    return run
            return None

        run = wait_for(in_its_step, 300, "a sensor-launched run reaching its step in the lane process", daemon, log)
        holder = Holder.from_tags(instance.get_run_by_id(run.run_id).tags)
        assert holder.pid not in (daemon.pid, os.getpid())
        jvms = wait_for(lambda: _jvms_under(holder.pid), 120, "the lane process's JVM", daemon, log)
        os.kill(holder.pid, signal.SIGKILL)

        runs = wait_for(lambda: recovered(instance, line), 300, "the failover and a successful retry", daemon, log)
        assert daemon.poll() is None  # the daemon never went down
        deadline = time.monotonic() + 60  # PySpark's JVM ends when its Python parent's pipe closes
        while any(local_verdict(Holder.of(pid)).alive for pid in jvms):
            assert time.monotonic() < deadline, f"the killed lane process's JVM {jvms} outlived it"
            time.sleep(0.2)
    finally:
        stop_group(daemon)
        instance.dispose()
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE
    failures = instance.all_logs(run.run_id, of_type=DagsterEventType.PIPELINE_FAILURE)
    assert failures and all(f"{holder.host}:{holder.pid} ({LANE_PROCESS_ROLE}) died" in f.message
                            for f in failures), [f.message for f in failures]
    retried = [r for r in runs if r.status == DagsterRunStatus.SUCCESS]
    assert [r.tags[run_tags.FIRST_SNAPSHOT_TAG] for r in retried] == [run.tags[run_tags.FIRST_SNAPSHOT_TAG]]
    new = Holder.from_tags(retried[0].tags)
    assert new.role == LANE_PROCESS_ROLE and new.pid not in (holder.pid, daemon.pid, os.getpid())
    source, copy = spark.table(t), spark.table(f"{catalog_settings.name}.db.items_copy")
    assert copy.count() == 5000 and source.exceptAll(copy).count() == 0 and copy.exceptAll(source).count() == 0
    applied = [s.summary.additional_properties.get(SOURCE_SNAPSHOT_PROPERTY)
               for s in catalog.load_table("db.items_copy").snapshots()]
    assert [a for a in applied if a] == [run.tags[run_tags.FIRST_SNAPSHOT_TAG]]
