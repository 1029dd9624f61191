"""Two ``icecdc sync`` processes started in the same instant on a Dagster instance in PostgreSQL (the
pipeline file's ``instance: {storage: postgres}``): the ``dagster.yaml`` that ``icecdc`` writes puts runs
and events in the database, the line lock is a PostgreSQL advisory lock, never both apply a line, the
loser names the winner, no lock is left and the targets equal the source."""

import os
import signal
import time
from dataclasses import dataclass

import pytest
import yaml

from icecdc_dagster.lease.line_lock import LineLock
from icecdc_dagster.lease.pg_lock import PgLineLock
from tests.crash.scenario import BIG, SMALL, Lake

pytestmark = pytest.mark.postgres
URL_ENV = "ICECDC_TEST_DAGSTER_PG_URL"


@dataclass
class PostgresLake(Lake):
    postgres_url: str = ""

    def create(self) -> None:
        super().create()
        config = yaml.safe_load(self.config.read_text())
        config["instance"] = {"storage": "postgres", "postgres_url": {"env": URL_ENV}}
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))

    def assert_no_lock_left(self) -> None:
        instance = self.observer()
        try:
            for line in (BIG, SMALL):
                lock = LineLock.for_instance(instance, line)
                assert isinstance(lock, PgLineLock), "the line lock of a PostgreSQL instance is an advisory lock"
                assert not lock.is_busy(), f"the line lock of {line} is still held"
        finally:
            instance.dispose()


def _wait_for(condition, what: str, process, log) -> None:  # noqa: ANN001
    while not condition():
        assert process.poll() is None, f"the sync ended before {what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


@pytest.mark.long
def test_two_syncs_at_once_on_a_postgres_instance(spark, catalog_settings, catalog, opensearch_url, tmp_path,
                                                 postgres_url, monkeypatch):
    """They contend, shown rather than hoped for: the first sync is paused (SIGSTOP) while it holds the big
    table's advisory lock, so a second sync finds the line busy and exits 75 naming it, and a third with
    ``--wait`` says it waits, then syncs once the first is resumed and done. Never both apply a line."""
    from dagster import RunsFilter

    from icecdc_dagster import run_tags
    from icecdc_dagster.cli import EXIT_BUSY
    from icecdc_dagster.lease.dagster_yaml import ensure_dagster_yaml
    from icecdc_dagster.lease.failover import IN_FLIGHT
    from tests.crash.scenario import assert_nothing_in_flight
    from tests.crash.test_concurrent_syncs import _assert_never_both_applying

    monkeypatch.setenv(URL_ENV, postgres_url)     # the syncs inherit it
    lake = PostgresLake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=2_000, small_rows=100,
                        postgres_url=postgres_url)
    lake.create()
    assert ensure_dagster_yaml(lake.home, URL_ENV)   # what the first icecdc command writes (the observer opens it)
    observer = lake.observer()
    assert type(observer.run_storage).__name__ == "PostgresRunStorage"
    assert isinstance(LineLock.for_instance(observer, BIG), PgLineLock)
    known = {run.run_id for run in observer.get_runs()}
    logs = [tmp_path / f"{name}.log" for name in ("first", "busy", "waiting")]
    first = lake.sync(log=logs[0])
    try:
        # A run of the big table in flight: the first sync holds its line (read from the runs: probing the
        # advisory lock would take it for a moment, and could make the first sync find it busy).
        _wait_for(lambda: any(r.run_id not in known for r in observer.get_runs(RunsFilter(
            tags={run_tags.TABLE_TAG: BIG}, statuses=IN_FLIGHT))), "it held the big table's line", first, logs[0])
        os.kill(first.pid, signal.SIGSTOP)           # paused while holding the advisory lock
        busy = lake.sync(log=logs[1])
        assert busy.wait(timeout=600) == EXIT_BUSY, logs[1].read_text()[-3000:]
        [line] = [x for x in logs[1].read_text().splitlines() if x.startswith(f"{BIG}: ") and "BUSY: " in x]
        assert f"pid {first.pid}, holding it since" in line, line
        waiting = lake.sync("--wait", log=logs[2])
        _wait_for(lambda: "waiting: " in logs[2].read_text(), "it waited", waiting, logs[2])
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=1200) == 0, logs[0].read_text()[-3000:]
        assert waiting.wait(timeout=1200) == 0, logs[2].read_text()[-3000:]
    finally:
        for process in (first, *[p for p in (locals().get("busy"), locals().get("waiting")) if p is not None]):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
        observer.dispose()
    instance = lake.observer()
    try:
        _assert_never_both_applying(instance, known)
        assert_nothing_in_flight(instance)
        assert instance.get_runs_count() > 0 and not (lake.home / "history").exists()   # runs are in PostgreSQL
    finally:
        instance.dispose()
    lake.assert_no_lock_left()
    lake.assert_synced()
