"""What a batch records, written through its kind's set and read through ``lines.batch_metadata.BatchMetadata``,
through a real Dagster instance: the round trip, bookkeeping under ``icecdc/``, what the previous release wrote
(bare keys), missing and mistyped keys."""

import time

from dagster import AssetMaterialization, MetadataValue

from icecdc_dagster.assets import naming
from icecdc_dagster.assets.changelog import ordinal_anchor
from icecdc_dagster.batch import BatchInfo
from icecdc_dagster.changelog.ordinals import OrdinalAnchor
from icecdc_dagster.config import TableConfig
from icecdc_dagster.lines.batch_metadata import (
    ANCESTRY,
    NONE,
    BatchMetadata,
    ChangelogMetadata,
    OpenSearchMetadata,
    ReplicaMetadata,
)

TABLE = TableConfig(table_name="db.orders")
SNAPSHOT, PARENT = 7336221895141105312, 5191866335463409612  # ids past 2^53: they travel as text
LINE = f"{PARENT}@resync1"


def _stored(instance, metadata, partition: str = str(SNAPSHOT)) -> AssetMaterialization:
    """``metadata`` recorded as a changelog batch's materialisation, read back from the event log."""
    key = naming.changelog_key(TABLE)
    instance.add_dynamic_partitions(naming.partitions_name(TABLE), [partition])
    instance.report_runless_asset_event(AssetMaterialization(key, partition=partition, metadata=metadata))
    materialization = instance.fetch_materializations(key, limit=1).records[0].asset_materialization
    assert materialization is not None
    return materialization


def test_a_batch_reads_back_as_it_was_written(instance):
    info = BatchInfo(table_name=TABLE.table_name, snapshot_id=SNAPSHOT, sequence_number=41, first_snapshot_id=SNAPSHOT,
                     accepted_predecessors=(PARENT,), operation="overwrite", committed_at_ms=1_700_000_000_000,
                     snapshot_ids=(SNAPSHOT,))
    counts = {"INSERT": 3, "UPDATE_AFTER": 2, "UPDATE_BEFORE": 2}
    written = ChangelogMetadata.of_batch(info, PARENT, time.monotonic(), counts, line=LINE,
                                         source_table_uuid="0c5e", ordered_by=ANCESTRY, batch_kind="cow")
    assert ChangelogMetadata.extract(dict(written)) == written  # in memory, before Dagster stores it
    figures = {"rows_read": 9, "line": "not the batch's line", "partitions": ["a=1"], "insert_rows": 3}
    stored = _stored(instance, written.with_figures(figures))
    read = BatchMetadata.read(stored)
    assert ChangelogMetadata.read(stored) == written.model_copy(update={"rows_read": 9})
    assert (read.snapshot_id, read.parent_snapshot_id, read.sequence_number) == (str(SNAPSHOT), str(PARENT), 41)
    assert (read.rows, read.count_insert, read.count_update_after, read.count_delete) == (7, 3, 2, 0)
    assert read.line == LINE and read.ordinal_position == (SNAPSHOT, 41)
    # A figure under a field the set leaves unset fills it (typed); others are shown beside the set under their
    # own names and never replace one of its fields; a figure repeating a fact is left out.
    assert stored.metadata["rows_read"].value == 9 and stored.metadata["partitions"].value == ["a=1"]
    assert "insert_rows" not in stored.metadata
    # Bookkeeping under icecdc/, apart from what people read.
    assert stored.metadata["icecdc/line"].value == LINE and "line" not in stored.metadata
    assert {key for key in stored.metadata if key.startswith("icecdc/")} == {
        "icecdc/line", "icecdc/source_table_uuid", "icecdc/ordered_by"}
    assert ordinal_anchor(instance, TABLE, LINE) == OrdinalAnchor(SNAPSHOT, 41)
    assert ordinal_anchor(instance, TABLE, None) is None  # another line's batch


def test_the_keys_stay_those_the_ui_docs_and_earlier_releases_name(instance):
    info = BatchInfo(table_name=TABLE.table_name, snapshot_id=SNAPSHOT, sequence_number=1, first_snapshot_id=SNAPSHOT,
                     accepted_predecessors=(), operation="append", committed_at_ms=1_700_000_000_000, is_export=True)
    common = ["snapshot_id", "first_snapshot_id", "parent_snapshot_id", "snapshots_in_batch", "operation",
              "sequence_number", "is_export", "commit_time", "lag_commit_to_applied_s", "duration_s", "rows",
              "count_insert", "count_delete", "count_update_before", "count_update_after", "skipped_already_applied",
              "checkpoint_snapshot_id"]
    index = OpenSearchMetadata.of_batch(info, None, time.monotonic(), {"INSERT": 4}, skipped_already_applied=False,
                                        checkpoint_snapshot_id=str(SNAPSHOT))
    # Every count of the bulk, 0 included (a skipped batch counts nothing: all 0).
    assert list(index.with_figures(index.sink_counts({"actions": 4}))) == [*common, *(
        f"sink_{c}" for c in ("indexed", "created", "updated", "deleted", "delete_not_found", "version_conflicts",
                              "failed", "actions"))]
    replica = ReplicaMetadata.of_batch(info, None, time.monotonic(), {"INSERT": 4}, skipped_already_applied=True,
                                       checkpoint_snapshot_id=str(SNAPSHOT))
    shown = replica.with_figures({**replica.sink_counts({}), "target_snapshot_id": SNAPSHOT, "added_columns": []})
    assert list(shown) == [*common, "sink_inserted", "sink_updated", "sink_deleted", "sink_delete_missing",
                           "target_snapshot_id", "added_columns"]
    assert shown["target_snapshot_id"] == str(SNAPSHOT) and shown["sink_deleted"] == 0  # ids as text
    assert BatchMetadata.extract(shown).checkpoint == SNAPSHOT and index.parent_snapshot_id == NONE


def test_a_materialisation_of_the_previous_release_is_read(instance):
    """Exactly what the previous release's ``batch_metadata`` and ``line_metadata`` wrote for a changelog
    batch of a format v1 line, and for a sink that had no checkpoint yet."""
    previous = {
        "snapshot_id": MetadataValue.text(str(SNAPSHOT)), "first_snapshot_id": MetadataValue.text(str(SNAPSHOT)),
        "parent_snapshot_id": MetadataValue.text("none"), "snapshots_in_batch": 1, "operation": "append",
        "sequence_number": 12, "is_export": False, "commit_time": MetadataValue.timestamp(1_700_000_000.0),
        "lag_commit_to_applied_s": MetadataValue.float(3.25), "duration_s": MetadataValue.float(1.5), "rows": 2,
        "count_insert": 2, "count_delete": 0, "count_update_before": 0, "count_update_after": 0,
        "batch_kind": "append", "changelog_table": "db.orders__changelog", "changelog_snapshot_id": "991",
        "source_table_uuid": "0c5e", "line": LINE, "ordered_by": "ancestry", "rows_read": 2,
        "checkpoint_snapshot_id": "none", "sink_inserted": 2,
    }
    read = BatchMetadata.read(_stored(instance, previous))
    assert (read.snapshot_id, read.sequence_number, read.line, read.source_table_uuid) == (str(SNAPSHOT), 12, LINE,
                                                                                           "0c5e")
    assert read.commit_time == MetadataValue.timestamp(1_700_000_000.0) and read.lag_commit_to_applied_s == 3.25
    assert read.checkpoint is None and read.counts_ordinals
    assert ordinal_anchor(instance, TABLE, LINE) == OrdinalAnchor(SNAPSHOT, 12)


def test_missing_and_mistyped_keys_read_as_none(instance):
    assert BatchMetadata.read(None) == BatchMetadata()
    bare = BatchMetadata.read(_stored(instance, {}))
    assert bare == BatchMetadata() and dict(bare) == {}
    assert (bare.line, bare.checkpoint, bare.ordinal_position) == (None, None, None)
    assert ordinal_anchor(instance, TABLE, None) is None
    # A value of another type (a hand-made or foreign event) is dropped, never a failing reader.
    odd = BatchMetadata.read(_stored(instance, {"sequence_number": "twelve", "checkpoint_snapshot_id": "n/a",
                                                "ordered_by": ANCESTRY, "snapshot_id": str(SNAPSHOT)}, "2"))
    assert odd.sequence_number is None and odd.snapshot_id == str(SNAPSHOT) and odd.checkpoint is None
    assert odd.ordinal_position is None


class _Renamed(BatchMetadata):
    """A later release that renames ``line`` to ``line_key``."""

    line_key: str | None = None

    @classmethod
    def current_key_by_legacy_key(cls) -> dict[str, str]:
        return {"line": "line_key"}


def test_a_renamed_key_is_read_under_its_old_name_unless_the_new_one_is_there():
    assert _Renamed.extract({"line": LINE}).line_key == LINE
    assert _Renamed.extract({"line": "old", "line_key": LINE}).line_key == LINE
