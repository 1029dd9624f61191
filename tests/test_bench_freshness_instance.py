"""``bench/freshness.py --instance postgres``: each scenario's Dagster instance is on a database of its own,
named in ``dagster.yaml`` through an environment variable, and the database is gone afterwards."""

import os

import pytest

from bench.freshness import PG_SERVER, PG_URL_ENV, instance_storage, write_home

pytestmark = pytest.mark.postgres


def database_names(server: str) -> set[str]:
    import psycopg2

    conn = psycopg2.connect(f"{server}/postgres")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT datname FROM pg_database")
            return {row[0] for row in cur.fetchall()}
    finally:
        conn.close()


def test_a_postgres_scenario_runs_on_its_own_database_dropped_afterwards(tmp_path, monkeypatch):
    from dagster import DagsterInstance

    before = database_names(PG_SERVER)
    with instance_storage("postgres") as storage:
        url = os.environ[PG_URL_ENV]
        name = url.rsplit("/", 1)[1]
        assert name in database_names(PG_SERVER) - before
        write_home(tmp_path, "warm", storage=storage)
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
        instance = DagsterInstance.get()
        try:
            assert instance.run_storage.postgres_url == url  # the instance lives in the new database
            assert "sqlite_synchronous" not in (tmp_path / "dagster.yaml").read_text()
        finally:
            instance.dispose()
    assert name not in database_names(PG_SERVER)
    assert PG_URL_ENV not in os.environ


def test_a_sqlite_scenario_has_no_storage_block(tmp_path):
    with instance_storage("sqlite") as storage:
        assert storage is None
        write_home(tmp_path, "warm", sqlite_synchronous="OFF", storage=storage)
    text = (tmp_path / "dagster.yaml").read_text()
    assert "postgres" not in text and "sqlite_synchronous: 'OFF'" in text


def test_the_database_is_dropped_when_the_scenario_fails():
    with pytest.raises(RuntimeError, match="scenario failed"), instance_storage("postgres"):
        name = os.environ[PG_URL_ENV].rsplit("/", 1)[1]
        raise RuntimeError("scenario failed")
    assert name not in database_names(PG_SERVER)
