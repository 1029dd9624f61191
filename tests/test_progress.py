"""The sync's progress model (events in, rows out) with an injected clock, and its two renderings."""

import io
import os
import re
import time

from icecdc_dagster.progress import (
    EXPORT,
    PLANNING,
    WAITING,
    SyncProgress,
    batches_for,
    describe,
    process_age,
    process_started,
    snapshot_state,
)
from icecdc_dagster.progress_display import SyncDisplay

TEST_IMPORTED = time.monotonic()  # this process started before this module was imported


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_every_planned_line_shows_from_the_start_with_its_pending_batches():
    progress = SyncProgress(clock=Clock(), started=90.0)
    progress.planned("ingest:raw", 5, per_batch=2)
    progress.planned("db.orders", 1, per_batch=10, export_first=True)   # a new line: its export
    progress.planned("db.items", 25, per_batch=10)
    progress.planned("db.gone", None)                                    # the plan could not tell
    rows = {row.line: row for row in progress.rows()}
    assert list(rows) == ["ingest:raw", "db.orders", "db.items", "db.gone"]
    assert [(r.state, r.done, r.pending, r.rows, r.elapsed) for r in rows.values()] == [
        (WAITING, 0, 3, None, 0.0), (WAITING, 0, 1, None, 0.0), (WAITING, 0, 3, None, 0.0),
        (WAITING, 0, None, None, 0.0)]


def test_batches_for_runs_the_export_alone():
    assert batches_for(0, 10) == 0
    assert batches_for(1, 10, export_first=True) == 1
    assert batches_for(11, 10, export_first=True) == 2
    assert batches_for(12, 10, export_first=True) == 3
    assert batches_for(21, 10) == 3


def test_batches_count_down_with_state_records_and_elapsed():
    clock = Clock(100.0)
    progress = SyncProgress(clock=clock, started=95.0)
    progress.planned("db.items", 3, per_batch=2, export_first=True)
    clock.now = 101.0
    assert progress.line_started("db.items").state == PLANNING
    row = progress.batch_started("db.items", "7", EXPORT, keys=1, rows=1000)
    assert (row.state, row.done, row.pending, row.rows) == (EXPORT, 0, 2, 1000)
    clock.now = 104.0
    row = progress.batch_finished("db.items", ok=True)
    assert (row.done, row.pending, row.rows, row.batch_seconds, row.elapsed) == (1, 1, None, 3.0, 3.0)
    row = progress.batch_started("db.items", "8..9", snapshot_state("8", "9", 2), keys=2, rows=40)
    assert (row.state, row.pending, row.rows) == ("applying snapshots 8..9 (2)", 1, 40)
    clock.now = 106.0
    progress.batch_finished("db.items", ok=True)
    row = progress.line_finished("db.items")
    assert (row.state, row.done, row.pending, row.elapsed) == ("done", 2, 0, 5.0)
    clock.now = 200.0
    assert progress.row("db.items").elapsed == 5.0       # frozen once the line ended
    assert progress.total() == 105.0                     # from the command's start, not the line's


def test_a_failed_batch_stays_pending_and_a_blocked_line_keeps_its_count():
    clock = Clock()
    progress = SyncProgress(clock=clock, started=0.0)
    progress.planned("db.items", 4, per_batch=2)
    progress.line_started("db.items")
    progress.batch_started("db.items", "1..2", snapshot_state("1", "2", 2), keys=2)
    row = progress.batch_finished("db.items", ok=False)
    assert (row.done, row.failed, row.pending) == (1, 1, 2)
    row = progress.line_finished("db.items", "blocked", drained=False)
    assert (row.state, row.pending) == ("blocked", 2)
    assert "batches 1 done (1 failed) / 2 pending" in describe(row)


def test_a_line_the_plan_missed_appears_at_its_first_batch():
    progress = SyncProgress(clock=Clock(), started=0.0)
    row = progress.batch_started("db.late", "5", snapshot_state("5", "5", 1))
    assert (row.line, row.state, row.pending) == ("db.late", "applying snapshot 5", 1)


def test_the_total_covers_every_line_run_one_after_another():
    clock = Clock(10.0)
    progress = SyncProgress(clock=clock, started=2.0)   # imports, instance and Spark before the first line
    for line in ("ingest:raw", "db.a", "db.b"):
        progress.planned(line, 1)
    for index, line in enumerate(("ingest:raw", "db.a", "db.b")):
        progress.line_started(line)
        clock.now += 1.5 + index
        progress.line_finished(line)
        clock.now += 0.25
    assert progress.total() >= sum(row.elapsed for row in progress.rows())
    assert progress.total() == clock.now - 2.0


def test_the_start_is_the_process_start():
    assert process_started() <= TEST_IMPORTED            # before this test module was even imported
    clock = Clock(500.0)
    assert process_started(clock) <= 500.0
    assert SyncProgress(clock=clock).started == process_started(clock)


def test_process_age_reads_the_kernel_start_time(tmp_path):
    ticks = os.sysconf("SC_CLK_TCK")
    (tmp_path / "self").mkdir()
    # pid (comm with a space and a paren) state ppid ... field 22 = starttime
    fields = ["S"] + ["0"] * 18 + [str(30 * ticks)] + ["0"] * 10
    (tmp_path / "self" / "stat").write_text(f"42 (py thon) x) {' '.join(fields)}\n")
    (tmp_path / "uptime").write_text("36.50 70.00\n")
    assert process_age(str(tmp_path)) == 6.5
    assert process_age(str(tmp_path / "missing")) is None
    assert process_age() is not None and process_age() > 0


def test_plain_output_has_one_line_per_event_and_no_escape_sequences():
    clock = Clock(10.0)
    out = io.StringIO()
    display = SyncDisplay(live=False, progress=SyncProgress(clock=clock, started=0.0), out=out)
    with display:
        display.progress.planned("db.items", 1, export_first=True)
        display.progress.line_started("db.items")
        display.progress.batch_started("db.items", "7", EXPORT, rows=2)
        clock.now = 12.0
        display.progress.batch_finished("db.items", ok=True, events=2)
        display.progress.line_finished("db.items")
    assert out.getvalue().splitlines() == [
        "db.items: waiting, batches 0 done / 1 pending, 0 change events, elapsed 0.0s",
        "db.items: export, batches 0 done / 1 pending, 0 change events, elapsed 0.0s",
        "db.items: batch 7 applied in 2.0s, 2 change events; batches 1 done / 0 pending",
        "db.items: done, batches 1 done / 0 pending, 2 change events, elapsed 2.0s"]
    assert "\x1b[" not in out.getvalue()
    assert display.summary() == ["db.items: done; 1 batch, 2 change events applied, 2.0s"]


def test_the_live_frame_has_a_row_per_line_and_the_total():
    from rich.console import Console

    clock = Clock(10.0)
    display = SyncDisplay(live=False, progress=SyncProgress(clock=clock, started=3.5))
    display.progress.planned("db.a", 12, per_batch=5)
    display.progress.planned("db.b", 1, export_first=True)
    display.progress.line_started("db.a")
    display.progress.batch_started("db.a", "0", EXPORT, keys=1, rows=12345)
    display.progress.batch_finished("db.a", ok=True, events=12345)
    display.progress.batch_started("db.a", "1..5", snapshot_state("1", "5", 5), keys=5, rows=99999)
    clock.now = 12.0
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(display.table())
    text = console.export_text()
    # change events: those the line's finished batches applied (the export's), never rows read.
    assert re.search(r"db\.a\s+applying snapshots 1\.\.5 \(5\)\s+1\s+3\s+12,345\s+2\.0s", text), text
    assert re.search(r"db\.b\s+waiting\s+0\s+1\s+0\s+0\.0s", text), text
    assert "8.5s since the command started" in text


BUSY_BATCH = r'''
import logging, os, sys, threading, time
from icecdc_dagster.progress import SyncProgress
from icecdc_dagster.progress_display import SyncDisplay

log = logging.getLogger("dagster")
handler = logging.StreamHandler(sys.stderr)  # holds sys.stderr from before the display, as Dagster's handlers do
handler.setFormatter(logging.Formatter("%(name)s - INFO - %(message)s"))
log.addHandler(handler)
log.setLevel(logging.INFO)
display = SyncDisplay(live=True, progress=SyncProgress(started=time.monotonic()))


def batch():
    """Pure Python for 3 s (the GIL held but for the interpreter's switches), writing as a run does."""
    end, n = time.monotonic() + 3.0, 0
    while time.monotonic() < end:
        sum(i * i for i in range(20000))
        n += 1
        if n % 25 == 0:
            log.info(f"log line {n // 25}")
            os.write(2, f"jvm line {n // 25}".encode())  # the JVM writes to descriptor 2, a line in two writes
            os.write(2, b" end\n")
            print(f"print line {n // 25}", flush=True)


with display:
    display.progress.planned("db.items", 1)
    display.progress.line_started("db.items")
    display.progress.batch_started("db.items", "7", "applying snapshot 7")
    worker = threading.Thread(target=batch)
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
    display.progress.batch_finished("db.items", True, events=3)
    display.progress.line_finished("db.items")
print("\n".join(display.summary()))
'''


def test_the_live_table_keeps_its_rate_while_a_batch_is_busy_and_log_lines_go_above_it():
    """On a terminal (a pty): while a thread keeps the process busy the table is redrawn at its rate; what
    Dagster's handlers, the JVM (descriptor 2) and print write goes above the table, each line once, never
    inside it; every frame is erased whole before the next (no stale copies); the summary gives counts."""
    import sys

    from tests.helpers import CAPTION, live_frames, run_on_terminal

    code, shown, _ = run_on_terminal([sys.executable, "-c", BUSY_BATCH], {**os.environ, "TERM": "xterm-256color"})
    assert code == 0, shown
    frames, outside = live_frames(shown)
    for kind in ("dagster - INFO - log line", "jvm line", "print line"):
        written = [line for line in outside if line.startswith(kind)]
        assert written and len(written) == len(set(written)), (kind, outside)
        assert not any(kind in frame for frame in frames)
    assert all(line.endswith(" end") for line in outside if line.startswith("jvm line"))   # joined, whole
    busy = [float(CAPTION.search(f).group(1)) for f in frames if "applying snapshot 7" in f]
    span = busy[-1] - busy[0]
    # The refresh thread draws 4 frames a second of the process's own clock; the busy thread takes 3 s.
    assert span >= 2.0 and len(busy) >= span * 2, (len(busy), span)
    assert re.search(r"db\.items\s+done\s+1\s+0\s+3\s", frames[-1]), frames[-1]
    assert outside[-1] == "db.items: done; 1 batch, 3 change events applied, " + outside[-1].rsplit(", ", 1)[1]


def test_a_log_redirected_to_a_file_stays_in_the_file(tmp_path):
    """``icecdc sync 2>log`` on a terminal: the live table on the terminal, Dagster's and the JVM's lines in the
    log file, not above the table."""
    import shlex
    import sys

    from tests.helpers import live_frames, run_on_terminal

    log = tmp_path / "sync.log"
    command = f"exec {shlex.quote(sys.executable)} -c {shlex.quote(BUSY_BATCH)} 2>{shlex.quote(str(log))}"
    code, shown, _ = run_on_terminal(["sh", "-c", command], {**os.environ, "TERM": "xterm-256color"})
    assert code == 0, shown
    frames, outside = live_frames(shown)
    assert frames and any(line.startswith("print line") for line in outside)     # stdout: above the table
    assert not any(line.startswith(("dagster - INFO", "jvm line")) for line in outside), outside
    written = log.read_text().splitlines()
    assert "dagster - INFO - log line 1" in written and "jvm line 1 end" in written
