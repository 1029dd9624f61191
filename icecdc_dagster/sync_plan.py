"""What ``icecdc sync``'s progress display knows before a batch runs: per line, the keys pending and
whether the first is an export; per batch, its state and its records. Metadata only (the instance's
partitions and materialisations, the source's snapshot summaries): no Spark, no row is counted.

The counts are what the plan sees at that moment; the sensors' logic decides the batches themselves
(``sensors.snapshots.evaluate``, through the same ``lines.window.line_view``), this only previews it
for the display and never fails a sync.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyiceberg.exceptions import NoSuchTableError

from icecdc_dagster.assets import naming
from icecdc_dagster.config import IngestConfig, TableConfig
from icecdc_dagster.lines import line as lines
from icecdc_dagster.lines.window import TableWindow, diagnose, discover_new_keys, line_view
from icecdc_dagster.progress import EXPORT, WAITING, snapshot_state
from icecdc_dagster.sensors.ingest_sensor import ingest_line, unknown_keys
from icecdc_dagster.steps import lifecycle
from icecdc_dagster.steps.ingest_entry import input_keys
from icecdc_dagster.steps.ordering import KeyStatus, NextRun

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from pyiceberg.table import Table

    from icecdc_dagster.resources import IcebergCatalogResource

# Records a snapshot's summary counts as changed (what a batch of it reads: copy-on-write rewrites
# count the rewritten files' records, so this can exceed the change rows).
CHANGED_RECORDS = ("added-records", "deleted-records", "added-position-deletes", "added-equality-deletes")


@dataclass(frozen=True)
class LinePlan:
    pending_keys: int | None  # None: the plan could not tell (the display shows "?")
    per_batch: int
    export_first: bool = False
    state: str = WAITING


def table_plan(instance: "DagsterInstance", table: TableConfig, catalog: "IcebergCatalogResource",
               config_path: str | None) -> LinePlan:
    """The table line's pending keys as its next tick would see them (see ``sensors.snapshots.evaluate``)."""
    per_batch = table.max_snapshots_per_run
    try:
        source = catalog.load_table(table.table_name)
    except NoSuchTableError:
        return LinePlan(0, per_batch, state="waiting: the table does not exist yet")
    table_line = naming.table_line(table)
    view = line_view(instance, table_line, source)
    if isinstance(view, TableWindow):
        following = tuple(key for key in table_line.asset_keys if key not in view.joining)
        done = view.done(instance, following)
        waiting = [key for key in view.keys if key not in done]
        if not waiting and view.joining:  # sinks added to the line: their own export, nothing else
            return LinePlan(1, per_batch, export_first=True)
        return LinePlan(len(waiting), per_batch)
    active = view.active
    done = lines.done_in_every_asset(instance, table_line, active)
    if diagnose(instance, table_line, source, view.known, config_path, done) is not None:
        return LinePlan(0, per_batch, state="blocked: the table changed under the line (see the report)")
    keys = active + discover_new_keys(source, active[-1] if active else None)
    waiting = [key for key in keys if key not in done]
    return LinePlan(len(waiting), per_batch, export_first=bool(waiting) and waiting[0] == keys[0])


def ingest_plan(instance: "DagsterInstance", entry: IngestConfig) -> LinePlan:
    """The entry's landing files not ingested yet (a stream input: 1 while a message waits)."""
    entry_line = ingest_line(entry)
    waiting = lines.pending_keys(instance, entry_line)
    keys = waiting + unknown_keys(instance, entry_line, input_keys(entry))
    statuses = lines.pending_statuses(instance, entry_line, waiting)
    return LinePlan(sum(1 for key in keys if statuses.get(key) is not KeyStatus.DONE), entry_line.max_keys_per_run)


def table_batch(instance: "DagsterInstance", table_line: lines.Line, planned: NextRun,
                source: "Table | None") -> tuple[str, int | None]:
    """The state a table line shows while ``planned`` runs, and its records from the snapshot summaries:
    an export reads the snapshot's data files (``total-records``, before deletes apply), a batch of
    snapshots what they changed (``CHANGED_RECORDS``)."""
    if planned.assets or lifecycle.is_resync_key(planned.first_key) \
            or planned.first_key == lines.oldest_key(instance, table_line):
        joining = f" ({', '.join(planned.assets)} joining)" if planned.assets else ""
        return EXPORT + joining, summed(source, planned.keys[:1], ("total-records",))
    state = snapshot_state(planned.first_key, planned.last_key, len(planned.keys))
    return state, summed(source, planned.keys, CHANGED_RECORDS)


def ingest_batch(entry: IngestConfig, planned: NextRun) -> tuple[str, int | None]:
    """An ingest batch's state; its records are known only once its files are read."""
    if entry.input is not None:
        return f"ingesting from {planned.first_key}", None
    files = len(planned.keys)
    return (f"ingesting {planned.first_key}" if files == 1
            else f"ingesting {files} files {planned.first_key}..{planned.last_key}"), None


def summed(source: "Table | None", keys: tuple[str, ...], fields: tuple[str, ...]) -> int | None:
    """The sum of ``fields`` over the snapshots of ``keys`` (a field a summary omits counts 0: a delete
    that drops whole files has no ``added-records``); None when a snapshot or its summary is gone."""
    if source is None:
        return None
    total = 0
    for key in keys:
        snapshot = source.metadata.snapshot_by_id(lifecycle.snapshot_id_of(key))
        summary = snapshot.summary if snapshot is not None else None
        values = [summary.get(name) for name in fields] if summary is not None else []
        if all(value is None for value in values):
            return None
        total += sum(int(value or 0) for value in values)
    return total


__all__ = ["CHANGED_RECORDS", "LinePlan", "ingest_batch", "ingest_plan", "summed", "table_batch", "table_plan"]
