"""What a batch writes besides its rows: one target's part of the batch, and the ledger's stamp."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame

from icecdc_dagster.writer import KeyBounds, LedgerRetention


@dataclass(frozen=True)
class Stamp:
    """What a batch's commits add for the ledger's horizon: its files' newest time, and the retention that
    drops the entries past the horizon in the same commits."""

    retention: LedgerRetention | None = None
    file_time: str | None = None
    # landing batches: the dead letters' reader positions -> line numbers (``landing_lines.line_numbers``)
    line_numbers: Callable[[DataFrame], DataFrame] | None = None


@dataclass(frozen=True)
class TargetWrite:
    """One target's part of a batch: the rows to write (no dead letter, no tombstone), the table's columns, its
    identifier columns, and its key range when the caller has it."""

    table: str
    rows: DataFrame
    columns: Sequence[str]
    keys: tuple[str, ...]
    bounds: KeyBounds | None = None
    # keyed targets: asked after the rows are written (equality deletes) or merged on the staging branch, before
    # their commit; False declines the batch (CommitDeclinedError: nothing committed). The batch read in one job
    # decides there (ingester).
    before_commit: Callable[[], bool] | None = None
