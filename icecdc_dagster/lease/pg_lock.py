"""One writer per line on a PostgreSQL Dagster instance: a session-level advisory lock.

``pg_try_advisory_lock`` is taken on a connection of its own that lives exactly as long as the holder
holds the line; PostgreSQL releases the lock when that session ends, however the holder ends (exit,
SIGKILL, a lost host: the server drops the session), so nothing is ever left behind. It works for every
process of every host that shares the instance. The holder's identity (host, pid, process start, since
when) is written to ``icecdc_line_holders`` in the same database, so a loser can name it.
"""

import hashlib
import json
import time
from typing import Any

from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.lock_contract import LineLockContract, LockOwner

HOLDERS_TABLE = "icecdc_line_holders"


def lock_key(line_id: str) -> int:
    """The advisory lock's 64-bit key of a line (stable across processes and versions)."""
    return int.from_bytes(hashlib.sha256(f"icecdc/line/{line_id}".encode()).digest()[:8], "big", signed=True)


def postgres_url(instance: Any) -> str | None:
    """The PostgreSQL URL of the instance's run storage, or None when it is not on PostgreSQL."""
    url = getattr(instance.run_storage, "postgres_url", None)
    return str(url) if url else None


def _connect(url: str) -> Any:
    """A session of its own (autocommit), from a SQLAlchemy URL (``postgresql+psycopg2://``) or a libpq one."""
    import psycopg2  # type: ignore[import-untyped]

    scheme, rest = url.split("://", 1)
    conn = psycopg2.connect(f"{scheme.split('+', 1)[0]}://{rest}")
    conn.autocommit = True
    return conn


class PgLineLock(LineLockContract):
    """A line's lock held as a PostgreSQL advisory lock (shared by every host of the instance)."""

    def __init__(self, url: str, line_id: str) -> None:
        self.line_id = line_id
        self.url = url
        self.key = lock_key(line_id)
        self._conn: Any = None

    @property
    def held(self) -> bool:
        return self._conn is not None

    @property
    def where(self) -> str:
        return f"PostgreSQL advisory lock {self.key}"

    def try_acquire(self, holder: Holder, grace_s: float = 0.5) -> bool:
        if self._conn is not None:
            raise RuntimeError(f"line lock {self.line_id} is already held by this LineLock")
        conn = _connect(self.url)
        deadline = time.monotonic() + grace_s
        try:
            with conn.cursor() as cur:
                while True:
                    cur.execute("SELECT pg_try_advisory_lock(%s)", (self.key,))
                    if cur.fetchone()[0]:
                        break
                    if time.monotonic() >= deadline:
                        conn.close()
                        return False
                    time.sleep(0.05)
                record = {"line": self.line_id, "acquired_at": time.time(), "holder": holder.as_dict()}
                _ensure_table(cur)
                cur.execute(f"INSERT INTO {HOLDERS_TABLE} (line, record) VALUES (%s, %s) "
                            "ON CONFLICT (line) DO UPDATE SET record = EXCLUDED.record",
                            (self.line_id, json.dumps(record)))
        except BaseException:
            conn.close()  # the session ends: PostgreSQL drops its lock
            raise
        self._conn = conn
        return True

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            finally:
                conn.close()

    def recorded_owner(self) -> LockOwner | None:
        try:
            conn = _connect(self.url)
        except Exception:  # noqa: BLE001 - naming the owner is best effort
            return None
        try:
            with conn.cursor() as cur:
                _ensure_table(cur)
                cur.execute(f"SELECT record FROM {HOLDERS_TABLE} WHERE line = %s", (self.line_id,))
                row = cur.fetchone()
            record = row[0] if row and isinstance(row[0], dict) else json.loads(row[0]) if row else None
            if record is None:
                return None
            return LockOwner(record["line"], Holder.from_dict(record["holder"]), float(record["acquired_at"]))
        except (ValueError, KeyError, TypeError):
            return None
        finally:
            conn.close()

    def is_busy(self) -> bool:
        """Probe: is another session holding the line right now? (takes and drops the lock)"""
        conn = _connect(self.url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s)", (self.key,))
                free = bool(cur.fetchone()[0])
                if free:
                    cur.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            return not free
        finally:
            conn.close()


def _ensure_table(cur: Any) -> None:
    cur.execute(f"CREATE TABLE IF NOT EXISTS {HOLDERS_TABLE} (line TEXT PRIMARY KEY, record JSONB NOT NULL)")
