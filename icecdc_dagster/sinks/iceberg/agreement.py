"""Whether a replica's MERGE did what the batch's events say: its exact counts against the events'.

A batch holds at most one INSERT, DELETE or UPDATE_AFTER per key (the engine fails a snapshot with two
INSERTs or two DELETEs of a key; a range's net changes keep one per key), and says, per key, whether
the key existed in the source before the batch: an INSERT's did not, an UPDATE's and a DELETE's did.
The replica equals the source at its checkpoint, which is where the batch starts, so its MERGE must
insert exactly the INSERTs, update exactly the UPDATE_AFTERs and delete exactly the DELETEs. The counts
are the MERGE's own, read against the snapshot it merged into (``writer.merge.batch_counts``).

When they differ, the replica held what the source did not (or the other way round), and the line can
no longer keep them equal: e.g. rows appended to the source with keys it already had are INSERT events
whose keys the replica holds, so the MERGE upserts them (counted ``updated``), and the replica ends with
fewer rows than the source. Nothing in the batch's own keys shows it (each is one INSERT).

Not compared, because the counts are not exactly comparable there:

* a batch the replica skipped (already applied): nothing was written, nothing counted;
* an export (the line's bootstrap, a sink joining the line, a resync): applied to a replica without a
  checkpoint, which may hold rows legitimately (a table kept or created before the sink), and a resync
  overwrites (``replaced``). The export's own keys are checked by the engine (two rows of a key fail it);
* counts that were not taken (``counted_by`` empty).

A retry after a crash is not an exception: the replica stages every write on a branch and publishes the
batch and its checkpoint in one commit, so a crash leaves the batch either published (the retry skips
it) or unpublished (the retry MERGEs into the same snapshot as the first attempt did, from scratch).
"""

from collections.abc import Mapping

from icecdc_dagster.batch import DELETE, INSERT, UPDATE_AFTER, BatchInfo
from icecdc_dagster.sinks.base import ApplyResult, CountRule, Disagreement, count_disagreements

KEYS_HELD = ("the replica already held keys the batch inserts (its INSERTs became updates): the source holds "
             "those keys twice (rows appended with keys it already had), or something else wrote them into the "
             "replica")
KEYS_MISSING = ("the replica lacked keys the batch updates or deletes (updates became inserts, deletes found "
                "nothing): something else removed them from the replica, or an earlier batch diverged (a key "
                "the source held twice)")
OTHER_WRITER = "something else wrote the replica"

# (the replica's count, the change types it equals, the cause when it found fewer, when it found more)
KEYED_RULES: tuple[CountRule, ...] = (("inserted", (INSERT,), KEYS_HELD, KEYS_MISSING),
               ("updated", (UPDATE_AFTER,), KEYS_MISSING, KEYS_HELD),
               ("deleted", (DELETE,), KEYS_MISSING, OTHER_WRITER),
               ("delete_missing", (), OTHER_WRITER, KEYS_MISSING))
APPEND_RULES: tuple[CountRule, ...] = (("appended", (INSERT, UPDATE_AFTER), OTHER_WRITER, OTHER_WRITER),)


def compared(batch: BatchInfo, result: ApplyResult) -> bool:
    """Whether the batch's counts are exactly comparable with its events (see the module docstring)."""
    return not result.skipped and not batch.is_export and bool(result.details.get("counted_by"))


def replica_disagreements(batch: BatchInfo, event_counts: Mapping[str, int],
                          result: ApplyResult) -> list[Disagreement]:
    """The replica's counts that differ from the batch's events (empty: they agree, or not compared).
    A count the MERGE did not report is 0 (``batch_counts`` leaves zeros out)."""
    if not compared(batch, result):
        return []
    rules = APPEND_RULES if "appended" in result.counts else KEYED_RULES
    return count_disagreements(rules, event_counts, result.counts)
