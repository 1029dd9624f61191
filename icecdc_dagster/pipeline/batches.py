"""Turn a run of partition keys (snapshot ids) into a BatchInfo and its change rows."""

import time
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

from icecdc_dagster import changelog
from icecdc_dagster.batch import BatchInfo


@dataclass(frozen=True)
class BatchRequest:
    """A run of consecutive snapshot keys of one table, and how the table is configured."""

    table_name: str
    snapshot_ids: tuple[int, ...]
    bootstrap_snapshot_id: int
    disable_export: bool = False
    identifier_columns: tuple[str, ...] = ()

    @property
    def includes_bootstrap(self) -> bool:
        return self.snapshot_ids[0] == self.bootstrap_snapshot_id


@dataclass
class ComputedBatch:
    info: BatchInfo
    rows: Any  # Spark DataFrame of change rows (all four change types); sinks derive events at read
    stats: dict[str, Any] = field(default_factory=dict)
    kind: str = "cdc"  # "export", "bootstrap" (export disabled), "cdc" or "net"


def identifier_columns_of(configured: Sequence[str], table) -> tuple[str, ...]:  # noqa: ANN001
    """The configured identifier columns, else the table's own identifier fields (schema order)."""
    if configured:
        return tuple(configured)
    schema = table.schema()
    ids = set(schema.identifier_field_ids)
    return tuple(f.name for f in schema.fields if f.field_id in ids)


def keys_to_request(table_name: str, keys: Sequence[str], bootstrap_key: str, disable_export: bool,
                    identifier_columns: Sequence[str]) -> BatchRequest:
    """``bootstrap_key``: the table's first partition key (its bootstrap snapshot)."""
    return BatchRequest(table_name=table_name, snapshot_ids=tuple(int(k) for k in keys),
                        bootstrap_snapshot_id=int(bootstrap_key), disable_export=disable_export,
                        identifier_columns=tuple(identifier_columns))


def batch_info(table, request: BatchRequest) -> BatchInfo:  # noqa: ANN001 - pyiceberg Table
    """Position of the batch in the table's history, from metadata only."""
    first, last = request.snapshot_ids[0], request.snapshot_ids[-1]
    last_plan = changelog.plan_snapshot(table, last)
    predecessors = () if request.includes_bootstrap else tuple(changelog.accepted_predecessors(table, first))
    return BatchInfo(
        table_name=request.table_name,
        snapshot_id=last,
        sequence_number=last_plan.sequence_number,
        first_snapshot_id=first,
        accepted_predecessors=predecessors,
        operation=last_plan.operation,
        committed_at_ms=last_plan.committed_at_ms,
        is_export=request.includes_bootstrap,
        identifier_columns=request.identifier_columns,
        snapshot_ids=request.snapshot_ids,
    )


def uses_row_lineage(table) -> bool:  # noqa: ANN001
    return int(table.metadata.format_version) >= 3


def compute_batch(spark, catalog_name: str, table, request: BatchRequest) -> ComputedBatch:  # noqa: ANN001
    """The batch's change rows (lazy DataFrame) and engine statistics.

    - export: every row of the last snapshot as INSERT (nets the bootstrap with what followed);
    - bootstrap with export disabled: only the changes after the bootstrap snapshot;
    - otherwise the changes of the snapshot, or the net changes of the run of snapshots.
    """
    info = batch_info(table, request)
    first, last = request.snapshot_ids[0], request.snapshot_ids[-1]
    started = time.monotonic()
    if request.includes_bootstrap and not request.disable_export:
        change_set, kind = changelog.export(spark, catalog_name, table, last, request.identifier_columns), "export"
    elif request.includes_bootstrap:
        if first == last:
            change_set, kind = None, "bootstrap"
        else:
            change_set, kind = changelog.changes(spark, catalog_name, table, (first, last),
                                                 request.identifier_columns, net=True), "net"
    elif first == last:
        change_set, kind = changelog.changes(spark, catalog_name, table, last, request.identifier_columns), "cdc"
    else:
        parent = changelog.plan_snapshot(table, first).parent_id
        change_set, kind = changelog.changes(spark, catalog_name, table, (parent, last),
                                             request.identifier_columns, net=True), "net"
    if change_set is None:
        rows = changelog.export(spark, catalog_name, table, last).rows.limit(0)
        stats: dict[str, Any] = {}
    else:
        rows = change_set.rows
        # Row counts per change type (before images included), rows read and carry-over removed:
        # aggregations over the change rows, so their cost follows the change. Not for an export,
        # whose rows are the whole table (the stored batch's counts say the same for free).
        stats = dict(change_set.stats) if kind == "export" else change_set.compute_stats()
    stats["plan_s"] = round(time.monotonic() - started, 3)
    return ComputedBatch(info=info, rows=rows, stats=stats, kind=kind)


def uses_row_id(table, identifier_columns) -> bool:  # noqa: ANN001
    """Events of this table are identified by the v3 ``_row_id`` (row lineage and no key)."""
    return uses_row_lineage(table) and not tuple(identifier_columns)
