"""``sqlite_synchronous``: SQLite's ``PRAGMA synchronous`` on this process's connections to the Dagster
instance's own SQLite files, so a commit need not wait for the disk (docs/warm-launcher.md, "SQLite storage")."""

import os
import sqlite3
import threading
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.pool import Pool

if TYPE_CHECKING:
    from dagster import DagsterInstance

SQLITE_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_SQLITE_DIRS: dict[str, str] = {}  # directory -> PRAGMA synchronous for SQLite files under it (this process)
_SQLITE_HOOK = threading.Lock()
_sqlite_hook_installed = False


def check_sqlite_synchronous(mode: str) -> str:
    """``mode`` as SQLite spells it.

    Raises:
        ValueError: ``mode`` is none of :data:`SQLITE_SYNCHRONOUS`.
    """
    if mode.upper() not in SQLITE_SYNCHRONOUS:
        raise ValueError(f"WarmRunLauncher: sqlite_synchronous must be one of {', '.join(SQLITE_SYNCHRONOUS)}, "
                         f"got {mode!r}")
    return mode.upper()


def _sqlite_storage_dirs(instance: "DagsterInstance") -> set[str]:
    dirs = {os.path.abspath(instance.root_directory)}
    base = getattr(instance.event_log_storage, "_base_dir", None)  # SQLite event log: <storage>/history
    if isinstance(base, str):
        dirs |= {os.path.abspath(base), os.path.dirname(os.path.abspath(base))}
    return dirs


def set_sqlite_synchronous(instance: "DagsterInstance", mode: str) -> None:
    """``PRAGMA synchronous = mode`` on every SQLite connection this process opens to a file under
    the instance's directories (its SQLite storage), from now on. Other SQLite files (an Iceberg SQL
    catalog) keep their settings.

    Raises:
        ValueError: ``mode`` is none of :data:`SQLITE_SYNCHRONOUS`.
    """
    global _sqlite_hook_installed
    mode = check_sqlite_synchronous(mode)
    with _SQLITE_HOOK:
        for directory in _sqlite_storage_dirs(instance):
            _SQLITE_DIRS[directory + os.sep] = mode
        if _sqlite_hook_installed:
            return
        event.listen(Pool, "connect", _on_connect)
        _sqlite_hook_installed = True


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    if not isinstance(dbapi_connection, sqlite3.Connection) or not _SQLITE_DIRS:
        return
    files = [row[2] for row in dbapi_connection.execute("PRAGMA database_list").fetchall() if row[1] == "main"]
    path = os.path.abspath(files[0]) if files and files[0] else ""
    for directory, mode in _SQLITE_DIRS.items():
        if path.startswith(directory):
            dbapi_connection.execute(f"PRAGMA synchronous = {mode}")
            return
