"""The replica's counts against the batch's events (pure: no Spark, no catalog): which batches compare,
and what each disagreement names."""

from icecdc_dagster.batch import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE, BatchInfo
from icecdc_dagster.sinks.base import ApplyResult
from icecdc_dagster.sinks.iceberg.agreement import KEYS_HELD, KEYS_MISSING, OTHER_WRITER, replica_disagreements

BATCH = BatchInfo(table_name="db.items", snapshot_id=7, sequence_number=3, first_snapshot_id=7,
                  accepted_predecessors=(6,), operation="append", committed_at_ms=0, identifier_columns=("id",))
EXPORT = BatchInfo(table_name="db.items", snapshot_id=5, sequence_number=1, first_snapshot_id=5,
                   accepted_predecessors=(), operation="append", committed_at_ms=0, is_export=True)


def _result(counts, counted_by="summary", skipped=False):
    return ApplyResult("replica/db.items_replica", skipped, None, counts, {"counted_by": counted_by})


def _found(batch, events, result):
    return [(d.count, d.change_types, d.expected, d.found, d.difference, d.cause)
            for d in replica_disagreements(batch, events, result)]


def test_an_ordinary_batch_agrees():
    events = {INSERT: 4, UPDATE_BEFORE: 3, UPDATE_AFTER: 3, DELETE: 2}
    result = _result({"inserted": 4, "updated": 3, "deleted": 2}, "summary+delete-keys")
    assert replica_disagreements(BATCH, events, result) == []
    assert replica_disagreements(BATCH, {}, _result({})) == []             # an empty batch (compaction)


def test_inserts_of_keys_the_replica_held_name_the_duplicate_source_key():
    found = _found(BATCH, {INSERT: 100}, _result({"inserted": 2, "updated": 98}))
    assert found == [("inserted", (INSERT,), 100, 2, -98, KEYS_HELD),
                     ("updated", (UPDATE_AFTER,), 0, 98, 98, KEYS_HELD)]
    assert "the source holds those keys twice" in KEYS_HELD and "something else wrote" in KEYS_HELD


def test_updates_and_deletes_of_keys_the_replica_lacked():
    events = {UPDATE_BEFORE: 2, UPDATE_AFTER: 2, DELETE: 3}
    found = _found(BATCH, events, _result({"inserted": 1, "updated": 1, "deleted": 2, "delete_missing": 1}, "join"))
    assert found == [("inserted", (INSERT,), 0, 1, 1, KEYS_MISSING),
                     ("updated", (UPDATE_AFTER,), 2, 1, -1, KEYS_MISSING),
                     ("deleted", (DELETE,), 3, 2, -1, KEYS_MISSING),
                     ("delete_missing", (), 0, 1, 1, KEYS_MISSING)]


def test_a_keyless_replica_appends_its_inserts():
    assert replica_disagreements(BATCH, {INSERT: 5}, _result({"appended": 5})) == []
    assert _found(BATCH, {INSERT: 5}, _result({"appended": 4})) == [
        ("appended", (INSERT, UPDATE_AFTER), 5, 4, -1, OTHER_WRITER)]


def test_batches_whose_counts_are_not_comparable_are_not_compared():
    upserted = _result({"inserted": 2, "updated": 98})
    assert replica_disagreements(EXPORT, {INSERT: 100}, upserted) == []                     # an export
    assert replica_disagreements(EXPORT, {INSERT: 100}, _result({"replaced": 90})) == []    # a resync's overwrite
    assert replica_disagreements(BATCH, {INSERT: 100}, _result({}, skipped=True)) == []      # already applied
    assert replica_disagreements(BATCH, {INSERT: 100}, _result({}, counted_by="")) == []     # not counted


def test_a_range_of_snapshots_compares_its_net_changes():
    """A catch-up batch's net changes keep one event per key, relative to the state before the range:
    the replica's state at its checkpoint."""
    netted = BatchInfo(table_name="db.items", snapshot_id=9, sequence_number=5, first_snapshot_id=7,
                       accepted_predecessors=(6,), operation="overwrite", committed_at_ms=0, snapshot_ids=(7, 8, 9))
    assert replica_disagreements(netted, {INSERT: 3, DELETE: 1}, _result({"inserted": 3, "deleted": 1})) == []
    assert [d.count for d in replica_disagreements(netted, {INSERT: 3}, _result({"inserted": 1, "updated": 2}))] == [
        "inserted", "updated"]


def _index(counts, details=None):
    return ApplyResult("opensearch/items", False, None, counts, details or {"index": "items"})


def test_an_index_reports_a_duplicate_source_key_from_its_bulk_answers():
    from icecdc_dagster.sinks.opensearch.agreement import KEYS_HELD as INDEX_KEYS_HELD
    from icecdc_dagster.sinks.opensearch.agreement import index_disagreements

    events = {INSERT: 4, UPDATE_BEFORE: 3, UPDATE_AFTER: 3, DELETE: 2}
    assert index_disagreements(BATCH, events, _index({"created": 4, "updated": 3, "deleted": 2})) == []
    duplicated = _index({"indexed": 7, "created": 2, "updated": 5})                   # 5 of 7 INSERTs held
    assert [(d.count, d.expected, d.found, d.cause) for d in index_disagreements(BATCH, {INSERT: 7}, duplicated)] == [
        ("created", 7, 2, INDEX_KEYS_HELD), ("updated", 0, 5, INDEX_KEYS_HELD)]
    # Not compared: a redo (the dead attempt's actions answer a conflict or a missing delete), a range, an
    # export, a batch written during a rebuild.
    assert index_disagreements(BATCH, {INSERT: 7}, _index({**duplicated.counts, "version_conflicts": 1})) == []
    assert index_disagreements(BATCH, {DELETE: 2}, _index({"deleted": 1, "delete_not_found": 1})) == []
    ranged = BatchInfo(table_name="db.items", snapshot_id=9, sequence_number=5, first_snapshot_id=7,
                       accepted_predecessors=(6,), operation="append", committed_at_ms=0)
    assert index_disagreements(ranged, {INSERT: 7}, duplicated) == []
    assert index_disagreements(EXPORT, {INSERT: 7}, duplicated) == []
    assert index_disagreements(BATCH, {INSERT: 7}, _index(duplicated.counts, {"reindexed": "mapping"})) == []
