"""Two ``icecdc sync`` processes on one line: never do both apply batches of one line at the same time
(their runs of a line never overlap), a loser exits 75 naming the winner (host, pid, since when) or, with
``--wait``, waits for it; no lock is ever left behind and the targets equal the source.

Default run: contention shown rather than hoped for (:func:`contend_with_a_paused_sync`, also run on a
PostgreSQL instance by ``test_postgres_syncs``). ``-m slow``: two syncs started in the same instant, twenty
times (which one wins is the race's)."""

import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, RunsFilter

from icecdc_dagster import run_tags
from icecdc_dagster.lease.failover import IN_FLIGHT
from icecdc_dagster.lease.holder import Holder
from tests.crash.scenario import BIG, SMALL, Lake, assert_nothing_in_flight

EXIT_BUSY = 75


def _runs_by_worker(instance, line: str, known: set[str]) -> dict[int, list[tuple[float, float]]]:  # noqa: ANN001
    spans: dict[int, list[tuple[float, float]]] = {}
    for record in instance.get_run_records(RunsFilter(tags={run_tags.TABLE_TAG: line})):
        if record.dagster_run.run_id in known:
            continue
        holder = Holder.from_tags(record.dagster_run.tags)
        spans.setdefault(holder.pid, []).append((record.start_time, record.end_time))
    return spans


def _assert_never_both_applying(instance, known: set[str]) -> None:  # noqa: ANN001
    for line in (BIG, SMALL):
        spans = _runs_by_worker(instance, line, known)
        workers = list(spans)
        for i, a in enumerate(workers):
            for b in workers[i + 1:]:
                for start_a, end_a in spans[a]:
                    for start_b, end_b in spans[b]:
                        assert end_a <= start_b or end_b <= start_a, \
                            f"{line}: runs of pid {a} and pid {b} overlap: {start_a}-{end_a} / {start_b}-{end_b}"


def run_pairs(lake: Lake, pairs: int, wait_every: int) -> list[tuple[int, int]]:
    instance = lake.observer()
    codes = []
    try:
        for pair in range(pairs):
            lake.commit_round(pair + 1)
            known = {run.run_id for run in instance.get_runs()}
            args = ("--wait",) if pair % wait_every == 0 else ()
            logs = [lake.root / f"pair{pair}-{side}.log" for side in "ab"]
            first, second = (lake.sync(*args, log=log) for log in logs)   # the same instant
            pair_codes = (first.wait(timeout=1200), second.wait(timeout=1200))
            codes.append(pair_codes)
            outputs = [log.read_text() for log in logs]
            for code, out, other in zip(pair_codes, outputs, (second, first)):
                if args:
                    assert code == 0, out[-3000:]          # --wait: the loser waits, then syncs
                    continue
                assert code in (0, EXIT_BUSY), out[-3000:]
                for busy in re.findall(r"BUSY: .*", out):   # the loser names the winner
                    assert f"icecdc sync on {socket.gethostname()} pid {other.pid}, holding it since" in busy, busy
                assert (code == EXIT_BUSY) == ("BUSY: " in out)
            _assert_never_both_applying(instance, known)
            lake.assert_no_lock_left()
            assert_nothing_in_flight(instance)
            if not args:                         # with --wait the loser synced after the winner: nothing left
                code, out = lake.sync_to_end()   # whatever a loser skipped is applied now
                assert code == 0, out[-3000:]
            lake.assert_synced()
    finally:
        print("exit codes per pair:", codes)
        instance.dispose()
    return codes


def _wait_for(condition, what: str, process, log: Path) -> None:  # noqa: ANN001
    while not condition():
        assert process.poll() is None, f"the sync ended before {what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def pause_holding_no_sqlite_write(pid: int, home: Path, attempts: int = 50) -> None:
    """SIGSTOP ``pid`` at a moment it holds no write transaction on the instance's SQLite files: paused inside
    one, every other process's write would fail "database is locked" (seen in CI), which is the pause, not
    the product. A PostgreSQL instance needs no such care (its variant pauses anywhere)."""
    import sqlite3

    files = sorted(home.rglob("*.db"))
    for _ in range(attempts):
        os.kill(pid, signal.SIGSTOP)
        try:
            for path in files:
                with sqlite3.connect(path, timeout=0.05) as conn:
                    conn.execute("BEGIN IMMEDIATE")  # fails at once while the paused process holds a write
                    conn.rollback()
            return
        except sqlite3.OperationalError:
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
    raise AssertionError(f"sync {pid} held a write on the instance's SQLite files at {attempts} pauses")


def contend_with_a_paused_sync(lake: Lake, observer: DagsterInstance, logs_dir: Path) -> None:
    """The first sync is paused (SIGSTOP) while it holds the big table's line, so a second sync finds the line
    busy and exits 75 naming it, and a third with ``--wait`` says it waits, then syncs once the first is
    resumed and done. Never both apply a line; nothing in flight, no lock left, the targets equal the source."""
    known = {run.run_id for run in observer.get_runs()}
    logs = [logs_dir / f"{name}.log" for name in ("first", "busy", "waiting")]
    first = lake.sync(log=logs[0])
    started = [first]
    try:
        # A run of the big table in flight: the first sync holds its line (read from the runs: probing the
        # lock would take it for a moment, and could make the first sync find it busy).
        _wait_for(lambda: any(r.run_id not in known for r in observer.get_runs(RunsFilter(
            tags={run_tags.TABLE_TAG: BIG}, statuses=IN_FLIGHT))), "it held the big table's line", first, logs[0])
        pause_holding_no_sqlite_write(first.pid, lake.home)  # paused while holding the line
        busy = lake.sync(log=logs[1])
        started.append(busy)
        assert busy.wait(timeout=600) == EXIT_BUSY, logs[1].read_text()[-3000:]
        [line] = [x for x in logs[1].read_text().splitlines() if x.startswith(f"{BIG}: ") and "BUSY: " in x]
        assert f"icecdc sync on {socket.gethostname()} pid {first.pid}, holding it since" in line, line
        waiting = lake.sync("--wait", log=logs[2])
        started.append(waiting)
        _wait_for(lambda: "waiting: " in logs[2].read_text(), "it waited", waiting, logs[2])
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=1200) == 0, logs[0].read_text()[-3000:]
        assert waiting.wait(timeout=1200) == 0, logs[2].read_text()[-3000:]
    finally:
        for process in started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
    _assert_never_both_applying(observer, known)
    assert_nothing_in_flight(observer)
    lake.assert_no_lock_left()
    lake.assert_synced()


@pytest.mark.long
def test_a_sync_holding_a_line_makes_the_next_exit_75_and_a_waiting_one_follow(spark, catalog_settings, catalog,
                                                                               opensearch_url, tmp_path):
    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=2_000, small_rows=100)
    lake.create()
    observer = lake.observer()
    try:
        contend_with_a_paused_sync(lake, observer, tmp_path)
    finally:
        observer.dispose()


@pytest.mark.slow
def test_two_syncs_started_together_never_both_apply(spark, catalog_settings, catalog, opensearch_url, tmp_path):
    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=2_000, small_rows=100)
    lake.create()
    codes = run_pairs(lake, pairs=2, wait_every=2)   # one pair with --wait, one without
    assert codes[0] == (0, 0)


@pytest.mark.slow
def test_two_syncs_started_together_twenty_times(spark, catalog_settings, catalog, opensearch_url, tmp_path):
    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=2_000, small_rows=100)
    lake.create()
    codes = run_pairs(lake, pairs=20, wait_every=5)
    assert len(codes) == 20
