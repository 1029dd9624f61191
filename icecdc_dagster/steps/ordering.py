"""Which snapshot batch to run next for one table, so that S_k+1 never runs before S_k.

Pure logic over the partition keys (snapshot ids in commit order) and their
status; unit-tested without Dagster.
"""

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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
    # Only these assets (user strings, e.g. "opensearch/idx"); empty: every asset of the line. A sink
    # added to a running line joins at the line's applied key this way (its own export, nothing else runs).
    assets: tuple[str, ...] = ()

    @property
    def run_key(self) -> str:
        joining = f":join-{'+'.join(self.assets)}" if self.assets else ""
        return f"snapshots:{self.first_key}-{self.last_key}{joining}:attempt-{self.attempt}"


@dataclass(frozen=True)
class Blocked:
    key: str
    reason: str
    failed: bool = False  # True: the key used up its retries (an operator re-executes it)
    retry_at: float | None = None  # a transient failure waits for its backoff until then (epoch seconds)
    assets: tuple[str, ...] = ()  # the run that re-executes it covers only these (see NextRun.assets)


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
                  max_keys_per_run: int, max_retries: int,
                  runs: Mapping[str, int] | None = None) -> NextRun | Blocked | None:
    """The next run of the line, a reason why the line waits, or None when all is done.

    ``failures``: the failures per key that count against ``max_retries``; ``runs``: every failed
    run per key (dead workers and transient errors included), which numbers the next attempt so its
    run key is new (default: ``failures``).

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
        return NextRun(batch[0], batch[-1], tuple(batch), (runs or failures).get(key, attempts) + 1)
    return None
