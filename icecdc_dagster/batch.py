"""What the changelog engine hands to sinks: one batch of CDC events and its position.

A batch is the changes of one snapshot (or the net changes of a run of
snapshots) of one source table. Sinks keep their own checkpoint and use
:func:`decide` so that a retried, duplicated or out-of-order batch can never
corrupt the target, whatever the orchestrator does.
"""

import enum
import re
from dataclasses import dataclass, field

from icecdc_dagster.errors import CheckpointError

# Change row columns (added to the table's own columns).
CHANGE_TYPE = "_change_type"
COMMIT_SNAPSHOT_ID = "_commit_snapshot_id"
COMMIT_SEQUENCE_NUMBER = "_commit_sequence_number"
CHANGE_ORDINAL = "_change_ordinal"
COMMIT_TIMESTAMP = "_commit_timestamp"  # the snapshot's commit time (timestamp-ms), a UTC instant
CHANGE_COLUMNS = (CHANGE_TYPE, COMMIT_SNAPSHOT_ID, COMMIT_SEQUENCE_NUMBER, CHANGE_ORDINAL, COMMIT_TIMESTAMP)

INSERT, DELETE, UPDATE_BEFORE, UPDATE_AFTER = "INSERT", "DELETE", "UPDATE_BEFORE", "UPDATE_AFTER"
CHANGE_TYPES = (INSERT, DELETE, UPDATE_BEFORE, UPDATE_AFTER)

# CDC event columns (added to change rows; what sinks consume).
ICEBERG_OPERATION = "iceberg_operation"
ICEBERG_TABLE_NAME = "iceberg_table_name"
ICEBERG_SNAPSHOT_ID = "iceberg_snapshot_id"
DOCUMENT_ID = "document_id"
BULK_ACTION = "bulk_action"
EVENT_COLUMNS = (ICEBERG_OPERATION, ICEBERG_TABLE_NAME, ICEBERG_SNAPSHOT_ID, DOCUMENT_ID, BULK_ACTION)
INDEX_ACTION, DELETE_ACTION = "INDEX", "DELETE"

# v3 row lineage metadata columns.
ROW_ID = "_row_id"
LAST_UPDATED_SEQUENCE_NUMBER = "_last_updated_sequence_number"


@dataclass(frozen=True)
class Checkpoint:
    """The last source snapshot a sink has applied. ``line``: the resync key of the line it belongs to
    (None: the original line); sequence numbers only compare within one line."""

    snapshot_id: int
    sequence_number: int
    line: str | None = None


@dataclass(frozen=True)
class BatchInfo:
    """Where a batch sits in the source table's history.

    ``accepted_predecessors``: checkpoints after which this batch may be applied:
    the parent of the first snapshot, plus the ancestors reachable from it
    through snapshots that carry no logical change (REPLACE / compaction).
    An export batch (bootstrap) is accepted only by an empty sink.
    """

    table_name: str
    snapshot_id: int
    sequence_number: int
    first_snapshot_id: int
    accepted_predecessors: tuple[int, ...]
    operation: str
    committed_at_ms: int
    is_export: bool = False
    identifier_columns: tuple[str, ...] = ()
    snapshot_ids: tuple[int, ...] = field(default=())
    line: str | None = None  # resync key of the batch's line (None: the original line)
    # The source schema of the batch's last snapshot (its Iceberg schema id): the schema sinks present the
    # batch in and follow, by field id. None: the source's current schema.
    schema_id: int | None = None

    @property
    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.snapshot_id, self.sequence_number, self.line)

    @property
    def resyncs_target(self) -> bool:
        """An export of a resync line: the sink replaces what it holds (converges), never merges."""
        return self.is_export and self.line is not None


class Decision(enum.Enum):
    APPLY = "apply"
    ALREADY_APPLIED = "already_applied"


def decide(sink_name: str, checkpoint: Checkpoint | None, batch: BatchInfo) -> Decision:
    """Apply, skip as already applied, or refuse (raise) a batch given the sink's checkpoint."""
    if checkpoint is None:
        if batch.is_export:
            return Decision.APPLY
        raise CheckpointError(
            f"{sink_name}: has no checkpoint, so it cannot apply snapshot {batch.snapshot_id} of "
            f"{batch.table_name}; the table's export batch must be applied first")
    if checkpoint.line != batch.line:
        if batch.is_export:
            return Decision.APPLY  # the bootstrap of a new line (resync) replaces the old line's state
        raise CheckpointError(
            f"{sink_name}: refusing snapshot {batch.snapshot_id} of {batch.table_name}: the sink is on line "
            f"{checkpoint.line or 'original'} at snapshot {checkpoint.snapshot_id}, the batch on line "
            f"{batch.line or 'original'}; apply the line's bootstrap export first (icecdc resync)")
    if checkpoint.snapshot_id == batch.snapshot_id or checkpoint.sequence_number >= batch.sequence_number:
        return Decision.ALREADY_APPLIED
    if checkpoint.snapshot_id in batch.accepted_predecessors:
        return Decision.APPLY
    if resumes_inside(checkpoint, batch):
        raise CheckpointError(
            f"{sink_name}: refusing snapshots {batch.first_snapshot_id}..{batch.snapshot_id} of {batch.table_name} "
            f"as one batch: the sink is at snapshot {checkpoint.snapshot_id} inside that range, so it takes only "
            f"the range's tail after it (steps.batches.segments)")
    raise CheckpointError(
        f"{sink_name}: refusing snapshot {batch.snapshot_id} of {batch.table_name}: the sink is at "
        f"snapshot {checkpoint.snapshot_id} (sequence {checkpoint.sequence_number}) but this batch "
        f"follows {list(batch.accepted_predecessors)}; apply the batches in between first")


def resumes_inside(checkpoint: Checkpoint | None, batch: BatchInfo) -> bool:
    """The sink's checkpoint is a snapshot of the batch's range before its last one, on the batch's line.

    Each sink commits its own checkpoint, so a run killed between two sinks' commits leaves them at
    different snapshots, and the next run's range starts after the lowest. The range's net changes
    cannot go to a sink that is already inside it (a key it holds that was deleted later in the range
    nets to nothing): it takes only the snapshots after its checkpoint (``steps.batches.segments``)."""
    return (checkpoint is not None and checkpoint.line == batch.line
            and checkpoint.snapshot_id in batch.snapshot_ids[:-1]
            and checkpoint.sequence_number < batch.sequence_number)


# A resync line's token is its first key, ``<snapshot id>@resync<n>`` (``steps.lifecycle``).
RESYNC_KEY = re.compile(r"^(-?\d+)@resync(\d+)$")


def line_epoch(token: str | None) -> int:
    """0 for the original line, n for the line started by the n-th resync."""
    match = RESYNC_KEY.match(token or "")
    return int(match.group(2)) if match else 0
