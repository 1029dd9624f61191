"""kill -9 anywhere: ``icecdc sync`` (a subprocess, as an operator runs it) is SIGKILLed at seeded
moments spread over its phases - Spark start, the export, a changelog batch, the OpenSearch bulk,
the replica commit, right after a sink's checkpoint write - each time followed by a plain
``icecdc sync`` (no flags). That sync must exit 0 by itself, having failed over the dead run, and
leave the replica and the index equal to the source at the synced snapshot, without a duplicate
key, without any batch committed twice and without a lock left behind.

Default run: a 3,000-row export killed in its first second (then the catch-up kill below). ``-m slow``:
three seeded kill points over the same lake, and a 100,000-row export (replica sink) with a 2,000-row table
synced into OpenSearch and a replica, 9 kill points. ``ICECDC_CRASH_SEED``
picks the moments (default 1818).

Issue 42's scenario (``run_catch_up_kills``): kills in a row, a commit round after each and no recovery in
between, inside catch-up ranges of the table with two sinks (its index and replica left apart), then ONE
plain sync: exit 0, both sinks equal to the source. Default run: the exports synced after the export kill,
then one kill with the sinks apart. ``-m slow``: six kills (the export, then five seeded catch-up moments)
for seeds 1818, 7 and 42.
"""

import os
import random
import time

import pytest

from tests.crash.scenario import (
    CATCH_UP_PHASES,
    CATCH_UP_SPREAD_S,
    KillPoint,
    KillResult,
    Lake,
    assert_killed_run_failed_over,
    assert_nothing_in_flight,
    kill_at,
    schedule,
    sinks_apart,
)

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
            lake.assert_counts_agreed(instance)
    finally:
        for i, (r, (killed_s, recovery_s)) in enumerate(zip(results, timings + [(0, 0)])):
            print(f"kill {i}: target {r.point.target} (+{r.point.delay_s:.2f}s) -> observed {r.observed}, "
                  f"killed={r.killed} after {killed_s:.1f}s, run in flight={r.run_id}; "
                  f"recovery sync {recovery_s:.1f}s")
        instance.dispose()
    return results


@pytest.mark.slow
def test_sigkill_at_seeded_moments_then_a_plain_sync_recovers(spark, catalog_settings, catalog, opensearch_url,
                                                               tmp_path):
    """Three seeded moments, each followed by a recovery sync (the default run kills the export in
    ``test_kills_inside_two_sink_catch_up_ranges_then_one_plain_sync_converges``)."""
    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=3_000, small_rows=200)
    lake.create()
    # The 3,000-row export's run takes ~3 s on a quiet machine: its kill lands in its first second.
    results = run_kill_rounds(lake, schedule(SEED, 3, export_window_s=(0.0, 1.0)))
    assert results[0].killed and results[0].run_id   # the export is always interrupted mid-run


KILLS = 4   # max_retries (3) + 1: a burst that would spend every retry if a dead worker counted as a failure


@pytest.mark.slow
def test_sigkill_at_nine_moments_over_a_100k_export(spark, catalog_settings, catalog, opensearch_url, tmp_path):
    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=100_000, small_rows=2_000,
                small_snapshots_per_run=1)
    lake.create()
    results = run_kill_rounds(lake, schedule(SEED, 9, export_window_s=(0.0, 8.0)))
    assert len(results) == 9 and results[0].killed and results[0].run_id



def catch_up_schedule(seed: int, count: int) -> list[KillPoint]:
    """The export first, then seeded kills inside catch-up ranges of the two-sink table: during a sink step
    before either sink has the range, or with its sinks apart (one committed, the other not)."""
    rng = random.Random(seed)
    targets = [rng.choice(CATCH_UP_PHASES) for _ in range(count - 1)]
    if "catch-up sinks apart" not in targets:       # every seed leaves the sinks apart at least once
        targets[rng.randrange(len(targets))] = "catch-up sinks apart"
    return [KillPoint("export", rng.uniform(0.0, 1.0))] + [
        KillPoint(target, rng.uniform(0, CATCH_UP_SPREAD_S[target])) for target in targets]


def run_catch_up_kills(lake: Lake, points: list[KillPoint], first_round: int = 0) -> list[tuple[KillResult, bool]]:
    """Issue 42's scenario: each kill followed by a commit round (three snapshots per table) and no recovery
    in between, so every sync fails over the last dead run and plans a longer range from the lowest sink;
    then ONE plain ``icecdc sync``: exit 0, both sinks equal the source. Returns each kill with whether it
    left the two-sink table's index and replica at different snapshots."""
    instance = lake.observer()
    results: list[tuple[KillResult, bool]] = []
    try:
        for round_no, point in enumerate(points, start=first_round):
            if round_no:
                lake.commit_round(round_no)
            known = {run.run_id for run in instance.get_runs()}
            result = kill_at(lake.sync(), instance, lake, point, known)
            results.append((result, sinks_apart(lake)))
        lake.commit_round(first_round + len(points))
        code, out = lake.sync_to_end()                        # one plain sync, no flag
        assert code == 0, f"the plain sync after {len(points)} kills failed:\n{out[-4000:]}"
        for result, _ in results:
            assert_killed_run_failed_over(instance, result)
        assert_nothing_in_flight(instance)
        lake.assert_no_lock_left()
        lake.assert_synced()
        lake.assert_counts_agreed(instance)
    finally:
        for i, (r, apart) in enumerate(results):
            print(f"kill {i}: target {r.point.target} (+{r.point.delay_s:.2f}s) -> observed {r.observed}, "
                  f"killed={r.killed}, run in flight={r.run_id}, sinks left apart={apart}; seen {' > '.join(r.seen)}")
        instance.dispose()
    return results


@pytest.mark.long
def test_kills_inside_two_sink_catch_up_ranges_then_one_plain_sync_converges(spark, catalog_settings, catalog,
                                                                            opensearch_url, tmp_path):
    """Default run: ``icecdc sync`` SIGKILLed in its export run (a seeded moment of its first second), a
    plain sync that fails the dead run over and converges; then one kill inside a catch-up range of the small
    table with its index and replica apart (one committed the range, the other not), a commit round, one
    plain sync (``-m slow``: six kills from the export on, several seeds; more seeded moments)."""
    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=3_000, small_rows=200)
    lake.create()
    # The 3,000-row export's run takes ~3 s on a quiet machine: its kill lands in its first second.
    [export] = run_kill_rounds(lake, schedule(SEED, 1, export_window_s=(0.0, 1.0)))
    assert export.killed and export.run_id             # the export is always interrupted mid-run
    results = run_catch_up_kills(lake, [KillPoint("catch-up sinks apart", 0.0)], first_round=1)
    ((catch_up, apart),) = results
    assert catch_up.killed and catch_up.observed == "catch-up sinks apart" and apart


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1818, 7, 42])
def test_six_kills_over_an_export_and_its_catch_up_ranges_then_one_plain_sync(spark, catalog_settings, catalog,
                                                                            opensearch_url, tmp_path, seed):
    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=20_000, small_rows=1_000)
    lake.create()
    results = run_catch_up_kills(lake, catch_up_schedule(seed, 6))
    assert results[0][0].killed and any(apart for _, apart in results[1:])


def kill_when_a_run_starts(lake: Lake, instance, known: set[str], delay_s: float) -> str | None:  # noqa: ANN001
    """Start ``icecdc sync`` and SIGKILL it ``delay_s`` after its first run is recorded (the run in
    flight, or None when the sync ended first). No wait for Spark: a burst of kills costs seconds."""
    import signal

    process = lake.sync()
    run_id = None
    while process.poll() is None and run_id is None:
        run_id = next((r.run_id for r in instance.get_runs(limit=3) if r.run_id not in known), None)
        time.sleep(0.02)
    deadline = time.monotonic() + delay_s
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if process.poll() is not None:
        return None
    process.send_signal(signal.SIGKILL)
    process.wait()
    return run_id


@pytest.mark.long
def test_a_burst_of_kills_never_spends_the_batchs_retries(spark, catalog_settings, catalog, opensearch_url, tmp_path):
    """``icecdc sync`` SIGKILLed in its export run KILLS times in a row, one more than ``max_retries: 3``
    (each kill followed by a new commit, no recovery in between), then ONE plain sync: it fails over the
    last dead run and converges. A dead worker is not a failed batch: the export's failure count stays 0
    although its key has more failed-over runs than the line allows retries."""
    import random

    from dagster import DagsterRunStatus, RunsFilter

    from icecdc_dagster.assets.naming import table_line
    from icecdc_dagster.config import load_config
    from icecdc_dagster.lines import line as lines
    from icecdc_dagster.run_tags import FAILED_OVER_TAG
    from tests.crash.scenario import BIG

    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=2_000, small_rows=100)
    lake.create()
    instance = lake.observer()
    rng = random.Random(SEED)
    try:
        killed: list[str] = []
        for round_no in range(KILLS):
            if round_no:                                      # a new commit after each kill
                spark.sql(f"INSERT INTO {lake.name}.{BIG} VALUES ({10_000 + round_no}, 'k{round_no}', {round_no})")
            known = {run.run_id for run in instance.get_runs()}
            run_id = kill_when_a_run_starts(lake, instance, known, rng.uniform(0.0, 1.5))
            assert run_id is not None, f"kill {round_no}: the sync ended before its run was killed"
            killed.append(run_id)
        code, out = lake.sync_to_end()                       # one plain sync, no flag
        assert code == 0, out[-4000:]
        assert "failed over a dead worker's run" in out
        for run_id in killed:
            assert instance.get_run_by_id(run_id).status == DagsterRunStatus.FAILURE
        assert_nothing_in_flight(instance)
        lake.assert_no_lock_left()
        lake.assert_synced()
        line = table_line(load_config(lake.config).table(BIG))
        key = lake.bootstrap[BIG]
        assert lines.failures_of(instance, line, key) == 0   # the batch's failure count is untouched
        failed = instance.get_runs(RunsFilter(tags={"icecdc/table": BIG, "icecdc/first_snapshot": key},
                                              statuses=[DagsterRunStatus.FAILURE]))
        assert len(failed) == KILLS and all(run.tags.get(FAILED_OVER_TAG) for run in failed)
    finally:
        instance.dispose()
