"""Which snapshot batch to run next for one table, so that S_k+1 never runs before S_k.

Pure logic over the partition keys (snapshot ids in commit order) and their
status; unit-tested without Dagster.
"""

import enum
from dataclasses import dataclass
from collections.abc import Mapping, Sequence


class KeyStatus(enum.Enum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    FAILED = "failed"
    DONE = "done"


@dataclass(frozen=True)
class NextRun:
    first_key: str
    last_key: str
    keys: tuple[str, ...]
    attempt: int

    @property
    def run_key(self) -> str:
        return f"snapshots:{self.first_key}-{self.last_key}:attempt-{self.attempt}"


@dataclass(frozen=True)
class Blocked:
    key: str
    reason: str
    failed: bool = False  # True: the key used up its retries (an operator re-executes it)


def combine_status(statuses: Sequence[KeyStatus | None]) -> KeyStatus:
    """One key's status over all assets of the table (changelog + every sink)."""
    if any(s is KeyStatus.IN_PROGRESS for s in statuses):
        return KeyStatus.IN_PROGRESS
    if any(s is KeyStatus.FAILED for s in statuses):
        return KeyStatus.FAILED
    if statuses and all(s is KeyStatus.DONE for s in statuses):
        return KeyStatus.DONE
    return KeyStatus.PENDING


def plan_next_run(keys: Sequence[str], status: Mapping[str, KeyStatus], failures: Mapping[str, int],
                  max_keys_per_run: int, max_retries: int) -> NextRun | Blocked | None:
    """The next run of the line, a reason why the line waits, or None when all is done.

    - Only the first key that is not done may run; a key in progress blocks the line.
    - A failed key is retried (up to ``max_retries`` times) before anything after it.
    - Several pending keys may run together (a catch-up range), never past a failed one.
    """
    for index, key in enumerate(keys):
        state = status.get(key, KeyStatus.PENDING)
        if state is KeyStatus.DONE:
            continue
        if state is KeyStatus.IN_PROGRESS:
            return Blocked(key, f"{key} is in progress")
        attempts = failures.get(key, 0)
        if state is KeyStatus.FAILED and attempts > max_retries:
            return Blocked(key, f"{key} failed {attempts} times; re-execute it to unblock the line", failed=True)
        batch = [key]
        if state is KeyStatus.PENDING:
            for later in keys[index + 1:]:
                if len(batch) >= max_keys_per_run or status.get(later, KeyStatus.PENDING) is not KeyStatus.PENDING:
                    break
                batch.append(later)
        return NextRun(batch[0], batch[-1], tuple(batch), attempts + 1)
    return None
