"""Two ``icecdc sync`` processes started in the same instant, again and again: never do both apply
batches of one line at the same time (their runs of a line never overlap), a loser exits 75 naming
the winner (host, pid, since when) or, with ``--wait``, waits for it; no lock is ever left behind
and the targets equal the source after every pair."""

import re
import socket

import pytest
from dagster import RunsFilter

from icecdc_dagster import run_tags
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


@pytest.mark.long
def test_two_syncs_started_together_never_both_apply(spark, catalog_settings, catalog, opensearch_url, tmp_path):
    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=2_000, small_rows=100)
    lake.create()
    codes = run_pairs(lake, pairs=2, wait_every=2)   # one pair with --wait, one without (20 under -m slow)
    assert codes[0] == (0, 0)


@pytest.mark.slow
def test_two_syncs_started_together_twenty_times(spark, catalog_settings, catalog, opensearch_url, tmp_path):
    lake = Lake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=2_000, small_rows=100)
    lake.create()
    codes = run_pairs(lake, pairs=20, wait_every=5)
    assert len(codes) == 20
