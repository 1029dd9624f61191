"""Whether an index's bulk writes did what the batch's events say: the bulk answers against the events.

Each INDEX action answers ``created`` (the index had no such document) or ``updated`` (it had one at a
lower version); each DELETE ``deleted``. The index equals the source at its checkpoint, which is where a
single-snapshot batch starts, so its bulk must create exactly the INSERTs, update exactly the
UPDATE_AFTERs and delete exactly the DELETEs (a batch holds at most one event per document). When rows are
appended to the source with keys it already had, each is an INSERT of a document the index holds: the
bulk answers ``updated``, and the index ends with fewer documents than the source has rows, which nothing
in the batch's own keys shows. The replica reports the same batch the same way (``sinks.iceberg.agreement``).

Not compared, because the answers are not exactly comparable there:

* a batch the sink skipped (already applied), an export (bootstrap, a sink joining the line, a resync: the
  index may hold documents legitimately), a batch written while the index was rebuilt (``reindexed``);
* a batch of several snapshots: the sink's checkpoint may lie inside the range after a kill, so some of
  its documents are already there;
* a redo: a batch whose bulk answered a version conflict or a delete of a missing document. An earlier
  attempt wrote those actions before it died (external versions make them answer so), and the actions it
  did not write answer as on a first attempt; they cannot be told apart from the index's side.
"""

from collections.abc import Mapping

from icecdc_dagster.batch import DELETE, INSERT, UPDATE_AFTER, BatchInfo
from icecdc_dagster.sinks.base import ApplyResult, CountRule, Disagreement, count_disagreements
from icecdc_dagster.sinks.opensearch.actions import CREATED, DELETE_NOT_FOUND, DELETED, UPDATED, VERSION_CONFLICT

KEYS_HELD = ("the index already held documents the batch inserts (its INSERTs became updates): the source holds "
             "those keys twice (rows appended with keys it already had), or something else wrote them into the "
             "index")
KEYS_MISSING = ("the index lacked documents the batch updates (updates became creations): something else removed "
                "them from the index, or an earlier batch diverged (a key the source held twice)")
OTHER_WRITER = "something else wrote the index"

# (the bulk's count, the change types it equals, the cause when it found fewer, when it found more)
RULES: tuple[CountRule, ...] = ((CREATED, (INSERT,), KEYS_HELD, KEYS_MISSING),
         (UPDATED, (UPDATE_AFTER,), KEYS_MISSING, KEYS_HELD),
         (DELETED, (DELETE,), OTHER_WRITER, OTHER_WRITER))


def compared(batch: BatchInfo, result: ApplyResult) -> bool:
    """Whether the bulk's answers are exactly comparable with the batch's events (see the module docstring)."""
    if result.skipped or batch.is_export or batch.first_snapshot_id != batch.snapshot_id:
        return False
    redo = result.counts.get(VERSION_CONFLICT, 0) or result.counts.get(DELETE_NOT_FOUND, 0)
    return not redo and "reindexed" not in result.details


def index_disagreements(batch: BatchInfo, event_counts: Mapping[str, int],
                        result: ApplyResult) -> list[Disagreement]:
    """The bulk's counts that differ from the batch's events (empty: they agree, or not compared)."""
    if not compared(batch, result):
        return []
    return count_disagreements(RULES, event_counts, result.counts)
