"""Where each table and sink stands: checkpoint, pending snapshots, lag."""

from typing import TYPE_CHECKING
import time
from dataclasses import dataclass, field

from dagster import DagsterInstance, Definitions

from icecdc_dagster import changelog
from icecdc_dagster.assets import naming
from icecdc_dagster.config import IngestConfig, TableConfig
from icecdc_dagster.pipeline import lifecycle
from icecdc_dagster.pipeline.maintenance import retention_warning
from icecdc_dagster.pipeline.ordering import KeyStatus
from icecdc_dagster.pipeline.sinks import open_configured_sink
from icecdc_dagster.sensors.snapshots import diagnose, discover_new_keys, key_statuses
from icecdc_dagster.definitions import resource

if TYPE_CHECKING:
    from icecdc_dagster.batch import Checkpoint
    from pyiceberg.table import Table


@dataclass
class SinkStatus:
    name: str
    checkpoint_snapshot_id: int | None
    pending_snapshots: int
    lag_s: float | None
    error: str | None = None


@dataclass
class TableStatus:
    table_name: str
    current_snapshot_id: int | None
    known_partitions: int
    unapplied_partitions: int
    failed_partitions: list[str]
    sinks: list[SinkStatus] = field(default_factory=list)
    problem: str | None = None          # the table changed under the line: what happened + how to recover
    line: str | None = None             # resync key of the active line (None: the original line)
    superseded_partitions: int = 0
    warnings: list[str] = field(default_factory=list)

    def render(self) -> str:
        line = f", line {self.line} ({self.superseded_partitions} superseded partitions)" if self.line else ""
        lines = [f"{self.table_name}: current snapshot {self.current_snapshot_id}, "
                 f"{self.known_partitions} partitions, {self.unapplied_partitions} not yet applied{line}"
                 + (f", FAILED: {', '.join(self.failed_partitions)}" if self.failed_partitions else "")]
        if self.problem:
            lines.append(f"  STOPPED: {self.problem}")
        lines += [f"  WARNING: {w}" for w in self.warnings]
        for sink in self.sinks:
            lag = f"{sink.lag_s:.1f}s" if sink.lag_s is not None else "-"
            detail = f" (error: {sink.error})" if sink.error else ""
            lines.append(f"  {sink.name}: checkpoint {sink.checkpoint_snapshot_id}, "
                         f"{sink.pending_snapshots} snapshots pending, lag {lag}{detail}")
        return "\n".join(lines)


@dataclass
class IngestStatus:
    name: str
    landing: str
    files: int
    not_ingested: list[str]
    failed: list[str]

    def render(self) -> str:
        waiting = f", next: {self.not_ingested[0]}" if self.not_ingested else ""
        return (f"ingest {self.name} ({self.landing}): {self.files} landing files, "
                f"{len(self.not_ingested)} not yet ingested{waiting}"
                + (f", FAILED: {', '.join(self.failed)}" if self.failed else ""))


def ingest_status(instance: DagsterInstance, entry: IngestConfig) -> IngestStatus:
    """Landing files known or new, and which of them are not ingested or failed (Dagster's view)."""
    from icecdc_dagster.pipeline.ingest import landing_keys
    from icecdc_dagster.sensors import line
    from icecdc_dagster.sensors.ingest import ingest_line

    files = landing_keys(entry)
    known = list(instance.get_dynamic_partitions(ingest_line(entry).partitions_name))
    statuses = line.key_statuses(instance, ingest_line(entry), known)
    keys = known + [f for f in files if f not in set(known)]
    return IngestStatus(entry.name, entry.landing, len(files),
                        [k for k in keys if statuses.get(k) is not KeyStatus.DONE],
                        [k for k in known if statuses.get(k) is KeyStatus.FAILED])


def table_status(defs: Definitions, instance: DagsterInstance, table: TableConfig,
                 config_path: str | None = None) -> TableStatus:
    """Never raises for a table that changed under its line: the problem is reported with its fix."""
    from pyiceberg.exceptions import NoSuchTableError

    catalog = resource(defs, "catalog")
    try:
        source = catalog.load_table(table.table_name)
    except NoSuchTableError:  # created later by an ingest entry
        return TableStatus(table.table_name, None, 0, 0, [])
    current = source.current_snapshot()
    known = list(instance.get_dynamic_partitions(naming.partitions_name(table)))
    active = lifecycle.active_keys(known)
    problem = diagnose(instance, table, source, known, config_path)
    keys = active + ([] if problem else discover_new_keys(source, active[-1] if active else None))
    statuses = key_statuses(instance, table, active)
    status = TableStatus(
        table.table_name, current.snapshot_id if current else None, len(known),
        sum(1 for k in keys if statuses.get(k) is not KeyStatus.DONE),
        [k for k in active if statuses.get(k) is KeyStatus.FAILED],
        problem=problem.message if problem else None, line=lifecycle.line_token(known),
        superseded_partitions=len(known) - len(active))
    spark = None
    needed: list[int] = []  # checkpoints of sinks that still have snapshots to apply
    for sink in table.sinks:
        try:
            if spark is None and sink.needs_spark:
                spark = resource(defs, "spark").session(catalog)
            key = sink.resource_key()
            target = open_configured_sink(sink, table, spark=spark, catalog=catalog, source_table=source,
                                          connection=resource(defs, key) if key else None)
            checkpoint = target.read_checkpoint()
        except Exception as exc:  # noqa: BLE001 - status reports, it does not fail
            status.sinks.append(SinkStatus(sink.name, None, len(keys), None, error=str(exc)[:200]))
            continue
        status.sinks.append(_sink_status(source, table, sink.name, checkpoint, keys, status.line, config_path))
        if checkpoint is not None and status.sinks[-1].error is None and status.sinks[-1].pending_snapshots:
            needed.append(checkpoint.snapshot_id)
    # The retention guard: the table's own expiry settings must not expire what the slowest sink needs.
    slowest = min(needed, key=lambda i: source.metadata.snapshot_by_id(i).timestamp_ms, default=None)
    warning = retention_warning(source, table.table_name, slowest)
    if warning:
        status.warnings.append(warning)
    return status


def _sink_status(source: "Table", table: TableConfig, name: str, checkpoint: "Checkpoint | None", keys: list[str],
                 line: str | None,
                 config_path: str | None) -> SinkStatus:
    """Pending snapshots and lag of one sink; a checkpoint the table no longer continues from is named."""
    at = checkpoint.snapshot_id if checkpoint else None
    if checkpoint is not None and checkpoint.line != line:
        return SinkStatus(name, at, len(keys), None, error=(
            f"the sink is on line {checkpoint.line or 'original'}, the table's line is {line or 'original'}: "
            f"it waits for the line's bootstrap export"))
    if checkpoint is None:
        pending = [lifecycle.snapshot_id_of(k) for k in keys]
    else:
        problem = lifecycle.checkpoint_problem(source, table.table_name, checkpoint.snapshot_id, config_path,
                                               f"the checkpoint of {name}")
        if problem is not None:
            return SinkStatus(name, at, len(keys), None, error=problem.message)
        pending = [p.snapshot_id for p in changelog.snapshots_after(source, checkpoint.snapshot_id)]
    lag = None
    snapshot = source.metadata.snapshot_by_id(pending[0]) if pending else None
    if snapshot is not None:
        lag = time.time() - snapshot.timestamp_ms / 1000
    return SinkStatus(name, at, len(pending), lag)
