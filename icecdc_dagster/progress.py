"""What ``icecdc sync`` shows while it runs: a pure model (events in, one row per line out).

The sync reports events (a line's plan before any batch runs, a batch starting and ending, a line
ending); the model keeps, per configured line, its state, batches done and pending, the records of
the batch in flight when the plan knows them, and the line's elapsed time. Rendering (a live table on
a terminal, plain lines elsewhere) lives in ``progress_display`` and only reads ``rows()``: the model
has no I/O and takes its clock as an argument, so it is unit-tested without a terminal or a sync.

The total is measured from the start of the process (``process_started``), not from some inner
step: interpreter start, imports, the Dagster instance and the SparkSession all count.
"""

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

WAITING = "waiting"    # not started yet
PLANNING = "planning"  # between batches: the line reads what is pending next
EXPORT = "export"


@dataclass(frozen=True)
class LineRow:
    """One line of the display, as it stands now."""

    line: str
    state: str                # "waiting", "export", "applying snapshot N", "done", "blocked: ..."
    done: int                 # batches this sync finished (successful or not)
    pending: int | None       # batches still to run, the one in flight included (None: unknown)
    rows: int | None          # records the batch in flight reads, from snapshot summaries (not shown: rows
                              # read are not change events; a 3-row delete may rewrite 1,000 rows)
    elapsed: float            # seconds since the line started (frozen when it ended); 0 before it starts
    failed: int = 0           # of ``done``, the batches whose run did not succeed
    batch: str | None = None  # the batch in flight, else the last one ("first..last" keys)
    batch_seconds: float | None = None  # how long the last finished batch took
    events: int = 0           # change events this sync's batches of the line applied (their metadata's)
    last_events: int | None = None  # those of the last finished batch (None: its metadata does not say)


@dataclass
class _Line:
    row: LineRow
    pending_keys: int = 0
    per_batch: int = 1
    started: float | None = None
    ended: float | None = None
    batch_started: float = 0.0
    batch_keys: int = 0


def batches_for(keys: int, per_batch: int, export_first: bool = False) -> int:
    """Batches that ``keys`` pending keys take: the export runs alone, the rest ``per_batch`` at a time."""
    if keys <= 0:
        return 0
    if export_first:
        return 1 + batches_for(keys - 1, per_batch)
    return math.ceil(keys / max(per_batch, 1))


def snapshot_state(first: str, last: str, keys: int) -> str:
    """The state of a line applying snapshot keys ``first``..``last`` (``keys`` of them)."""
    return f"applying snapshot {first}" if keys <= 1 else f"applying snapshots {first}..{last} ({keys})"


class SyncProgress:
    """Events in, rows out. ``clock``: monotonic seconds (injected in tests); ``started``: the clock's
    reading at the start of the command (default: the process start, see ``process_started``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, started: float | None = None,
                 on_change: Callable[[str, LineRow], None] | None = None) -> None:
        """``on_change``: called with each event's name and the line's row after it (plain output)."""
        self.clock = clock
        self.started = process_started(clock) if started is None else started
        self.lines: dict[str, _Line] = {}
        self.lock = threading.RLock()  # a live display reads rows from its refresh thread
        self.on_change = on_change

    def planned(self, line: str, pending_keys: int | None, per_batch: int = 1, export_first: bool = False,
                state: str = WAITING) -> LineRow:
        """The line's plan before its next batch: keys pending (None: the plan could not tell) and how
        many go in a batch; the export of a line's bootstrap runs alone. Keeps what is done."""
        with self.lock:
            entry = self.lines.get(line) or _Line(LineRow(line, state, 0, 0, None, 0.0))
            pending = None if pending_keys is None else batches_for(pending_keys, per_batch, export_first)
            entry.pending_keys, entry.per_batch = pending_keys or 0, per_batch
            entry.row = replace(entry.row, state=state if entry.started is None else entry.row.state,
                                pending=pending)
            self.lines[line] = entry
        return self.changed("planned", line)

    def line_started(self, line: str) -> LineRow:
        with self.lock:
            entry = self._entry(line)
            entry.started, entry.ended = self.clock(), None
            entry.row = replace(entry.row, state=PLANNING)
        return self.changed("line_started", line)

    def batch_started(self, line: str, batch: str, state: str, keys: int = 1, rows: int | None = None) -> LineRow:
        """A batch of ``keys`` pending keys is running; ``rows``: its records as metadata counts them."""
        with self.lock:
            entry = self._entry(line)
            entry.batch_started = self.clock()
            if entry.started is None:
                entry.started = entry.batch_started
            entry.pending_keys, entry.batch_keys = max(entry.pending_keys - keys, 0), keys
            later = batches_for(entry.pending_keys, entry.per_batch)
            entry.row = replace(entry.row, state=state, rows=rows, pending=1 + later, batch=batch)
        return self.changed("batch_started", line)

    def batch_finished(self, line: str, ok: bool, events: int | None = None) -> LineRow:
        """A batch ended; one that failed stays pending (it is retried, or blocks the line). ``events``: the
        change events it applied, as its materialisations count them."""
        with self.lock:
            entry = self._entry(line)
            pending = entry.row.pending
            if not ok:
                entry.pending_keys += entry.batch_keys
                pending = None if pending is None else pending + 1
            entry.row = replace(entry.row, done=entry.row.done + 1, failed=entry.row.failed + (not ok),
                                pending=None if pending is None else max(pending - 1, 0), rows=None,
                                state=PLANNING, batch_seconds=self.clock() - entry.batch_started,
                                events=entry.row.events + (events or 0), last_events=events)
        return self.changed("batch_finished" if ok else "batch_failed", line)

    def line_finished(self, line: str, outcome: str = "done", drained: bool = True) -> LineRow:
        """``drained``: nothing of the line is left (its pending count drops to 0)."""
        with self.lock:
            entry = self._entry(line)
            now = self.clock()
            entry.started = now if entry.started is None else entry.started
            entry.ended = now
            entry.row = replace(entry.row, state=outcome, rows=None, pending=0 if drained else entry.row.pending)
        return self.changed("line_finished", line)

    def changed(self, event: str, line: str) -> LineRow:
        """The line's row after ``event``, passed to ``on_change`` too (outside the lock: a live display's
        redraw takes its own lock, and its refresh thread takes both in that order)."""
        with self.lock:
            row = self.row(line)
        if self.on_change is not None:
            self.on_change(event, row)
        return row

    def row(self, line: str) -> LineRow:
        entry = self.lines[line]
        if entry.started is None:
            return replace(entry.row, elapsed=0.0)
        end = entry.ended if entry.ended is not None else self.clock()
        return replace(entry.row, elapsed=max(end - entry.started, 0.0))

    def rows(self) -> list[LineRow]:
        """Every line, in the order they were first reported (the order the sync runs them)."""
        with self.lock:
            return [self.row(line) for line in self.lines]

    def total(self) -> float:
        """Seconds since the command started."""
        return max(self.clock() - self.started, 0.0)

    def _entry(self, line: str) -> _Line:
        if line not in self.lines:  # a line the plan did not know: it appears when it first reports
            self.lines[line] = _Line(LineRow(line, WAITING, 0, None, None, 0.0))
        return self.lines[line]


def describe(row: LineRow) -> str:
    """One plain line for a log: ``db.t: export, batches 0 done / 1 pending, 1,000 change events, elapsed 2.1s``
    (the change events the line's finished batches applied)."""
    failed = f" ({row.failed} failed)" if row.failed else ""
    pending = "?" if row.pending is None else str(row.pending)
    return (f"{row.line}: {row.state}, batches {row.done} done{failed} / {pending} pending, "
            f"{row.events:,} change events, elapsed {row.elapsed:.1f}s")


def process_age(proc: str = "/proc") -> float | None:
    """Seconds since this process started, from the kernel (``/proc/self/stat`` against
    ``/proc/uptime``); None where there is no /proc."""
    try:
        with open(f"{proc}/self/stat") as stat, open(f"{proc}/uptime") as uptime:
            fields = stat.read().rsplit(")", 1)[1].split()
            up = float(uptime.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    started_ticks = int(fields[19])  # field 22 (starttime); fields[0] is field 3 (state)
    return max(up - started_ticks / os.sysconf("SC_CLK_TCK"), 0.0)


IMPORTED_AT = time.monotonic()  # the fallback start where the kernel does not say


def process_started(clock: Callable[[], float] = time.monotonic) -> float:
    """The ``clock`` reading at which this process started (this module's import where /proc is missing)."""
    age = process_age()
    if age is None:
        return IMPORTED_AT if clock is time.monotonic else clock()
    return clock() - age


__all__ = ["EXPORT", "PLANNING", "WAITING", "LineRow", "SyncProgress", "batches_for", "describe", "process_age",
           "process_started", "snapshot_state"]
