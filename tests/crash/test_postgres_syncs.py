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
from tests.crash.test_concurrent_syncs import run_pairs

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
    from icecdc_dagster.lease.dagster_yaml import ensure_dagster_yaml

    monkeypatch.setenv(URL_ENV, postgres_url)     # the syncs inherit it
    lake = PostgresLake(spark, catalog, catalog_settings, tmp_path, opensearch_url, big_rows=2_000, small_rows=100,
                        postgres_url=postgres_url)
    lake.create()
    assert ensure_dagster_yaml(lake.home, URL_ENV)   # what the first icecdc command writes (the observer opens it)
    observer = lake.observer()
    assert type(observer.run_storage).__name__ == "PostgresRunStorage"
    observer.dispose()
    codes = run_pairs(lake, pairs=2, wait_every=2)
    assert codes[0] == (0, 0)                        # --wait: both succeed, one after the other
    assert any(75 in pair for pair in codes[1:]) or codes[1] == (0, 0)
    instance = lake.observer()
    try:
        assert instance.get_runs_count() > 0 and not (lake.home / "history").exists()   # runs are in PostgreSQL
    finally:
        instance.dispose()
