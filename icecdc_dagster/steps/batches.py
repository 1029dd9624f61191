"""Turn a run of partition keys (snapshot ids) into a BatchInfo and its change rows."""

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from icecdc_dagster import changelog
from icecdc_dagster.batch import CHANGE_TYPES, BatchInfo, Checkpoint, resumes_inside
from icecdc_dagster.changelog import uses_row_lineage
from icecdc_dagster.changelog.ordinals import OrdinalAnchor, sequence_number
from icecdc_dagster.column_names import column
from icecdc_dagster.errors import SupersededPartitionError
from icecdc_dagster.steps import lifecycle
from icecdc_dagster.writer import columns_by_field_id

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class BatchRequest:
    """A run of consecutive snapshot keys of one table, and how the table is configured."""

    table_name: str
    snapshot_ids: tuple[int, ...]
    bootstrap_snapshot_id: int
    disable_export: bool = False
    identifier_columns: tuple[str, ...] = ()
    line: str | None = None  # the resync key of the active line (None: the original line)
    starts_line: bool | None = None  # the first key is the line's bootstrap (None: compare snapshot ids)
    # Format v1: where the line counts its snapshots from (changelog.ordinals); None: from their depth.
    anchor: OrdinalAnchor | None = None

    @property
    def includes_bootstrap(self) -> bool:
        if self.starts_line is not None:
            return self.starts_line
        return self.snapshot_ids[0] == self.bootstrap_snapshot_id


@dataclass
class ComputedBatch:
    info: BatchInfo
    rows: Any  # Spark DataFrame of change rows (all four change types); sinks derive events at read
    stats: dict[str, Any] = field(default_factory=dict)
    kind: str = "cdc"  # "export", "bootstrap" (export disabled), "cdc" or "net"
    raw_rows: Any = None  # the rows read, before carry-over removal / netting (None: not counted)
    counted: bool = False  # row counts per change type belong in the stats (see row_stats)


def identifier_columns_of(configured: Sequence[str], table: "Table") -> tuple[str, ...]:
    """The configured identifier columns, else the table's own identifier fields (schema order)."""
    if configured:
        return tuple(configured)
    schema = table.schema()
    ids = set(schema.identifier_field_ids)
    return tuple(f.name for f in schema.fields if f.field_id in ids)


def keys_to_request(table_name: str, keys: Sequence[str], all_keys: Sequence[str], disable_export: bool,
                    identifier_columns: Sequence[str]) -> BatchRequest:
    """``all_keys`` are the table's partition keys in commit order. The bootstrap is the first key of
    the active line (after the latest ``icecdc resync``); keys of a superseded line are refused."""
    active = lifecycle.active_keys(all_keys)
    superseded = set(lifecycle.superseded_keys(all_keys))
    stale = [k for k in keys if k in superseded]
    if stale:
        raise SupersededPartitionError(
            f"{table_name}: partition(s) {', '.join(stale)} belong to a superseded line (replaced by the resync "
            f"bootstrap {active[0]}); they are kept for lineage and are never applied again")
    resync = lifecycle.line_token(all_keys)
    # A resync bootstrap is an export even when the table's export is disabled: it must converge sinks.
    return BatchRequest(table_name=table_name, snapshot_ids=tuple(lifecycle.snapshot_id_of(k) for k in keys),
                        bootstrap_snapshot_id=lifecycle.snapshot_id_of(active[0]),
                        disable_export=disable_export and resync is None,
                        identifier_columns=tuple(identifier_columns), line=resync,
                        starts_line=keys[0] == active[0])


def batch_info(table: "Table", request: BatchRequest) -> BatchInfo:
    """Position of the batch in the table's history, from metadata only. Its sequence number is the last
    snapshot's (a format v1 line's ordinal of it: ``changelog.ordinals``)."""
    first, last = request.snapshot_ids[0], request.snapshot_ids[-1]
    last_plan = changelog.plan_snapshot(table, last)
    predecessors = () if request.includes_bootstrap else tuple(changelog.accepted_predecessors(table, first))
    return BatchInfo(
        table_name=request.table_name,
        snapshot_id=last,
        sequence_number=sequence_number(table, last, request.anchor),
        first_snapshot_id=first,
        accepted_predecessors=predecessors,
        operation=last_plan.operation,
        committed_at_ms=last_plan.committed_at_ms,
        is_export=request.includes_bootstrap,
        identifier_columns=request.identifier_columns,
        snapshot_ids=request.snapshot_ids,
        line=request.line,
        schema_id=snapshot_schema_id(table, last),
    )


def snapshot_schema_id(table: "Table", snapshot_id: int) -> int | None:
    """The schema id the snapshot was committed with (None: not recorded, v1 metadata)."""
    snapshot = table.snapshot_by_id(int(snapshot_id))
    return snapshot.schema_id if snapshot is not None else None


def compute_batch(spark: "SparkSession", catalog_name: str, table: "Table", request: BatchRequest) -> ComputedBatch:
    """The batch's change rows (lazy DataFrame) and engine statistics.

    - export: every row of the last snapshot as INSERT (nets the bootstrap with what followed);
    - bootstrap with export disabled: only the changes after the bootstrap snapshot;
    - otherwise the changes of the snapshot, or the net changes of the run of snapshots.
    """
    info = batch_info(table, request)
    first, last = request.snapshot_ids[0], request.snapshot_ids[-1]
    started = time.monotonic()
    if request.includes_bootstrap and not request.disable_export:
        change_set, kind = changelog.export(spark, catalog_name, table, last, request.identifier_columns,
                                              anchor=request.anchor), "export"
    elif request.includes_bootstrap:
        if first == last:
            change_set, kind = None, "bootstrap"
        else:
            change_set, kind = changelog.changes(spark, catalog_name, table, (first, last),
                                                 request.identifier_columns, net=True, anchor=request.anchor), "net"
    elif first == last:
        change_set, kind = changelog.changes(spark, catalog_name, table, last, request.identifier_columns,
                                             anchor=request.anchor), "cdc"
    else:
        parent = changelog.parent_of(table, first)
        change_set, kind = changelog.changes(spark, catalog_name, table, (parent, last),
                                             request.identifier_columns, net=True, anchor=request.anchor), "net"
    if change_set is None:
        rows = changelog.export(spark, catalog_name, table, last).rows.limit(0)
        stats: dict[str, Any] = {}
    else:
        rows = change_set.rows
        stats = dict(change_set.stats)
    stats["plan_s"] = round(time.monotonic() - started, 3)
    # An export's rows are the whole table: the stored batch's counts say all there is to say.
    return ComputedBatch(info=info, rows=rows, stats=stats, kind=kind,
                         raw_rows=(change_set.raw_rows if change_set is not None and kind != "export"
                                   and "rows_read" not in change_set.stats else None),
                         counted=change_set is not None and kind != "export")


def join_export(spark: "SparkSession", catalog_name: str, table: "Table", request: BatchRequest,
                use_row_id: bool) -> tuple[BatchInfo, Any]:
    """A sink added to a running line: the export of the request's last snapshot as the line's export
    batch (accepted only by a sink without a checkpoint) and its CDC events. Taken at the batch's
    snapshot, the same one the other sinks reach in this run, so from the next batch on every sink of
    the line is at one checkpoint and follows the same batches; the other sinks are not re-exported."""
    last = request.snapshot_ids[-1]
    info = batch_info(table, replace(request, snapshot_ids=(last,), starts_line=True, disable_export=False))
    rows = changelog.export(spark, catalog_name, table, last, request.identifier_columns, anchor=request.anchor).rows
    events = changelog.to_events(rows, request.table_name, request.identifier_columns, info.operation, last,
                                 use_row_id=use_row_id, unique_ids=True)  # the export checked its keys
    return info, events


def segments(request: BatchRequest, info: BatchInfo, checkpoint: Checkpoint | None,
             attempted_ends: Collection[int]) -> list[BatchRequest] | None:
    """How one sink applies the run's range when the stored batch (the range's net changes, or its export)
    is not exact for it; None when it is.

    - a checkpoint inside the range (``batch.resumes_inside``): only the snapshots after it;
    - an earlier attempt of the line that ended inside the range (``attempted_ends``: the last snapshots of
      the line's failed runs) may have written part of its own batch into a target that does not publish a
      batch atomically (an OpenSearch bulk killed midway). That batch is finished first, exactly as it was,
      then the rest: a key it wrote that the whole range nets away (inserted, then deleted later) would
      otherwise stay behind.

    Each segment is a request of consecutive snapshots; the first keeps the range's export when the range
    starts the line and the sink has no checkpoint.
    """
    ids = request.snapshot_ids
    first = ids.index(checkpoint.snapshot_id) + 1 if resumes_inside(checkpoint, info) and checkpoint else 0
    cuts = sorted({ids.index(end) + 1 for end in attempted_ends if end in ids[first:-1]})
    if first == 0 and not cuts:
        return None
    bounds = [first, *cuts, len(ids)]
    return [replace(request, snapshot_ids=ids[a:b], starts_line=request.includes_bootstrap and a == 0)
            for a, b in zip(bounds, bounds[1:], strict=False)]


def source_batch(spark: "SparkSession", catalog_name: str, table: "Table", request: BatchRequest,
                 use_row_id: bool) -> tuple[BatchInfo, Any]:
    """A segment's (:func:`segments`) batch and CDC events, computed from the source's history as the
    changelog step computes a batch (:func:`compute_batch`: an export, or the net changes of its snapshots),
    presented in the source schema of its last snapshot as the store presents its batches. Lazy: use the
    events inside ``changelog.staged_scans``.

    Raises:
        SnapshotNotFoundError: a snapshot of the segment is no longer in the source's history.
        DuplicateKeyChangeError, IdentifierColumnError: as for the range's own batch.
    """
    computed = compute_batch(spark, catalog_name, table, request)
    info, rows, keys = computed.info, computed.rows, request.identifier_columns
    current = table.schema()
    want = table.schemas().get(info.schema_id) if info.schema_id is not None else None
    if want is not None and want.schema_id != current.schema_id:  # the source changed after the batch's snapshot
        names = {f.field_id: f.name for f in want.fields}
        keys = tuple(names.get(current.find_field(k).field_id, k) for k in keys)
        data = {f.name for f in current.fields}
        rows = rows.select(*columns_by_field_id(want.fields, current, {i: i for i in names}),
                           *[column(c) for c in rows.columns if c not in data])
    return info, changelog.to_events(rows, request.table_name, keys, info.operation, info.snapshot_id,
                                     use_row_id=use_row_id, unique_ids=computed.kind == "export")


def row_stats(computed: ComputedBatch, counts: dict[str, int]) -> dict[str, Any]:
    """The batch's statistics completed with its row counts, once its rows are written.

    ``counts``: the written change rows per change type (the store counts them while writing).
    Rows read and carry-over removed: when the change rows are the rows read as they are (appends,
    whole-file deletes: nothing to cancel), from those counts; otherwise one count of the rows read,
    whose cost follows the change.
    """
    stats = dict(computed.stats)
    if not computed.counted:
        return stats
    stats.update({f"{t.lower()}_rows": int(counts.get(t, 0)) for t in CHANGE_TYPES})
    written = sum(counts.values())
    if computed.raw_rows is computed.rows:
        stats["rows_read"], stats["carry_over_removed"] = written, 0
    elif computed.raw_rows is not None:
        read = int(computed.raw_rows.count())
        stats["rows_read"], stats["carry_over_removed"] = read, read - written
    elif "rows_read" in stats:  # known from metadata (changelog.changes: every snapshot split, no delete file)
        stats["carry_over_removed"] = int(stats["rows_read"]) - written
    return stats


def uses_row_id(table: "Table", identifier_columns: Sequence[str]) -> bool:
    """Events of this table are identified by the v3 ``_row_id`` (row lineage and no key)."""
    return uses_row_lineage(table) and not tuple(identifier_columns)
