"""What every line lock does, whatever holds it (a file's ``flock`` or a PostgreSQL advisory lock): take it,
release it, probe it, and name who holds it. ``line_lock`` and ``pg_lock`` implement it."""

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from icecdc_dagster.lease.holder import Holder, iso, local_verdict


@dataclass(frozen=True)
class LockOwner:
    line_id: str
    holder: Holder
    acquired_at: float

    def describe(self) -> str:
        h = self.holder
        return f"{h.role} on {h.host} pid {h.pid}, holding it since {iso(self.acquired_at)}"


class LineLockContract(ABC):
    """The lock of one line. ``try_acquire`` / ``release`` from one thread; not reentrant (a second lock
    object of the same line in the same process is a different writer and loses)."""

    line_id: str

    @property
    @abstractmethod
    def held(self) -> bool:
        """Whether this object holds the lock now."""

    @property
    @abstractmethod
    def where(self) -> str:
        """What holds the lock, for logs."""

    @abstractmethod
    def try_acquire(self, holder: Holder, grace_s: float = 0.5) -> bool:
        """Take the lock if free (retrying for ``grace_s``: a sensor's probe holds it for microseconds) and
        record ``holder`` as its owner.

        Raises:
            RuntimeError: this object already holds the lock.
        """

    @abstractmethod
    def release(self) -> None:
        """Drop the lock if this object holds it."""

    @abstractmethod
    def recorded_owner(self) -> LockOwner | None:
        """Who the lock's record names (the current holder while the lock is busy; the last one otherwise)."""

    @abstractmethod
    def is_busy(self) -> bool:
        """Probe: is another writer holding the line right now? (takes and drops the lock)"""

    def busy_owner(self, settle_s: float = 1.0) -> LockOwner | None:
        """The owner of a busy lock. Right after a takeover the record may still name the previous
        (dead) holder for an instant: re-read until it names a live process, then give up."""
        deadline = time.monotonic() + settle_s
        while True:
            owner = self.recorded_owner()
            local = local_verdict(owner.holder) if owner else None
            if owner is not None and (local is None or local.alive):
                return owner
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
