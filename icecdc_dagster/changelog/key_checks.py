"""A batch's key check carried in the plan of the write that stores its rows.

Why: as an aggregate of its own, the check of a small batch was a Spark job of its own, planned, scheduled and
fed by a second read of the snapshot's files (~0.15 of a small batch's ~1 JVM CPU-s, bench/batch_profile.py).
Carried by the rows, the write that stores them evaluates it as it reads them: a bad key fails that write's
tasks, so the job aborts and nothing is committed, which is what the check was for (no sink sees the batch).

The failing task's error says only that a key is bad; on the way out of :func:`deferred_key_checks` the check
runs once more as the aggregate that names the smallest offending (snapshot, key), so the error a user reads
is the one an eager check raises. That second run happens only when a batch has already failed.
"""

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

# Per open block: the tag a failing task's message carries -> the check that names the offender.
_OPEN: ContextVar[dict[str, Callable[[], None]] | None] = ContextVar("icecdc_deferred_key_checks", default=None)
_FLAG = "__icecdc_key_check"


@contextmanager
def deferred_key_checks() -> Iterator[None]:
    """Inside the block, :func:`icecdc_dagster.changelog.changes` carries the key check of the rows it returns
    in their plan (see the module doc) instead of running it as a job of its own; use those rows inside the
    block. Without an open block every check runs eagerly, as it always did.

    Raises:
        DuplicateKeyChangeError, IdentifierColumnError: rows built inside the block were evaluated holding a
            key changed twice in one snapshot, or a null key (named as the eager check names it).
        Whatever else the ``with`` block raises passes through unchanged.
    """
    checks: dict[str, Callable[[], None]] = {}
    token = _OPEN.set(checks)
    try:
        yield
    except Exception as error:
        text = str(error)
        for tag, naming_check in list(checks.items()):
            if tag in text:
                naming_check()  # raises the named error
        raise
    finally:
        _OPEN.reset(token)


def carried(rows: DataFrame, bad: Column, naming_check: Callable[[], None], table: str) -> DataFrame | None:
    """``rows`` that fail the task evaluating them at a row where ``bad`` holds (a window expression may be
    given: it is selected before it is tested); None when no :func:`deferred_key_checks` block is open (the
    caller checks eagerly). ``naming_check`` raises the named error; it runs only after a failure."""
    checks = _OPEN.get()
    if checks is None:
        return None
    tag = f"icecdc-key-check-{uuid.uuid4().hex}"
    checks[tag] = naming_check
    failed = F.raise_error(F.lit(f"{tag}: table {table} holds a null key or a key changed twice in one snapshot"))
    return (rows.select("*", bad.alias(_FLAG))
            .where(F.when(F.col(_FLAG), failed).isNull())
            .drop(_FLAG))
