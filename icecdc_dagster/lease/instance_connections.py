"""A long-lived process keeps its instance's database connections open between calls.

Dagster's PostgreSQL storages open a new connection for every call (SQLAlchemy's ``NullPool``: "not
holding any connections open") except in the webserver, which asks them to keep one
(``optimize_for_webserver``). A daemon with warm lanes makes ~60 instance calls per batch and a code
server a few per table per sensor tick: each one a TCP connection, authentication and a new server
backend process (py-spy of a 50-table idle daemon and code server: connection set-up was the largest
share of both). The daemon's launcher and the code server's shared sensor instance ask for what the
webserver gets: a connection kept per storage, more opened when threads call at once (no limit,
never waiting), recycled hourly, no statement timeout. SQLite storages keep their behaviour (their
call is a no-op).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagster import DagsterInstance

RECYCLE_S = 3600  # a kept connection is replaced after an hour (a server restart's stale one at worst once)
NO_STATEMENT_TIMEOUT = 0
UNLIMITED_OVERFLOW = -1  # threads calling at once open more connections rather than wait for the kept one


def keep_connections_open(instance: "DagsterInstance") -> None:
    """Make ``instance``'s storages keep their database connections between calls (PostgreSQL; a no-op on
    SQLite). Call once per long-lived instance; later calls change nothing that matters."""
    instance.optimize_for_webserver(statement_timeout=NO_STATEMENT_TIMEOUT, pool_recycle=RECYCLE_S,
                                    max_overflow=UNLIMITED_OVERFLOW)
