"""The Dagster instance on PostgreSQL (a database of its own per test, on 127.0.0.1:5432): the sensor's
runs in commit order, and a killed run worker failed over, exactly as on SQLite; the line lock is then a
PostgreSQL advisory lock that dies with its session."""

import os
import signal
import subprocess
import sys
import time

import pytest
from dagster import instance_for_test

from icecdc_dagster.errors import LineBusyError
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.line_lock import LineLock, holding
from icecdc_dagster.lease.pg_lock import PgLineLock
from tests.dagster_layer import test_sensor_runs

pytestmark = pytest.mark.postgres


@pytest.fixture
def instance(postgres_url):
    with instance_for_test(overrides={"storage": {"postgres": {"postgres_url": postgres_url}}}) as pg_instance:
        yield pg_instance


def test_the_line_lock_is_an_advisory_lock_that_dies_with_its_session(instance, postgres_url, tmp_path):
    lock = LineLock.for_instance(instance, "db.items")
    assert isinstance(lock, PgLineLock)
    me = Holder.current()
    with holding(lock, me):
        other = LineLock.for_instance(instance, "db.items")
        assert other.is_busy() and not other.try_acquire(me, grace_s=0.1)
        with pytest.raises(LineBusyError, match=f"pid {os.getpid()}, holding it since"):
            with holding(other, me):
                pass
        assert not LineLock.for_instance(instance, "db.other").is_busy()     # one lock per line
    assert not lock.is_busy()
    # A holder in another process is SIGKILLed: PostgreSQL ends its session, and with it the lock.
    script = ("import sys, time\nfrom icecdc_dagster.lease.pg_lock import PgLineLock\n"
              "from icecdc_dagster.lease.holder import Holder\n"
              f"lock = PgLineLock({postgres_url!r}, 'db.items')\nassert lock.try_acquire(Holder.current())\n"
              "print('held', flush=True)\ntime.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert lock.is_busy()
        assert lock.busy_owner().holder.pid == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 10
    while lock.is_busy():
        assert time.monotonic() < deadline, "the advisory lock outlived its holder's session"
        time.sleep(0.1)


def test_sensor_runs_every_snapshot_in_commit_order_on_postgres(spark, catalog_settings, catalog, instance, tmp_path):
    assert instance.run_storage.__class__.__name__ == "PostgresRunStorage"
    test_sensor_runs.test_sensor_requests_every_snapshot_in_commit_order(spark, catalog_settings, catalog, instance,
                                                                          tmp_path)


def test_killed_run_worker_is_failed_over_on_postgres(spark, catalog_settings, catalog, instance, tmp_path):
    test_sensor_runs.test_killed_sensor_launched_run_is_failed_over_by_the_next_tick(spark, catalog_settings, catalog,
                                                                                      instance, tmp_path)


def _sessions(postgres_url: str) -> int:
    """Sessions the server has seen on the test's database (PostgreSQL counts each as it is established)."""
    import psycopg2

    database = postgres_url.rsplit("/", 1)[1]
    conn = psycopg2.connect(postgres_url.replace("postgresql+psycopg2://", "postgresql://").rsplit("/", 1)[0]
                            + "/postgres")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", (database,))
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def _sessions_after(postgres_url: str, calls, at_least: int = 0) -> int:  # noqa: ANN001
    """New sessions ``calls()`` opened: the server's statistics arrive within a second or so."""
    before = _sessions(postgres_url)
    calls()
    deadline = time.time() + 10
    while True:
        time.sleep(1.0)
        opened = _sessions(postgres_url) - before
        if opened >= at_least or time.time() > deadline:
            return opened


def test_the_code_servers_sensor_instance_keeps_its_connection_between_calls(instance, postgres_url):
    """Dagster's PostgreSQL storages open a connection per call outside the webserver; the instance a code
    server's sensor ticks share (``line.share_instance``) keeps one, as the warm launcher's daemon does."""
    from dagster import build_sensor_context

    from icecdc_dagster.lines import line

    context = build_sensor_context(instance_ref=instance.get_ref())
    line.share_instance(context)
    shared = context.instance
    assert shared is not instance
    assert _sessions_after(postgres_url, lambda: [shared.get_runs_count() for _ in range(30)]) <= 2
    # The same calls on an instance as Dagster opens it: a session each.
    assert _sessions_after(postgres_url, lambda: [instance.get_runs_count() for _ in range(30)], at_least=30) >= 30


def test_a_kept_connection_killed_while_idle_is_replaced_not_failed(instance, postgres_url, monkeypatch):
    """PostgreSQL restarted (here: every session of the instance's database ended by the server) while the
    kept connection idled: the next call must succeed on a new connection, not fail the run that makes it."""
    import psycopg2

    from icecdc_dagster.lease import instance_connections

    monkeypatch.setattr(instance_connections, "PING_IDLE_S", 0.0)
    instance_connections.keep_connections_open(instance)
    assert instance.get_runs_count() == 0                              # the connection is now kept
    with psycopg2.connect(postgres_url.replace("postgresql+psycopg2://", "postgresql://")) as admin, \
            admin.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        assert cursor.fetchall()                                        # the kept session was ended
    assert instance.get_runs_count() == 0                               # a new connection, no error


def test_threads_calling_at_once_keep_a_connection_each(postgres_url):
    """The daemon's lanes and its own threads store asset events at once: with one kept connection per
    storage (the webserver's setting), every connection in use beside it was opened for the call and closed
    after (storing an asset event alone uses two). Kept per thread, the sessions stay few."""
    import threading

    from dagster import AssetMaterialization

    from icecdc_dagster.lease.instance_connections import keep_connections_open

    def calls(instance) -> None:  # noqa: ANN001
        barrier = threading.Barrier(8)

        def work() -> None:
            barrier.wait()
            for i in range(25):
                instance.report_runless_asset_event(AssetMaterialization("events", metadata={"i": i}))
                instance.get_runs_count()

        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    overrides = {"storage": {"postgres": {"postgres_url": postgres_url}}}
    with instance_for_test(overrides=overrides) as one_kept:
        keep_connections_open(one_kept)
        calls(one_kept)                                                   # the pools fill
        assert _sessions_after(postgres_url, lambda: calls(one_kept), at_least=40) >= 40   # 156 measured
    with instance_for_test(overrides=overrides) as per_thread:
        keep_connections_open(per_thread, threads=8)
        calls(per_thread)
        assert _sessions_after(postgres_url, lambda: calls(per_thread)) <= 8                      # 0 measured
