"""How a batch is committed, whichever path read it: dead letters first, then each target, every commit
recording the batch for the ledger (exactly once)."""

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from icecdc_dagster.ingest import dead_letters, horizon, snapshot_epoch
from icecdc_dagster.ingest.contract import IngestSettings, TargetResult
from icecdc_dagster.ingest.epoch_marks import epoch_plans, marks_writes
from icecdc_dagster.ingest.ledger import LANDING_PROPERTY, TARGETS_PROPERTY
from icecdc_dagster.ingest.writes import Stamp, TargetWrite
from icecdc_dagster.writer import (
    EQUALITY_DELETES,
    OP_COLUMN,
    OP_DELETE,
    OP_INSERT,
    ORDER_COLUMN,
    table_exists,
    write_batch,
    write_equality_delta,
)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def commit_batch(spark: Any, catalog_name: str, settings: IngestSettings, bid: str, dead: Mapping[str, DataFrame],
                  writes: Sequence[TargetWrite], results: Mapping[str, TargetResult],
                  stamp: Stamp, markers: Mapping[str, Sequence[tuple[int, str]]] | None = None
                  ) -> dict[str, TargetResult]:
    """Write one batch, whichever path read it: the dead-letter tables first, then each target's rows.

    Every commit records the batch id, the landing location and the full list of tables the batch writes
    (the ledger :func:`recorded_batches` reads, so a batch cut short is completed under the same id).
    Returns ``results`` with each written target's outcome (skipped, snapshot, write counts) merged in.
    Raises ``CommitDeclinedError`` where a write's ``before_commit`` declines it (its tables before it are
    committed: a caller declines only a batch whose one write is all it commits).
    A target whose Debezium snapshot completes in the batch loses the rows the snapshot lacked, and the
    marks of a snapshot still running are written first (:mod:`snapshot_epoch`: not part of the batch's
    tables, so the ledger's completeness is the targets' alone; a re-run skips them and sweeps from the
    marks as they were before the batch).
    """
    epochs = epoch_plans(spark, catalog_name, settings, bid, writes, markers or {})
    stamped = {horizon.FILE_TIME_PROPERTY: stamp.file_time} if stamp.file_time else {}
    for name, (w, mw) in sorted(marks_writes(spark, catalog_name, writes, epochs).items()):
        snapshot_epoch.ensure_marks_table(spark, f"{catalog_name}.{w.table}", w.keys)
        write_batch(spark, f"{catalog_name}.{name}", mw.rows.withColumn(OP_COLUMN, F.lit(OP_INSERT)), (), bid,
                    {snapshot_epoch.MARKS_OF_PROPERTY: settings.landing, **stamped}, ledger=True,
                    replace_all=mw.replace, retention=stamp.retention)
    props = {LANDING_PROPERTY: settings.landing,
             TARGETS_PROPERTY: json.dumps(sorted([*(w.table for w in writes), *dead])), **stamped}
    for dl_table in sorted(dead):
        dead_letters.ensure_table(spark, catalog_name, dl_table)
        rows = stamp.line_numbers(dead[dl_table]) if stamp.line_numbers else dead[dl_table]
        frame = dead_letters.frame(rows, bid).withColumn(OP_COLUMN, F.lit(OP_INSERT))
        write_batch(spark, f"{catalog_name}.{dl_table}", frame, (), bid, props, ledger=True,
                    retention=stamp.retention)
    out = dict(results)
    for w in writes:
        rows = w.rows.select(*[F.col(_quote(c)) for c in w.columns], OP_COLUMN, ORDER_COLUMN)
        epoch = epochs.get(w.table)
        bounds = w.bounds
        if epoch is not None and epoch.closed:
            full = f"{catalog_name}.{w.table}"
            held = snapshot_epoch.marks_before(spark, snapshot_epoch.marks_table(full), bid) if table_exists(
                spark, catalog_name, snapshot_epoch.marks_table(w.table)) else None
            rows = snapshot_epoch.with_sweeps(spark, full, held, rows, w.keys, OP_COLUMN, ORDER_COLUMN, OP_DELETE,
                                              epoch)
            bounds = None  # the sweep's deletes reach keys outside the batch's own range
        table_props = {**props, **(snapshot_epoch.epoch_properties(epoch) if epoch else {})}
        if settings.mode_for(w.table) == EQUALITY_DELETES:
            outcome = write_equality_delta(spark, f"{catalog_name}.{w.table}", rows, w.keys, bid, table_props,
                                           ledger=True, retention=stamp.retention, before_commit=w.before_commit)
        else:
            outcome = write_batch(spark, f"{catalog_name}.{w.table}", rows, w.keys, bid, table_props, ledger=True,
                                  bounds=bounds, retention=stamp.retention, before_commit=w.before_commit)
        prior = out[w.table]
        out[w.table] = TargetResult(w.table, outcome.skipped, outcome.snapshot_id, {**prior.counts, **outcome.counts},
                                    prior.added_columns, prior.widened_columns)
    return out
