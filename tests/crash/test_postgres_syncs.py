"""Two ``icecdc sync`` processes started in the same instant on a Dagster instance in PostgreSQL (the
pipeline file's ``instance: {storage: postgres}``): the ``dagster.yaml`` that ``icecdc`` writes puts runs
and events in the database, the line lock is a PostgreSQL advisory lock, never both apply a line, the
loser names the winner, no lock is left and the targets equal the source."""

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


@pytest.mark.long
def test_two_syncs_at_once_on_a_postgres_instance(spark, catalog_settings, catalog, opensearch_url, tmp_path,
                                                 postgres_url, monkeypatch):
    """They contend, shown rather than hoped for: the first sync is paused (SIGSTOP) while it holds the big
    table's advisory lock, so a second sync finds the line busy and exits 75 naming it, and a third with
    ``--wait`` says it waits, then syncs once the first is resumed and done. Never both apply a line."""
    from icecdc_dagster.lease.dagster_yaml import ensure_dagster_yaml
    from tests.crash.test_concurrent_syncs import contend_with_a_paused_sync

    monkeypatch.setenv(URL_ENV, postgres_url)     # the syncs inherit it
    lake = PostgresLake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=2_000, small_rows=100,
                        postgres_url=postgres_url)
    lake.create()
    assert ensure_dagster_yaml(lake.home, URL_ENV)   # what the first icecdc command writes (the observer opens it)
    observer = lake.observer()
    assert type(observer.run_storage).__name__ == "PostgresRunStorage"
    assert isinstance(LineLock.for_instance(observer, BIG), PgLineLock)
    try:
        contend_with_a_paused_sync(lake, observer, tmp_path)
        assert observer.get_runs_count() > 0 and not (lake.home / "history").exists()   # runs are in PostgreSQL
    finally:
        observer.dispose()

