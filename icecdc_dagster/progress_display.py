"""How ``icecdc sync`` shows its progress model (``progress.SyncProgress``): on a terminal a live
table, one row per configured line, redrawn four times a second; elsewhere (a pipe, a CI log) plain
lines as the events happen, no escape sequences.

The live table owns the terminal while it runs. Everything else the process writes - Dagster's log
lines (its handlers hold the ``sys.stderr`` they found at start), the JVM's and Spark's output on file
descriptor 2, a ``print`` - goes through a pipe put in place of descriptors 1 and 2 (2 only when it is a
terminal: ``2>log`` keeps the log in its file); a reader thread takes each complete line and writes it above
the table (the frame is cleared, the line written, the frame drawn again), so a log line never lands inside
the table and no stale copy of the table stays behind. A refresh
thread redraws the frame at its rate whatever the batch's thread does: it renders to text and writes with
``os.write``, holding no lock the batch could hold.
"""

import io
import os
import shutil
import sys
import threading
from typing import Any, TextIO

from icecdc_dagster.progress import LineRow, SyncProgress, describe

REFRESH_S = 0.25  # four frames a second
RELAY_DRAIN_S = 2.0  # at the end, how long the log lines still in the pipe may take to arrive
DRAINED = b"\x00icecdc-sync-display-drained\x00"
HIDE_CURSOR, SHOW_CURSOR = b"\x1b[?25l", b"\x1b[?25h"  # hidden while the frame is redrawn (it would flicker)
CLEAR_FRAME = "\x1b[{n}F\x1b[J"  # cursor to the start of the frame's first line, clear to the end of the screen


class SyncDisplay:
    """The model and its rendering for one command; a context manager (the live table runs inside)."""

    def __init__(self, live: bool, progress: SyncProgress | None = None, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.progress = progress or SyncProgress()
        self.live = live
        self.lock = threading.Lock()  # one writer of the terminal at a time: frames and log lines
        self.stop = threading.Event()
        self.height = 0  # lines of the frame on screen (0: none drawn)
        self.terminal = -1  # the terminal's descriptor (a duplicate of the original stdout)
        self.saved: list[tuple[int, int]] = []  # (descriptor, its original duplicate) to restore
        self.threads: list[threading.Thread] = []
        self.frames = 0
        self.terminal_owned = True  # the frame is on the terminal: a log line goes above it
        self.drained = threading.Event()  # the relay has written every line written before the end
        self.progress.on_change = self.redraw if live else self.plain

    def __enter__(self) -> "SyncDisplay":
        if self.live:
            self._start_live()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live and self.terminal >= 0 and self.terminal_owned:
            self._stop_live()

    def _start_live(self) -> None:
        """The terminal is kept for the frame; descriptors 1 and 2 write into a pipe read line by line."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed stream: nothing to flush
                pass
        self.terminal = os.dup(self.out.fileno())
        read_end, write_end = os.pipe()
        # Descriptor 2 only when it is a terminal too: ``icecdc sync 2>log`` keeps its log in the file.
        for fd in (1, 2) if os.isatty(2) else (1,):
            self.saved.append((fd, os.dup(fd)))
            os.dup2(write_end, fd)
        os.close(write_end)
        self.threads = [threading.Thread(target=self._relay, args=(read_end,), name="icecdc-sync-log", daemon=True),
                        threading.Thread(target=self._refresh, name="icecdc-sync-display", daemon=True)]
        os.write(self.terminal, HIDE_CURSOR)
        for thread in self.threads:
            thread.start()

    def _stop_live(self) -> None:
        """The last frame stays on the terminal; the descriptors are given back and every log line written."""
        self.stop.set()
        self.threads[1].join()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed stream: nothing to flush
                pass
        os.write(1, DRAINED + b"\n")  # behind every line written so far; the relay reports it, never writes it
        for fd, original in self.saved:
            os.dup2(original, fd)  # the JVM keeps its copy of the pipe: the relay goes on (plain lines)
            os.close(original)
        self.drained.wait(RELAY_DRAIN_S)
        with self.lock:
            self._clear()
            self._draw()
            os.write(self.terminal, SHOW_CURSOR)
            self.terminal_owned = False  # what the relay reads from now on (a JVM still holding the pipe) is plain

    def _relay(self, read_end: int) -> None:
        """Each complete line written to descriptors 1 and 2, above the frame."""
        pending = b""
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                *complete, pending = (pending + chunk).split(b"\n")
                marked = any(DRAINED in line for line in complete)  # after a partial line, on its end
                lines = [line.replace(DRAINED, b"") + b"\n" for line in complete]
                lines = [line for line in lines if line.strip()] if marked else lines
                if lines:
                    self._above(b"".join(lines))
                if marked:
                    self.drained.set()
        if pending:
            self._above(pending + b"\n")

    def _above(self, text: bytes) -> None:
        with self.lock:
            if not self.terminal_owned:
                os.write(self.terminal, text)
                return
            self._clear()
            os.write(self.terminal, text)
            self._draw()

    def _refresh(self) -> None:
        while True:
            with self.lock:
                self._clear()
                self._draw()
            if self.stop.wait(REFRESH_S):
                return

    def _clear(self) -> None:
        if self.height:
            os.write(self.terminal, CLEAR_FRAME.format(n=self.height).encode())
            self.height = 0

    def _draw(self) -> None:
        text = self.render()
        os.write(self.terminal, text.encode())
        self.height = text.count("\n")
        self.frames += 1

    def render(self) -> str:
        """The frame as the terminal shows it (rich renders to text; the terminal's width)."""
        from rich.console import Console  # rich: ~0.3 s; the CLI imports this module, only a live display draws

        width = shutil.get_terminal_size((100, 24)).columns
        try:
            width = os.get_terminal_size(self.terminal).columns
        except OSError:  # not a terminal after all (a test's pipe): the default width
            pass
        buffer = io.StringIO()
        Console(file=buffer, force_terminal=True, width=width, color_system=None).print(self.table())
        return buffer.getvalue()

    def redraw(self, event: str, row: LineRow) -> None:
        """An event: the next frame (at most :data:`REFRESH_S` away) shows it."""

    def plain(self, event: str, row: LineRow) -> None:
        """One line per event a log reader needs: each line's plan, each batch's start and end, each line's end."""
        if event == "line_started":
            return
        if event in ("batch_finished", "batch_failed"):
            outcome = "applied" if event == "batch_finished" else "failed"
            pending = "?" if row.pending is None else row.pending
            events = f", {row.last_events:,} change events" if row.last_events is not None else ""
            text = (f"{row.line}: batch {row.batch} {outcome} in {row.batch_seconds or 0:.1f}s{events}; "
                    f"batches {row.done} done / {pending} pending")
        else:
            text = describe(row)
        print(text, file=self.out, flush=True)

    def summary(self) -> list[str]:
        """The counts a finished sync prints: per line its batches and the change events they applied."""
        lines = []
        for row in self.progress.rows():
            failed = f", {row.failed} failed" if row.failed else ""
            lines.append(f"{row.line}: {row.state}; {row.done} batch{'es' if row.done != 1 else ''}{failed}, "
                         f"{row.events:,} change events applied, {row.elapsed:.1f}s")
        return lines

    def table(self) -> Any:
        """The live frame: one row per line, and the time since the command started."""
        from rich import box  # rich: ~0.3 s; the CLI imports this module, only a live display draws
        from rich.table import Table  # rich: ~0.3 s; the CLI imports this module, only a live display draws

        frame = Table(box=box.SIMPLE_HEAD, caption=f"icecdc sync: {self.progress.total():.1f}s since the command "
                                                   f"started", caption_justify="left")
        for name, justify in (("line", "left"), ("state", "left"), ("batches done", "right"),
                              ("pending", "right"), ("change events", "right"), ("elapsed", "right")):
            frame.add_column(name, justify=justify)  # type: ignore[arg-type]
        for row in self.progress.rows():
            failed = f" ({row.failed} failed)" if row.failed else ""
            frame.add_row(row.line, row.state, f"{row.done}{failed}", "?" if row.pending is None else str(row.pending),
                          f"{row.events:,}", f"{row.elapsed:.1f}s")
        return frame


__all__ = ["SyncDisplay"]
