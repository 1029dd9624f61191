"""Format v1 tables (no sequence numbers) are followed: Iceberg's own changelog tests (TestChangelogTable:
data filters, overwrites, time ranges, metadata deletes, manifest merges and rewrites, rollback) give the
view's rows on v1 (and v2, the same code); a v1 line numbers its snapshots along parent ids
(``changelog.ordinals``), from its anchor, so expiring old snapshots changes no number; a v1 table set
to merge-on-read is refused with the way out."""

from collections import Counter

import pytest

from icecdc_dagster import changelog
from icecdc_dagster.batch import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from icecdc_dagster.changelog.ordinals import OrdinalAnchor, ancestry_depth, sequence_number
from icecdc_dagster.errors import SnapshotOrderLostError, UnsupportedFormatVersionError
from icecdc_dagster.steps.batches import BatchRequest, batch_info

VIEW_COLUMNS = ["id", "data", "_change_type", "_change_ordinal", "_commit_snapshot_id"]
VERSIONS = pytest.mark.parametrize("version", [1, 2])


def create(spark, ident: str, version: int, partitioned: bool = True, extra: str = "") -> None:
    partition = "PARTITIONED BY (data)" if partitioned else ""
    spark.sql(f"CREATE TABLE {ident} (id int NOT NULL, data string) USING iceberg {partition} "
              f"TBLPROPERTIES ('format-version'='{version}'{extra})")


def snapshot_ids(catalog) -> list[int]:
    return [p.snapshot_id for p in changelog.snapshots_after(catalog.load_table("db.t"), None)]


def view(spark, cat: str, options: dict[str, object], name: str = "v") -> Counter:
    """Rows of Iceberg's changelog view (carry-over removed, no update detection: the view's defaults)."""
    opts = ", ".join(f"'{k}', '{v}'" for k, v in options.items())
    with_options = f", options => map({opts})" if opts else ""
    spark.sql(f"CALL {cat}.system.create_changelog_view(table => 'db.t', changelog_view => '{name}'{with_options})")
    return Counter(tuple(r) for r in spark.sql(f"SELECT {', '.join(VIEW_COLUMNS)} FROM {name}").collect())


def ours(spark, catalog_settings, catalog, selector) -> Counter:
    rows = changelog.changes(spark, catalog_settings.name, catalog.load_table("db.t"), selector).rows.collect()
    return Counter(tuple(r[c] for c in VIEW_COLUMNS) for r in rows)


@VERSIONS
def test_data_filters(spark, catalog, catalog_settings, version):
    ident = f"{catalog_settings.name}.db.t"
    create(spark, ident, version)
    for row in ("(1, 'a')", "(2, 'b')", "(3, 'c')"):
        spark.sql(f"INSERT INTO {ident} VALUES {row}")
    spark.sql(f"DELETE FROM {ident} WHERE id = 3")
    ids = snapshot_ids(catalog)
    got = ours(spark, catalog_settings, catalog, (None, ids[-1]))
    assert {k: n for k, n in got.items() if k[0] == 3} == {
        (3, "c", INSERT, 2, ids[2]): 1, (3, "c", DELETE, 3, ids[3]): 1}
    assert got == view(spark, catalog_settings.name, {})


@VERSIONS
def test_overwrites(spark, catalog, catalog_settings, version):
    ident = f"{catalog_settings.name}.db.t"
    create(spark, ident, version)
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a')")
    spark.sql(f"INSERT INTO {ident} VALUES (2, 'b')")
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:
        spark.sql(f"INSERT OVERWRITE {ident} VALUES (-2, 'b')")
    finally:
        spark.conf.unset("spark.sql.sources.partitionOverwriteMode")
    ids = snapshot_ids(catalog)
    got = ours(spark, catalog_settings, catalog, (ids[1], ids[2]))
    assert got == Counter({(2, "b", DELETE, 0, ids[2]): 1, (-2, "b", INSERT, 0, ids[2]): 1})
    assert got == view(spark, catalog_settings.name, {"start-snapshot-id": ids[1], "end-snapshot-id": ids[2]})


@VERSIONS
def test_time_ranges(spark, catalog, catalog_settings, version):
    """The view's time range selects the snapshots after the start (exclusive) up to the end: the same
    rows as our snapshot range between the snapshots committed at those instants."""
    ident = f"{catalog_settings.name}.db.t"
    create(spark, ident, version)
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a')")
    spark.sql(f"INSERT INTO {ident} VALUES (2, 'b')")
    spark.sql(f"INSERT OVERWRITE {ident} VALUES (-2, 'b')")
    table = catalog.load_table("db.t")
    ids = snapshot_ids(catalog)
    at = [table.metadata.snapshot_by_id(s).timestamp_ms for s in ids]
    assert view(spark, catalog_settings.name, {"start-timestamp": at[0], "end-timestamp": at[2]}, "v1") \
        == ours(spark, catalog_settings, catalog, (ids[0], ids[2]))
    assert view(spark, catalog_settings.name, {"start-timestamp": at[0], "end-timestamp": at[1]}, "v2") \
        == ours(spark, catalog_settings, catalog, (ids[0], ids[1]))
    assert view(spark, catalog_settings.name, {"start-timestamp": at[1]}, "v3") \
        == ours(spark, catalog_settings, catalog, (ids[1], ids[2]))


@VERSIONS
def test_metadata_deletes(spark, catalog, catalog_settings, version):
    ident = f"{catalog_settings.name}.db.t"
    create(spark, ident, version)
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a')")
    spark.sql(f"INSERT INTO {ident} VALUES (2, 'b')")
    spark.sql(f"DELETE FROM {ident} WHERE data = 'a'")  # a whole partition: a metadata-only delete
    table = catalog.load_table("db.t")
    ids = snapshot_ids(catalog)
    assert table.metadata.snapshot_by_id(ids[2]).summary.operation.value == "delete"
    got = ours(spark, catalog_settings, catalog, (ids[1], ids[2]))
    assert got == Counter({(1, "a", DELETE, 0, ids[2]): 1})
    assert got == view(spark, catalog_settings.name, {"start-snapshot-id": ids[1], "end-snapshot-id": ids[2]})


@VERSIONS
def test_existing_entries_in_new_data_manifests_are_ignored(spark, catalog, catalog_settings, version):
    ident = f"{catalog_settings.name}.db.t"
    create(spark, ident, version, extra=", 'commit.manifest.min-count-to-merge'='1', "
                                        "'commit.manifest-merge.enabled'='true'")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a')")
    spark.sql(f"INSERT INTO {ident} VALUES (2, 'b')")  # its manifest carries (1, 'a') as EXISTING
    ids = snapshot_ids(catalog)
    got = ours(spark, catalog_settings, catalog, (ids[0], ids[1]))
    assert got == Counter({(2, "b", INSERT, 0, ids[1]): 1})
    assert got == view(spark, catalog_settings.name, {"start-snapshot-id": ids[0], "end-snapshot-id": ids[1]})


@VERSIONS
def test_manifest_rewrites_are_ignored(spark, catalog, catalog_settings, version):
    ident = f"{catalog_settings.name}.db.t"
    create(spark, ident, version)
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a')")
    spark.sql(f"INSERT INTO {ident} VALUES (2, 'b')")
    spark.sql(f"CALL {catalog_settings.name}.system.rewrite_manifests('db.t')")
    spark.sql(f"INSERT INTO {ident} VALUES (3, 'c')")
    table = catalog.load_table("db.t")
    ids = snapshot_ids(catalog)
    assert table.metadata.snapshot_by_id(ids[2]).summary.operation.value == "replace"
    assert ours(spark, catalog_settings, catalog, ids[2]) == Counter()
    got = ours(spark, catalog_settings, catalog, (None, ids[-1]))
    assert Counter((r[0], r[2], r[4]) for r in got.elements()) == Counter(
        {(1, INSERT, ids[0]): 1, (2, INSERT, ids[1]): 1, (3, INSERT, ids[3]): 1})
    expected = view(spark, catalog_settings.name, {})
    # Iceberg skips the replace snapshot when it numbers the range; we number every snapshot of it.
    assert Counter((r[0], r[1], r[2], r[4]) for r in got.elements()) \
        == Counter((r[0], r[1], r[2], r[4]) for r in expected.elements())


@VERSIONS
def test_rollback(spark, catalog, catalog_settings, version):
    """After a rollback the changes follow the current ancestry, as the view does; the rolled-back
    snapshot is no longer in any range."""
    ident = f"{catalog_settings.name}.db.t"
    create(spark, ident, version)
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"UPDATE {ident} SET id = 20 WHERE id = 2")
    first, gone = snapshot_ids(catalog)
    spark.sql(f"CALL {catalog_settings.name}.system.rollback_to_snapshot('db.t', {first})")
    spark.sql(f"DELETE FROM {ident} WHERE id = 1")
    spark.sql(f"INSERT INTO {ident} VALUES (3, 'c')")
    ids = snapshot_ids(catalog)
    assert gone not in ids and ids[0] == first and len(ids) == 3
    got = ours(spark, catalog_settings, catalog, (None, ids[-1]))
    assert got == Counter({(1, "a", INSERT, 0, ids[0]): 1, (2, "b", INSERT, 0, ids[0]): 1,
                           (1, "a", DELETE, 1, ids[1]): 1, (3, "c", INSERT, 2, ids[2]): 1})
    assert got == view(spark, catalog_settings.name, {})
    assert ours(spark, catalog_settings, catalog, (first, ids[-1])) == view(
        spark, catalog_settings.name, {"start-snapshot-id": first}, "after")


def test_v1_line_numbers_snapshots_by_ancestry_and_nets_ranges_in_that_order(spark, catalog, catalog_settings):
    """Without an anchor a v1 snapshot's number is its depth; the update chain a -> b -> c -> d nets to
    a -> d, ordered by ancestry, keyed and keyless (keyless: as the view's net changes)."""
    ident = f"{catalog_settings.name}.db.t"
    create(spark, ident, 1, partitioned=False)
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a'), (2, 'x')")
    for value in ("b", "c", "d"):
        spark.sql(f"UPDATE {ident} SET data = '{value}' WHERE id = 1")
    table = catalog.load_table("db.t")
    ids = snapshot_ids(catalog)
    assert {table.metadata.snapshot_by_id(s).sequence_number for s in ids} == {0}  # v1: no sequence numbers
    for depth, sid in enumerate(ids, start=1):
        rows = changelog.changes(spark, catalog_settings.name, table, sid, ["id"]).rows.collect()
        assert {r["_commit_sequence_number"] for r in rows} == {depth}
    export = changelog.export(spark, catalog_settings.name, table, ids[-1], ["id"]).rows.collect()
    assert {r["_commit_sequence_number"] for r in export} == {len(ids)}
    net = changelog.changes(spark, catalog_settings.name, table, (ids[0], ids[-1]), ["id"], net=True).rows.collect()
    assert sorted((r["id"], r["data"], r["_change_type"], r["_commit_snapshot_id"], r["_commit_sequence_number"])
                  for r in net) == [(1, "a", UPDATE_BEFORE, ids[1], 2), (1, "d", UPDATE_AFTER, ids[-1], 4)]
    keyless = changelog.changes(spark, catalog_settings.name, table, (ids[0], ids[-1]), (), net=True).rows.collect()
    spark.sql(f"CALL {catalog_settings.name}.system.create_changelog_view(table => 'db.t', changelog_view => 'n', "
              f"options => map('start-snapshot-id', '{ids[0]}'), net_changes => true)")
    view_rows = spark.sql("SELECT id, data, _change_type, _commit_snapshot_id FROM n").collect()
    expected = Counter(tuple(r) for r in view_rows)
    assert Counter((r["id"], r["data"], r["_change_type"], r["_commit_snapshot_id"]) for r in keyless) == expected
    assert expected == Counter({(1, "a", DELETE, ids[1]): 1, (1, "d", INSERT, ids[-1]): 1})


def test_v1_ordinals_count_from_the_anchor_and_survive_expiry(spark, catalog, catalog_settings):
    """Counted from the line's anchor (its last stored batch), a snapshot's number is the same before and
    after older snapshots are expired, even once the anchor itself is expired (its child names it);
    only a snapshot no longer linked to the anchor cannot be numbered (rolled back)."""
    ident = f"{catalog_settings.name}.db.t"
    create(spark, ident, 1, partitioned=False)
    for i in range(5):
        spark.sql(f"INSERT INTO {ident} VALUES ({i}, 'v{i}')")
    table = catalog.load_table("db.t")
    ids = snapshot_ids(catalog)
    anchor = OrdinalAnchor(ids[2], 3)  # the line's first batch was at ids[2]: depth 3
    numbers = [sequence_number(table, s, anchor) for s in ids]
    assert numbers == [1, 2, 3, 4, 5] == [ancestry_depth(table, s) for s in ids]

    spark.sql(f"CALL {catalog_settings.name}.system.expire_snapshots(table => 'db.t', "
              f"older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 2)")
    spark.sql(f"INSERT INTO {ident} VALUES (9, 'v9')")
    table = catalog.load_table("db.t")
    survivors = snapshot_ids(catalog)
    assert survivors == [ids[3], ids[4], survivors[-1]] and ids[2] not in survivors
    assert ancestry_depth(table, ids[4]) == 2  # the depth shrank with the expiry...
    assert [sequence_number(table, s, anchor) for s in survivors] == [4, 5, 6]  # ...the line's numbers did not
    rows = changelog.changes(spark, catalog_settings.name, table, (ids[4], survivors[-1]), ["id"], net=True,
                             anchor=anchor).rows.collect()
    assert [(r["id"], r["_change_type"], r["_commit_sequence_number"]) for r in rows] == [(9, INSERT, 6)]
    request = BatchRequest("db.t", (survivors[-1],), ids[0], identifier_columns=("id",), anchor=anchor)
    assert batch_info(table, request).sequence_number == 6

    spark.sql(f"CALL {catalog_settings.name}.system.rollback_to_snapshot('db.t', {ids[3]})")
    spark.sql(f"INSERT INTO {ident} VALUES (10, 'v10')")
    table = catalog.load_table("db.t")
    with pytest.raises(SnapshotOrderLostError, match=rf"snapshot {survivors[-1]} is no longer linked to it"):
        sequence_number(table, survivors[-1], OrdinalAnchor(snapshot_ids(catalog)[-1], 5))


def test_upgraded_table_keeps_counting_while_its_line_is_anchored(spark, catalog, catalog_settings):
    """Upgraded to v2 under a running line, the table numbers its new snapshots from 1, below what the sinks
    hold: the anchored line goes on counting ordinals; a new line (no anchor) takes the sequence numbers."""
    ident = f"{catalog_settings.name}.db.t"
    create(spark, ident, 1, partitioned=False)
    for i in range(3):
        spark.sql(f"INSERT INTO {ident} VALUES ({i}, 'v{i}')")
    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {ident} VALUES (7, 'v7')")
    table = catalog.load_table("db.t")
    ids = snapshot_ids(catalog)
    assert table.metadata.snapshot_by_id(ids[-1]).sequence_number == 1
    assert sequence_number(table, ids[-1], OrdinalAnchor(ids[2], 3)) == 4
    assert sequence_number(table, ids[-1]) == 1


def test_v1_table_set_to_merge_on_read_is_refused(spark, catalog, catalog_settings):
    ident = f"{catalog_settings.name}.db.t"
    create(spark, ident, 1, extra=", 'write.delete.mode'='merge-on-read'")
    spark.sql(f"INSERT INTO {ident} VALUES (1, 'a')")
    table = catalog.load_table("db.t")
    message = (r"table db\.t is Iceberg format v1 with write\.delete\.mode=merge-on-read: a v1 table cannot hold "
               r"delete files.*ALTER TABLE db\.t SET TBLPROPERTIES \('write\.delete\.mode'='copy-on-write'\)")
    with pytest.raises(UnsupportedFormatVersionError, match=message):
        changelog.check_supported(table)
    with pytest.raises(UnsupportedFormatVersionError, match=message):
        changelog.export(spark, catalog_settings.name, table, snapshot_ids(catalog)[-1])
    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ('write.delete.mode'='copy-on-write')")
    changelog.check_supported(catalog.load_table("db.t"))
