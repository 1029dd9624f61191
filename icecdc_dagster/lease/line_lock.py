"""One writer per line: an exclusive ``flock`` on ``$DAGSTER_HOME/icecdc/locks/<line>.lock``.

The kernel releases the lock when its holder's process ends, however it ends (exit, SIGKILL, OOM
kill), so a crashed writer never leaves a lock behind and nothing has to be cleaned up; the file
itself stays (deleting lock files is what makes file locks racy). The holder writes who it is
(host, pid, process start, since when) into the locked file, so a loser can name it. It works for
every process of one host (or a shared file system whose ``flock`` is real); instances shared by
several hosts need an instance-wide lock instead: on a PostgreSQL instance, :meth:`LineLock.for_instance`
gives the advisory lock of ``lease.pg_lock``, which dies with its session.
"""

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from icecdc_dagster.errors import LineBusyError, SyncInterruptedError
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.lock_contract import LineLockContract, LockOwner
from icecdc_dagster.lease.pg_lock import PgLineLock, postgres_url

if TYPE_CHECKING:
    from dagster import DagsterInstance

LOCK_DIR = ("icecdc", "locks")


class LineLock(LineLockContract):
    """The lock of one line as a file lock under ``root`` (the instance's directory); the contract is
    :class:`LineLockContract`'s."""

    def __init__(self, root: str | Path, line_id: str) -> None:
        self.line_id = line_id
        self.path = Path(root, *LOCK_DIR, quote(line_id, safe="") + ".lock")
        self._fd: int | None = None

    @classmethod
    def for_instance(cls, instance: "DagsterInstance", line_id: str) -> LineLockContract:
        """The line's lock where the instance lives: a PostgreSQL advisory lock on a PostgreSQL instance
        (shared by every host), else a file lock under ``$DAGSTER_HOME``."""
        url = postgres_url(instance)
        return PgLineLock(url, line_id) if url else cls(instance.root_directory, line_id)

    @property
    def held(self) -> bool:
        return self._fd is not None

    @property
    def where(self) -> str:
        """What holds the lock, for logs: the lock file."""
        return str(self.path)

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    def try_acquire(self, holder: Holder, grace_s: float = 0.5) -> bool:
        if self._fd is not None:
            raise RuntimeError(f"line lock {self.line_id} is already held by this LineLock")
        fd = self._open()
        deadline = time.monotonic() + grace_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
        record = {"line": self.line_id, "acquired_at": time.time(), "holder": holder.as_dict()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def recorded_owner(self) -> LockOwner | None:
        try:
            record = json.loads(self.path.read_text() or "null")
            return LockOwner(record["line"], Holder.from_dict(record["holder"]), float(record["acquired_at"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def is_busy(self) -> bool:
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the probe's lock
        return False


def busy_message(lock: LineLockContract) -> str:
    owner = lock.busy_owner()
    who = owner.describe() if owner else "a process that is just taking it"
    return f"{lock.line_id} is being written by {who}"


@contextmanager
def holding(lock: LineLockContract, holder: Holder, wait: bool = False, poll_s: float = 0.25,
            on_wait: Callable[[str], None] | None = None,
            stop_requested: Callable[[], bool] | None = None) -> Iterator[LineLockContract]:
    """Hold the line for the block. Busy: raise ``LineBusyError`` naming the holder, or with ``wait``
    poll until it is free (``stop_requested`` ends the wait with ``SyncInterruptedError``)."""
    if not lock.try_acquire(holder):
        message = busy_message(lock)
        if not wait:
            raise LineBusyError(message)
        if on_wait:
            on_wait(f"waiting: {message}")
        while not lock.try_acquire(holder, grace_s=0):
            if stop_requested and stop_requested():
                raise SyncInterruptedError(f"stopped while waiting for {lock.line_id}")
            time.sleep(poll_s)
    try:
        yield lock
    finally:
        lock.release()
