"""A long-lived process keeps its instance's database connections open between calls.

Dagster's PostgreSQL storages open a new connection for every call (SQLAlchemy's ``NullPool``: "not
holding any connections open") except in the webserver, which asks them to keep one
(``optimize_for_webserver``). A daemon with warm lanes makes ~60 instance calls per batch and a code
server a few per table per sensor tick: each one a TCP connection, authentication and a new server
backend process (py-spy of a 50-table idle daemon and code server: connection set-up was the largest
share of both). The daemon's launcher and the code server's shared sensor instance ask for what the
webserver gets: connections kept per storage (one; the daemon one per thread that calls at once, its
lanes and its own), more opened when more threads call at once (no limit, never waiting), recycled
hourly, no statement timeout. SQLite storages keep their behaviour (their
call is a no-op).

A kept connection can be dead when it is next used: PostgreSQL restarted, or a proxy dropped it while
idle. Used, it would fail that call once (and with it the run or tick that made it: a lane's run then
spends a retry of its batch). So a kept PostgreSQL connection idle for :data:`PING_IDLE_S` or more is
checked (``SELECT 1``) when it is taken from the pool, and replaced if the check fails: SQLAlchemy's
``DisconnectionError`` protocol. Calls in quick succession, a lane's during a run, are not checked.
This holds for every kept (``QueuePool``) PostgreSQL connection of the process, e.g. a PostgreSQL
Iceberg catalog's too.
"""

import threading
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import event, exc
from sqlalchemy.pool import QueuePool

if TYPE_CHECKING:
    from dagster import DagsterInstance

RECYCLE_S = 3600  # a kept connection is replaced after an hour (a server restart's stale one at worst once)
NO_STATEMENT_TIMEOUT = 0
UNLIMITED_OVERFLOW = -1  # threads calling at once open more connections rather than wait for the kept one
PING_IDLE_S = 5.0  # a kept connection idle this long is checked before it is used again
_RETURNED_AT = "icecdc_returned_at"
_PING_HOOK = threading.Lock()
_ping_installed = False


def keep_connections_open(instance: "DagsterInstance", threads: int = 1) -> None:
    """Make ``instance``'s storages keep their database connections between calls (PostgreSQL; a no-op on
    SQLite). Call once per long-lived instance; later calls change nothing that matters.

    ``threads``: how many threads of the process call the instance at once (the daemon: its lanes and its
    own daemons). Each storage keeps that many connections, the event log twice as many: storing an asset
    event holds one connection and opens a second (Dagster's tag and table checks). The webserver's
    setting keeps one: any other connection in use at the same time is opened for the call and closed
    after it, and with three lanes writing asset events that was most of them (py-spy of a 20-table
    daemon: 4.9 % of its CPU opening connections, each a new server process)."""
    instance.optimize_for_webserver(statement_timeout=NO_STATEMENT_TIMEOUT, pool_recycle=RECYCLE_S,
                                    max_overflow=UNLIMITED_OVERFLOW)
    if threads > 1:
        _keep_per_thread(instance, threads)
    check_idle_connections()


def _keep_per_thread(instance: "DagsterInstance", threads: int) -> None:
    """Dagster's ``optimize_for_webserver`` with a larger ``pool_size`` (it fixes 1): the same engine
    settings, on the storages that have a PostgreSQL engine."""
    sizes = {id(s): (s, n) for s, n in ((instance.run_storage, threads), (instance.schedule_storage, threads),
                                         (instance.event_log_storage, 2 * threads))}
    for storage, size in sizes.values():
        engine = getattr(storage, "_engine", None)
        url = getattr(storage, "postgres_url", None)
        if engine is None or url is None or not isinstance(engine.pool, QueuePool):
            continue  # SQLite, or not the PostgreSQL storages we know
        from dagster_postgres.utils import create_pg_engine  # PostgreSQL instances only: not loaded on SQLite

        kwargs: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", "pool_size": size, "pool_recycle": RECYCLE_S,
                                  "max_overflow": UNLIMITED_OVERFLOW}
        options = engine.url.query.get("options")
        if options:
            kwargs["connect_args"] = {"options": options}
        setattr(storage, "_engine", create_pg_engine(url, getattr(storage, "_token_provider", None), **kwargs))  # noqa: B010
        engine.dispose()


def check_idle_connections() -> None:
    """From now on, this process checks a kept PostgreSQL connection that was idle before it is used."""
    global _ping_installed
    with _PING_HOOK:
        if not _ping_installed:
            event.listen(QueuePool, "checkin", _returned)
            event.listen(QueuePool, "checkout", _check_if_idle)
            _ping_installed = True


def _returned(dbapi_connection: Any, record: Any) -> None:
    if record is not None:
        record.info[_RETURNED_AT] = time.monotonic()


def _check_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    returned = record.info.get(_RETURNED_AT)
    if returned is None or time.monotonic() - returned < PING_IDLE_S or not _is_postgres(dbapi_connection):
        return
    try:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as error:  # noqa: BLE001 - any failure: the pool replaces the connection
        raise exc.DisconnectionError(f"a kept PostgreSQL connection was dead after idling: {error}") from error


def _is_postgres(dbapi_connection: Any) -> bool:
    return type(dbapi_connection).__module__.startswith(("psycopg2", "psycopg"))
