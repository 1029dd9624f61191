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
