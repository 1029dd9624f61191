"""Which snapshot epochs a batch opens or closes per target, and what it writes to their marks tables
(:mod:`snapshot_epoch` holds the rules; this module applies them to one batch)."""

from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from icecdc_dagster.ingest import snapshot_epoch
from icecdc_dagster.ingest.contract import IngestSettings
from icecdc_dagster.ingest.ledger import LANDING_PROPERTY
from icecdc_dagster.ingest.line_parsing import ORDER_FILE_SHIFT
from icecdc_dagster.ingest.writes import TargetWrite
from icecdc_dagster.writer import OP_COLUMN, OP_DELETE, ORDER_COLUMN, table_exists


def parsed_markers(parsed: DataFrame, settings: IngestSettings) -> dict[str, list[tuple[int, str]]]:
    """Per target the snapshot-epoch markers of a parsed batch (a handful of rows; see :mod:`snapshot_epoch`)."""
    if not settings.snapshot_deletes:
        return {}
    mark = snapshot_epoch.marker(F.col("raw"))
    order = F.col("file_index") * F.lit(ORDER_FILE_SHIFT) + F.col("source_offset")
    found = parsed.where(F.col("reason").isNull() & mark.isNotNull()).select("target", order, mark).collect()
    return snapshot_epoch.markers_by_target((r[0], r[1], r[2]) for r in found)


def epoch_plans(spark: Any, catalog_name: str, settings: IngestSettings, bid: str, writes: Sequence["TargetWrite"],
                 markers: Mapping[str, Sequence[tuple[int, str]]]) -> dict[str, snapshot_epoch.EpochPlan]:
    """Per keyed target the batch's snapshot epochs (only those with one open or starting)."""
    plans = {}
    for w in writes:
        if not settings.snapshot_deletes or not w.keys:
            continue
        prior = snapshot_epoch.open_epoch(spark, f"{catalog_name}.{w.table}", LANDING_PROPERTY, settings.landing)
        planned = snapshot_epoch.plan(prior, markers.get(w.table, ()), bid)
        if planned.active:
            plans[w.table] = planned
    return plans


def marks_writes(spark: Any, catalog_name: str, writes: Sequence["TargetWrite"],
                  plans: Mapping[str, snapshot_epoch.EpochPlan]
                  ) -> dict[str, tuple["TargetWrite", snapshot_epoch.MarksWrite]]:
    """Per marks table (name within the catalog) its target's write and what the batch writes to it."""
    out = {}
    for w in writes:
        if w.table in plans:
            name = snapshot_epoch.marks_table(w.table)
            write = snapshot_epoch.marks_write(w.rows, w.keys, OP_COLUMN, ORDER_COLUMN, OP_DELETE, plans[w.table],
                                               table_exists(spark, catalog_name, name))
            if write is not None:
                out[name] = (w, write)
    return out
