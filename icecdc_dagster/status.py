"""Where each table and sink stands: checkpoint, pending snapshots, lag."""

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from dagster import AssetKey, DagsterInstance, Definitions
from pyiceberg.exceptions import NoSuchTableError

from icecdc_dagster import changelog
from icecdc_dagster.assets import line_record, naming
from icecdc_dagster.config import IngestConfig, SinkConfig, TableConfig
from icecdc_dagster.errors import resync_command
from icecdc_dagster.ingest.ledger import expired_files_in_metadata
from icecdc_dagster.inputs.registry import open_input
from icecdc_dagster.lines import line as lines
from icecdc_dagster.lines.batch_metadata import BatchMetadata
from icecdc_dagster.lines.window import TableWindow, WholeLine, diagnose, discover_new_keys, line_view
from icecdc_dagster.resources.resolved import resolved_catalog, resolved_resource
from icecdc_dagster.sensors.ingest_sensor import ingest_line, unknown_keys
from icecdc_dagster.steps import lifecycle
from icecdc_dagster.steps.ingest_entry import ingest_settings, input_keys
from icecdc_dagster.steps.open_sink import open_configured_sink
from icecdc_dagster.steps.ordering import KeyStatus
from icecdc_dagster.steps.table_maintenance import retention_warning

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyiceberg.table import Table

    from icecdc_dagster.batch import Checkpoint


@dataclass
class SinkStatus:
    name: str
    checkpoint_snapshot_id: int | None
    pending_snapshots: int | None   # None: the sink could not be read (``error``), so nobody knows
    lag_s: float | None
    error: str | None = None
    target: str | None = None  # what the sink writes (a table; an OpenSearch alias with its version, a reindex)

    def render_lag(self) -> str:
        """Seconds since the oldest snapshot the sink still lacks was committed; nothing lacking is "up to date"."""
        if self.lag_s is None:
            return "lag unknown"
        return f"lag {self.lag_s:.1f}s" if self.pending_snapshots else "up to date"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


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
    left_behind: list["LeftBehind"] = field(default_factory=list)  # sinks removed from the pipeline file

    def render(self) -> str:
        line = f", line {self.line} ({self.superseded_partitions} superseded partitions)" if self.line else ""
        lines = [f"{self.table_name}: current snapshot {self.current_snapshot_id}, "
                 f"{_count(self.known_partitions, 'partition')}, {self.unapplied_partitions} not yet applied{line}"
                 + (f", FAILED: {', '.join(self.failed_partitions)}" if self.failed_partitions else "")]
        if self.problem:
            lines.append(f"  STOPPED: {self.problem}")
        lines += [f"  WARNING: {w}" for w in self.warnings]
        for sink in self.sinks:
            target = f"; {sink.target}" if sink.target else ""
            if sink.pending_snapshots is None:  # unread: no checkpoint or count to show, only why
                lines.append(f"  {sink.name}: cannot be read, checkpoint unknown (error: {sink.error}){target}")
                continue
            detail = f" (error: {sink.error})" if sink.error else ""
            lines.append(f"  {sink.name}: checkpoint {sink.checkpoint_snapshot_id}, "
                         f"{_count(sink.pending_snapshots, 'snapshot')} pending, {sink.render_lag()}{detail}{target}")
        lines += [f"  LEFT BEHIND: {left.render()}" for left in self.left_behind]
        return "\n".join(lines)


@dataclass
class LeftBehind:
    """A sink the line had that the pipeline file no longer names: its target stays as it was."""

    name: str
    kind: str
    target: str
    last_checkpoint_snapshot_id: str | None  # what its last batch left (None: no batch recorded)

    def render(self) -> str:
        return (f"{self.name} ({self.kind} {self.target}) is no longer in the pipeline file; it was left at "
                f"snapshot {self.last_checkpoint_snapshot_id or 'none'} and is not updated (delete it, or add "
                f"the sink back)")


@dataclass
class IngestStatus:
    name: str
    landing: str
    files: int
    not_ingested: list[str]
    failed: list[str]
    expired_files: int = 0   # past the ledger's horizon (max_file_age), never ingested: set aside
    error: str | None = None
    consumer_lag: int | None = None        # stream inputs: messages waiting (not delivered + unacknowledged)
    unacknowledged: int | None = None      # of which delivered but not acknowledged (a batch in flight or died)

    def render(self) -> str:
        waiting = f", next: {self.not_ingested[0]}" if self.not_ingested else ""
        failed = f", FAILED: {', '.join(self.failed)}" if self.failed else ""
        error = f" (error: {self.error})" if self.error else ""
        if self.consumer_lag is not None:
            return (f"ingest {self.name} ({self.landing}): consumer lag {self.consumer_lag} messages "
                    f"({self.unacknowledged} unacknowledged){waiting}{failed}{error}")
        expired = (f", {self.expired_files} expired (older than max_file_age, never ingested)"
                   if self.expired_files else "")
        return (f"ingest {self.name} ({self.landing}): {self.files} landing files, "
                f"{len(self.not_ingested)} not yet ingested{waiting}{expired}{failed}{error}")


def ingest_status(instance: DagsterInstance, entry: IngestConfig, defs: Definitions | None = None) -> IngestStatus:
    """Landing files known or new, and which of them are not ingested or failed (Dagster's view).

    Reads what the sensor reads: the known files after the line's frontier (newest first, a page at a
    time) and the listed files not known yet; files before the frontier are ingested (in order).
    """
    files = input_keys(entry)
    entry_line = ingest_line(entry)
    waiting = lines.pending_keys(instance, entry_line)
    keys = waiting + unknown_keys(instance, entry_line, files)
    statuses = lines.pending_statuses(instance, entry_line, waiting)
    status = IngestStatus(entry.name, entry.source, len(files),
                          [k for k in keys if statuses.get(k) is not KeyStatus.DONE],
                          [k for k in waiting if statuses.get(k) is KeyStatus.FAILED])
    if entry.input is not None:  # broker metadata only: what waits, not what Dagster knows
        with open_input(entry.input) as reader:
            lag = reader.lag()
        status.files, status.consumer_lag, status.unacknowledged = 0, lag.waiting, lag.unacknowledged
    elif defs is not None:
        _count_expired(defs, entry, status)
    return status


def _count_expired(defs: Definitions, entry: IngestConfig, status: IngestStatus) -> None:
    """The landing files past the ledger's horizon that no batch records (the ledger in the tables' metadata)."""
    try:
        catalog = resolved_catalog(defs, entry.catalog)
        status.expired_files = len(expired_files_in_metadata(catalog.load(), ingest_settings(entry)))
    except Exception as exc:  # noqa: BLE001 - status reports, it does not fail
        status.error = str(exc)[:200]


def status_document(tables: "list[TableStatus]", ingests: "list[IngestStatus]") -> dict[str, Any]:
    """``icecdc status --json``: snapshot ids as strings. They exceed 2^53, and JavaScript and jq read
    JSON numbers as doubles (…512166 would come back as …512000)."""
    return {"tables": [_ids_as_strings(asdict(t)) for t in tables],
            "ingest": [asdict(i) for i in ingests]}


def _ids_as_strings(value: object, key: str = "") -> object:
    if isinstance(value, dict):
        return {k: _ids_as_strings(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_ids_as_strings(v, key) for v in value]
    if key.endswith("snapshot_id") and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


@dataclass(frozen=True)
class _LineKeys:
    """What a sink that cannot continue from a checkpoint of this line has before it: every key of
    the active line and the new snapshots (how many, and the first: read only for a sink without one)."""
    count: int
    first: "Callable[[], str | None]"


def table_status(defs: Definitions, instance: DagsterInstance, table: TableConfig,
                 config_path: str | None = None) -> TableStatus:
    """Never raises for a table that changed under its line: the problem is reported with its fix.

    Reads what the sensor reads: when the line follows the table, the snapshots after the line's
    latest materialisations (``lines.window.line_view``) and aggregate counts of its keys,
    whatever the history; otherwise the whole line once, and its diagnosis.
    """
    catalog = resolved_catalog(defs)
    try:
        source = catalog.load_table(table.table_name)
    except NoSuchTableError:  # created later by an ingest entry
        return TableStatus(table.table_name, None, 0, 0, [])
    current = source.current_snapshot()
    current_id = current.snapshot_id if current else None
    table_line_ = naming.table_line(table)
    view = line_view(instance, table_line_, source)
    if isinstance(view, TableWindow):
        status, line_keys = _window_status(instance, table, table_line_, source, current_id, view, config_path)
    else:  # the line does not simply follow the table: the whole line, diagnosed
        status, line_keys = _whole_line_status(instance, table, table_line_, source, current_id, view, config_path)
    needed: list[int] = []  # checkpoints of sinks that still have snapshots to apply
    for sink in table.sinks:
        try:  # no SparkSession: a sink reads its checkpoint from metadata (a table's, an index's)
            target_catalog = resolved_catalog(defs, sink.target_catalog)  # where the sink's table lives
            key = sink.resource_key()
            target = open_configured_sink(sink, table, spark=None, catalog=catalog, source_table=source,
                                          connection=resolved_resource(defs, key) if key else None,
                                          target_catalog=target_catalog)
            checkpoint = target.read_checkpoint()
            # Optional on a sink: where its target stands (OpenSearch: the index version, a reindex).
            state = getattr(target, "target_state", None)
            described = state() if state is not None else sink.target
        except Exception as exc:  # noqa: BLE001 - status reports, it does not fail
            status.sinks.append(SinkStatus(sink.name, None, None, None, error=str(exc)[:200], target=sink.target))
            continue
        status.sinks.append(_sink_status(source, table, sink.name, checkpoint, line_keys, status.line, config_path))
        status.sinks[-1].target = described
        if checkpoint is not None and status.sinks[-1].error is None and status.sinks[-1].pending_snapshots:
            needed.append(checkpoint.snapshot_id)
    # The retention guard: the table's own expiry settings must not expire what the slowest sink needs.
    slowest = min(needed, key=lambda i: source.metadata.snapshot_by_id(i).timestamp_ms, default=None)
    warning = retention_warning(source, table.table_name, slowest)
    if warning:
        status.warnings.append(warning)
    status.warnings += [w for sink in table.sinks
                        if (w := divergence_warning(instance, table, sink, status.line, config_path)) is not None]
    status.left_behind = left_behind(instance, catalog.name, table)
    return status


def divergence_warning(instance: DagsterInstance, table: TableConfig, sink: SinkConfig, line: str | None,
                       config_path: str | None) -> str | None:
    """What the failing check ``sink_counts_agree`` says, for those who read ``icecdc status`` rather than
    the UI: the sink's latest batch on the active line carries the snapshot where its counts first
    contradicted the events (the target has not equalled the source since); None when it does not."""
    latest = BatchMetadata.latest(instance, naming.sink_key(sink))
    if latest.diverged_at_snapshot_id is None or latest.line != line:
        return None
    return (f"{sink.name} diverged from {table.table_name} at snapshot {latest.diverged_at_snapshot_id}: its counts "
            f"contradicted the batch's events (sink_disagreements; check sink_counts_agree fails): the source holds "
            f"keys twice, or something else wrote the target; deduplicate, then "
            f"{resync_command(table.table_name, config_path)}")


def left_behind(instance: DagsterInstance, catalog_name: str, table: TableConfig) -> list[LeftBehind]:
    """The sinks removed from the table's entry, with the checkpoint their last batch recorded
    (read from the instance: the target itself may be gone)."""
    found = []
    for name, value in sorted(line_record.left_behind(catalog_name, table).items()):
        checkpoint = BatchMetadata.latest(instance, AssetKey.from_user_string(value["asset_key"])).checkpoint
        found.append(LeftBehind(name, str(value.get("kind")), str(value.get("target")),
                                str(checkpoint) if checkpoint is not None else None))
    return found


def _whole_line_status(instance: DagsterInstance, table: TableConfig, table_line_: lines.Line, source: "Table",
                       current_id: int | None, view: WholeLine,
                       config_path: str | None) -> tuple[TableStatus, _LineKeys]:
    """Status of a line that does not simply follow its table: every key of the line, diagnosed."""
    active = view.active
    done = lines.done_in_every_asset(instance, table_line_, active)
    problem = diagnose(instance, table_line_, source, view.known, config_path, done)
    keys = active + ([] if problem else discover_new_keys(source, active[-1] if active else None))
    statuses = lines.pending_statuses(instance, table_line_, keys, done)
    status = TableStatus(
        table.table_name, current_id, len(view.known),
        sum(1 for k in keys if statuses.get(k) is not KeyStatus.DONE),
        [k for k in active if statuses.get(k) is KeyStatus.FAILED],
        problem=problem.message if problem else None, line=view.token, superseded_partitions=view.superseded)
    return status, _LineKeys(len(keys), lambda: keys[0] if keys else None)


def _window_status(instance: DagsterInstance, table: TableConfig, table_line_: lines.Line, source: "Table",
                   current_id: int | None, window: TableWindow,
                   config_path: str | None) -> tuple[TableStatus, _LineKeys]:
    """Status of a line that follows its table, from its window: every key before the window is done
    in every asset (the line runs in order); the partition counts are aggregate queries."""
    done = window.done(instance, table_line_.asset_keys)
    partitions = instance.get_existing_dynamic_partitions(table_line_.partitions_name, window.keys)
    waiting = [k for k in window.keys if k not in done]
    statuses = lines.pending_statuses(instance, table_line_, [k for k in waiting if k in partitions], done)
    # The next known batch may need what expiry removed (its snapshot, the parent its diff reads).
    first = next((k for k in waiting if k in partitions), None)
    problem = lifecycle.pending_problem(source, table.table_name, first, config_path) if first else None
    if problem:  # as when the whole line is diagnosed: the new snapshots wait for the recovery
        waiting = [k for k in waiting if k in partitions]
    known = lines.key_count(instance, table_line_)
    superseded = lines.key_count(instance, table_line_, before=window.line) if window.line else 0
    new = 0 if problem else sum(1 for k in window.keys if k not in partitions)
    status = TableStatus(table.table_name, current_id, known, len(waiting),
                         [k for k in waiting if statuses.get(k) is KeyStatus.FAILED],
                         problem=problem.message if problem else None, line=window.line,
                         superseded_partitions=superseded)
    return status, _LineKeys(known - superseded + new, lambda: window.line or lines.oldest_key(instance, table_line_))


def _sink_status(source: "Table", table: TableConfig, name: str, checkpoint: "Checkpoint | None",
                 line_keys: _LineKeys, line: str | None, config_path: str | None) -> SinkStatus:
    """Pending snapshots and lag of one sink; a checkpoint the table no longer continues from is named."""
    at = checkpoint.snapshot_id if checkpoint else None
    if checkpoint is not None and checkpoint.line != line:
        return SinkStatus(name, at, line_keys.count, None, error=(
            f"the sink is on line {checkpoint.line or 'original'}, the table's line is {line or 'original'}: "
            f"it waits for the line's bootstrap export"))
    if checkpoint is None:  # every key of the line
        pending, first = line_keys.count, (line_keys.first() if line_keys.count else None)
    else:
        problem = lifecycle.checkpoint_problem(source, table.table_name, checkpoint.snapshot_id, config_path,
                                               f"the checkpoint of {name}")
        if problem is not None:
            return SinkStatus(name, at, line_keys.count, None, error=problem.message)
        after = changelog.ancestry_ids(source, checkpoint.snapshot_id)
        pending, first = len(after), (str(after[0]) if after else None)
    lag = 0.0 if not pending else None  # nothing lacking: no lag
    snapshot = source.metadata.snapshot_by_id(lifecycle.snapshot_id_of(first)) if pending and first else None
    if snapshot is not None:
        lag = time.time() - snapshot.timestamp_ms / 1000
    return SinkStatus(name, at, pending, lag)
