"""The ingest ledger's horizon: Spark's file-source rule (``maxFileAge``) for landing files.

The ledger of a landing location would otherwise grow by one entry per batch for ever. As Spark's
``FileStreamSource`` does, a landing file's age is measured against the newest file time seen (the
landing's newest file, or the newest file the ledger records, whichever is later), not the wall clock:
a landing that is quiet, or an ingest that was paused, does not age its own backlog.

- Every batch records the newest modification time of its files (``FILE_TIME_PROPERTY``); a publish
  drops the ledger entries stamped before the horizon (``writer.exactly_once.LedgerRetention``).
- A landing file older than the horizon that no recorded batch holds is *expired*: it is not ingested
  and not dropped silently; the run over its partition names it (``expired_files``) and ``icecdc status``
  counts it. ``take_expired_files`` takes it anyway, but only when the ledger still answers for its age.
- A file at or below the newest file time the ledger ever dropped is beyond the ledger (*forgotten*): it
  may have been ingested before (a landing that is never cleaned holds many such files), so it is set
  aside as Spark does, named by a run over its partition, never taken by the setting, and not counted by
  status (giving it a new modification time is the operator's statement that it was never ingested).

A stream input's batch has no file: it is stamped with its commit time (:func:`stream_horizon`), and its
ledger entries are dropped by the same ``max_file_age``.
"""

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from icecdc_dagster.ingest.landing import LandingFile
from icecdc_dagster.writer import LedgerRetention, ledger_dropped_upto

FILE_TIME_PROPERTY = "icecdc.landing-file-time-ms"  # in a batch's summary and ledger entry
DEFAULT_MAX_FILE_AGE_S = 7 * 86400


@dataclass(frozen=True)
class Horizon:
    """Where the landing's ledger stops answering: files stamped before ``keep_from`` are past it."""

    max_age_ms: int
    newest_ms: int | None        # newest file time seen (landing listing and ledger)
    dropped_upto: int | None     # highest file time the ledger dropped (None: nothing dropped yet)

    @property
    def keep_from(self) -> int | None:
        return None if self.newest_ms is None else self.newest_ms - self.max_age_ms

    def expired(self, file: LandingFile) -> bool:
        keep_from = self.keep_from
        return keep_from is not None and file.mtime_ms is not None and file.mtime_ms < keep_from

    def takeable(self, file: LandingFile) -> bool:
        """An expired file the ledger can vouch was never ingested (newer than anything it dropped)."""
        return self.dropped_upto is None or (file.mtime_ms is not None and file.mtime_ms > self.dropped_upto)

    def retention(self) -> LedgerRetention | None:
        keep_from = self.keep_from
        return None if keep_from is None else LedgerRetention(FILE_TIME_PROPERTY, keep_from)


def horizon(max_age_s: float, listed: Sequence[LandingFile], recorded: Iterable[Mapping[str, str]],
            table_properties: Iterable[Mapping[str, str]]) -> Horizon:
    """The horizon from the landing listing, the recorded batch summaries and the ledger tables' properties."""
    times = [f.mtime_ms for f in listed if f.mtime_ms is not None]
    times += [int(s[FILE_TIME_PROPERTY]) for s in recorded if s.get(FILE_TIME_PROPERTY)]
    dropped = [d for d in (ledger_dropped_upto(p) for p in table_properties) if d is not None]
    return Horizon(int(max_age_s * 1000), max(times) if times else None, max(dropped) if dropped else None)


def now_ms() -> int:
    """The wall clock in ms: a stream batch's stamp is its commit time (a message has no file time)."""
    return time.time_ns() // 1_000_000


def stream_horizon(max_age_s: float, committed_ms: int, recorded: Iterable[Mapping[str, str]],
                   table_properties: Iterable[Mapping[str, str]]) -> Horizon:
    """The horizon of a stream input's ledger when a batch commits at ``committed_ms``: entries stamped more
    than ``max_age_s`` before the newest stamp (this commit, or a newer recorded one) are dropped. Dropping
    is safe for a stream: a re-delivery is skipped by the newest entry's position, which is always kept."""
    past = horizon(max_age_s, [], recorded, table_properties)
    newest = committed_ms if past.newest_ms is None else max(past.newest_ms, committed_ms)
    return Horizon(past.max_age_ms, newest, past.dropped_upto)


def file_time(files: Sequence[LandingFile]) -> str | None:
    """A batch's stamp: the newest modification time of its files."""
    times = [f.mtime_ms for f in files if f.mtime_ms is not None]
    return str(max(times)) if times else None


@dataclass(frozen=True)
class Split:
    """Landing files no batch records, split by the horizon."""

    fresh: list[LandingFile]       # within the horizon (or taken anyway): to ingest
    expired: list[LandingFile]     # past it, and the ledger vouches they were never ingested: counted
    forgotten: list[LandingFile]   # past it and at or below what the ledger dropped: ingested or not, unknown

    @property
    def set_aside(self) -> list[LandingFile]:
        return [*self.expired, *self.forgotten]


def split(files: Sequence[LandingFile], horizon_: Horizon, take_expired: bool) -> Split:
    """Files past the horizon are set aside; ``take_expired`` takes those the ledger vouches for."""
    fresh, expired, forgotten = [], [], []
    for f in files:
        if not horizon_.expired(f):
            fresh.append(f)
        elif not horizon_.takeable(f):
            forgotten.append(f)
        elif take_expired:
            fresh.append(f)
        else:
            expired.append(f)
    return Split(fresh, expired, forgotten)
