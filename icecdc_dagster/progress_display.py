"""How ``icecdc sync`` shows its progress model (``progress.SyncProgress``): on a terminal a live
table, one row per configured line, redrawn four times a second; elsewhere (a pipe, a CI log) plain
lines as the events happen, no escape sequences."""

import sys
from typing import Any, TextIO

from icecdc_dagster.progress import LineRow, SyncProgress, describe


class SyncDisplay:
    """The model and its rendering for one command; a context manager (the live table runs inside)."""

    def __init__(self, live: bool, progress: SyncProgress | None = None, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.progress = progress or SyncProgress()
        self.live: Any = None
        if live:
            from rich.console import Console  # rich: ~0.3 s; the CLI imports this module, only a live display draws
            from rich.live import Live  # rich: ~0.3 s; the CLI imports this module, only a live display draws

            self.live = Live(console=Console(file=self.out), get_renderable=self.table, refresh_per_second=4)
            self.progress.on_change = self.redraw  # each event at once; the ticks in between advance the times
        else:
            self.progress.on_change = self.plain

    def __enter__(self) -> "SyncDisplay":
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()  # the last frame stays on the terminal

    def redraw(self, event: str, row: LineRow) -> None:
        if self.live is not None and self.live.is_started:
            self.live.refresh()

    def plain(self, event: str, row: LineRow) -> None:
        """One line per event a log reader needs: each line's plan, each batch's start and end, each line's end."""
        if event == "line_started":
            return
        if event in ("batch_finished", "batch_failed"):
            outcome = "applied" if event == "batch_finished" else "failed"
            pending = "?" if row.pending is None else row.pending
            text = (f"{row.line}: batch {row.batch} {outcome} in {row.batch_seconds or 0:.1f}s; "
                    f"batches {row.done} done / {pending} pending")
        else:
            text = describe(row)
        print(text, file=self.out, flush=True)

    def table(self) -> Any:
        """The live frame: one row per line, and the time since the command started."""
        from rich import box  # rich: ~0.3 s; the CLI imports this module, only a live display draws
        from rich.table import Table  # rich: ~0.3 s; the CLI imports this module, only a live display draws

        frame = Table(box=box.SIMPLE_HEAD, caption=f"icecdc sync: {self.progress.total():.1f}s since the command "
                                                   f"started", caption_justify="left")
        for name, justify in (("line", "left"), ("state", "left"), ("batches done", "right"),
                              ("pending", "right"), ("records", "right"), ("elapsed", "right")):
            frame.add_column(name, justify=justify)  # type: ignore[arg-type]
        for row in self.progress.rows():
            failed = f" ({row.failed} failed)" if row.failed else ""
            frame.add_row(row.line, row.state, f"{row.done}{failed}", "?" if row.pending is None else str(row.pending),
                          "" if row.rows is None else f"~{row.rows:,}", f"{row.elapsed:.1f}s")
        return frame


__all__ = ["SyncDisplay"]
