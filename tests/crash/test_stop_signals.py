"""SIGTERM / Ctrl-C during ``icecdc sync``: the batch in flight is abandoned (its run ends
CANCELED, not FAILED: a stop is not a batch failure), the sync prints where each line stopped and
exits 143 / 130; the next plain sync continues from there and the targets equal the source."""

import re
import signal
import time

import pytest
from dagster import DagsterRunStatus

from tests.crash.scenario import BIG, SMALL, Lake, assert_nothing_in_flight, observe


def _stop_during(lake: Lake, instance, phase: str, signum: int) -> tuple[int, str, str]:  # noqa: ANN001
    known = {run.run_id for run in instance.get_runs()}
    log = lake.root / f"stopped-{signum}-{time.time_ns()}.log"
    process = lake.sync(log=log)
    seen, run = observe(instance, lake, known)
    while seen != phase:
        assert process.poll() is None, f"the sync ended before {phase}:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)
        seen, run = observe(instance, lake, known)
    process.send_signal(signum)
    code = process.wait(timeout=300)
    return code, log.read_text(), run.run_id


@pytest.mark.long
def test_sigterm_and_ctrl_c_cancel_the_batch_and_the_next_sync_continues(spark, catalog_settings, catalog,
                                                                         opensearch_url, tmp_path):
    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=3_000, small_rows=200)
    lake.create()
    instance = lake.observer()
    try:
        code, out, run_id = _stop_during(lake, instance, "export", signal.SIGTERM)
        assert code == 143, out[-3000:]
        assert instance.get_run_by_id(run_id).status == DagsterRunStatus.CANCELED
        big_line = next(line for line in out.splitlines() if line.startswith(f"{BIG}: ") and "runs succeeded" in line)
        assert re.search(rf"STOPPED: SIGTERM received: batch {lake.bootstrap[BIG]}\.\.{lake.bootstrap[BIG]} "
                         rf"abandoned \(run {run_id} CANCELED\).*the next sync continues at {lake.bootstrap[BIG]}",
                         big_line), big_line
        small_line = next(line for line in out.splitlines() if line.startswith(f"{SMALL}: ") and "runs succeeded" in line)
        assert "STOPPED: SIGTERM received before this line started; nothing applied" in small_line
        assert "stopped by SIGTERM" in out
        assert_nothing_in_flight(instance)
        lake.assert_no_lock_left()

        for round_no in (1, 2, 3):
            lake.commit_round(round_no)
            code, out, run_id = _stop_during(lake, instance, "opensearch bulk", signal.SIGINT)   # Ctrl-C
            assert code == 130, out[-3000:]
            if instance.get_run_by_id(run_id).status != DagsterRunStatus.SUCCESS:
                break
            # The signal landed after the small batch's commit (a loaded machine observes late): nothing
            # was left to abandon, the sync stopped before the next batch. Try again with a new round.
            assert "STOPPED: SIGINT received before the next batch" in out, out[-3000:]
            assert_nothing_in_flight(instance)
        assert instance.get_run_by_id(run_id).status == DagsterRunStatus.CANCELED, out[-3000:]
        assert re.search(rf"{BIG}: [1-9]\d*/[1-9]\d* runs succeeded; ok", out), out[-3000:]   # finished before
        assert f"{SMALL}: " in out and "STOPPED: SIGINT received: batch" in out
        assert_nothing_in_flight(instance)
        lake.assert_no_lock_left()

        code, out = lake.sync_to_end()
        assert code == 0, out[-3000:]
        assert "failed over" not in out       # a canceled run is final: nothing to fail over
        lake.assert_synced()
    finally:
        instance.dispose()


def _session_processes(sid: int) -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every live process of session ``sid`` but its leader: what a
    sync started in a session of its own left behind (an orphan keeps its session, its parent is 1)."""
    import os

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == sid:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:   # ended meanwhile
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append((int(entry), int(fields[1]), command))
    return found


def _gateway_jvm(sid: int) -> int | None:
    return next((pid for pid, _, command in _session_processes(sid) if "SparkSubmit" in command), None)


@pytest.mark.long
def test_a_signal_during_spark_start_up_leaves_no_jvm(spark, catalog_settings, catalog, tmp_path):
    """SIGTERM, or Ctrl-C (SIGINT to the whole foreground group), while py4j's gateway JVM starts (before the
    session exists): the sync exits 143 / 130 and nothing of its process tree is left. Before the fix, every
    one of these moments left the JVM as an orphan (parent 1) that py4j's non-daemon GatewayServer thread kept
    alive: the stop request interrupted PySpark's launch, which deleted the JVM's port-file directory."""
    import os
    import subprocess

    from tests.crash.scenario import ICECDC
    from tests.helpers import write_pipeline

    spark.sql(f"CREATE TABLE {catalog_settings.name}.db.items (id BIGINT NOT NULL, v STRING) USING iceberg")
    spark.sql(f"INSERT INTO {catalog_settings.name}.db.items VALUES (1, 'a'), (2, 'b')")
    config = write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.items", "identifier_columns": ["id"], "sinks": [{"iceberg": {"table_name": "db.copy"}}]}])
    # (signal, to the whole group as a terminal's Ctrl-C does, seconds after the gateway JVM appeared)
    for signum, group, after_s in ((signal.SIGTERM, False, 0.0), (signal.SIGINT, True, 1.0),
                                   (signal.SIGTERM, False, 2.5)):
        log = tmp_path / f"sync-{signum}-{after_s}.log"
        with open(log, "w") as out:
            process = subprocess.Popen([ICECDC, "sync", "--config", str(config), "--dagster-home",
                                        str(tmp_path / "home")], stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        try:
            while _gateway_jvm(process.pid) is None:
                assert process.poll() is None, f"the sync ended before Spark started:\n{log.read_text()[-3000:]}"
                time.sleep(0.02)
            time.sleep(after_s)
            assert process.poll() is None, log.read_text()[-3000:]
            os.killpg(process.pid, signum) if group else process.send_signal(signum)
            assert process.wait(timeout=300) == 128 + signum, log.read_text()[-3000:]
            deadline = time.monotonic() + 120     # the gateway JVM exits on its stdin's EOF: give it time
            while _session_processes(process.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _session_processes(process.pid) == [], (signum, after_s, log.read_text()[-3000:])
        finally:
            for pid, _, _ in _session_processes(process.pid):
                os.kill(pid, signal.SIGKILL)
            if process.poll() is None:
                process.kill()
