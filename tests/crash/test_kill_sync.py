"""kill -9 anywhere: ``icecdc sync`` (a subprocess, as an operator runs it) is SIGKILLed at seeded
moments spread over its phases - Spark start, the export, a changelog batch, the OpenSearch bulk,
the replica commit, right after a sink's checkpoint write - each time followed by a plain
``icecdc sync`` (no flags). That sync must exit 0 by itself, having failed over the dead run, and
leave the replica and the index equal to the source at the synced snapshot, without a duplicate
key, without any batch committed twice and without a lock left behind.

Default run: a 3,000-row export and 2 kill points. ``-m slow``: a 100,000-row export (replica sink)
with a 2,000-row table synced into OpenSearch and a replica, 9 kill points. ``ICECDC_CRASH_SEED``
picks the moments (default 1818).
"""

import os
import time

import pytest

from tests.crash.scenario import (Lake, KillResult, assert_killed_run_failed_over, assert_nothing_in_flight, kill_at,
                                  schedule)

SEED = int(os.environ.get("ICECDC_CRASH_SEED", "1818"))


def run_kill_rounds(lake: Lake, points) -> list[KillResult]:  # noqa: ANN001
    instance = lake.observer()
    results, timings = [], []
    try:
        for round_no, point in enumerate(points):
            if round_no:
                lake.commit_round(round_no)   # several pending snapshots per table each round
            known = {run.run_id for run in instance.get_runs()}
            started = time.monotonic()
            result = kill_at(lake.sync(), instance, lake, point, known)
            results.append(result)
            killed_after = time.monotonic() - started
            code, out = lake.sync_to_end()
            timings.append((killed_after, time.monotonic() - started - killed_after))
            assert code == 0, f"round {round_no} ({result}): the plain sync after the kill failed:\n{out[-4000:]}"
            if result.run_id:
                assert "failed over a dead worker's run" in out
            assert_killed_run_failed_over(instance, result)
            assert_nothing_in_flight(instance)
            lake.assert_no_lock_left()
            lake.assert_synced()
    finally:
        for i, (r, (killed_s, recovery_s)) in enumerate(zip(results, timings + [(0, 0)])):
            print(f"kill {i}: target {r.point.target} (+{r.point.delay_s:.2f}s) -> observed {r.observed}, "
                  f"killed={r.killed} after {killed_s:.1f}s, run in flight={r.run_id}; "
                  f"recovery sync {recovery_s:.1f}s")
        instance.dispose()
    return results


def test_sigkill_at_seeded_moments_then_a_plain_sync_recovers(spark, catalog_settings, catalog, opensearch_url,
                                                               tmp_path):
    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=3_000, small_rows=200)
    lake.create()
    results = run_kill_rounds(lake, schedule(SEED, 2))
    assert results[0].killed and results[0].run_id   # the export is always interrupted mid-run


@pytest.mark.slow
def test_sigkill_at_nine_moments_over_a_100k_export(spark, catalog_settings, catalog, opensearch_url, tmp_path):
    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=100_000, small_rows=2_000,
                small_snapshots_per_run=1)
    lake.create()
    results = run_kill_rounds(lake, schedule(SEED, 9, export_window_s=(0.0, 8.0)))
    assert len(results) == 9 and results[0].killed and results[0].run_id
