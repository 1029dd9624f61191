"""Oracle tests on seeded random workloads: CoW against Iceberg's changelog view, merge-on-read
(v2 position deletes, v3 deletion vectors) by replaying our changes onto the parent, net changes
against the diff of the range ends."""

from collections import Counter

import pytest

from icecdc_dagster import changelog
from icecdc_dagster.batch import UPDATE_AFTER, UPDATE_BEFORE
from tests.changelog.workload import apply_changes, create_table, mode_properties, rows_at, run_workload

COLUMNS = ["id", "p", "v", "n"]


def ours(spark, catalog_settings, table, snapshot, net=False, keys=("id",)) -> list:
    return changelog.changes(spark, catalog_settings.name, table, snapshot, keys, net=net).rows.collect()


def icv(spark, cat: str, name: str, parent: int | None, snapshot: int) -> Counter:
    start = f"'start-snapshot-id', '{parent}', " if parent is not None else ""
    view = f"icv_{snapshot}".replace("-", "m")
    spark.sql(f"CALL {cat}.system.create_changelog_view(table => '{name}', changelog_view => '{view}', "
              f"options => map({start}'end-snapshot-id', '{snapshot}'), compute_updates => true, "
              f"identifier_columns => array('id'))")
    return Counter(tuple(r) for r in spark.sql(f"SELECT {', '.join(COLUMNS)}, _change_type FROM {view}").collect())


def check_cow_against_view(spark, catalog, catalog_settings, seed: int, partitioned: bool, version: int = 2) -> None:
    ident = f"{catalog_settings.name}.db.t"
    create_table(spark, ident, version, "copy-on-write", partitioned)
    run_workload(spark, ident, seed)
    table = catalog.load_table("db.t")
    for plan in changelog.snapshots_after(table, None):
        got = Counter(tuple(r[c] for c in [*COLUMNS, "_change_type"])
                      for r in ours(spark, catalog_settings, table, plan.snapshot_id))
        expected = icv(spark, catalog_settings.name, "db.t", plan.parent_id, plan.snapshot_id)
        assert got == expected, f"seed {seed}, snapshot {plan.snapshot_id} ({plan.operation})"


def check_replay(spark, catalog, catalog_settings, seed: int, version: int, partitioned: bool) -> None:
    ident = f"{catalog_settings.name}.db.t"
    create_table(spark, ident, version, "merge-on-read", partitioned)
    run_workload(spark, ident, seed)
    table = catalog.load_table("db.t")
    plans = changelog.snapshots_after(table, None)
    assert any(p.added_delete_files for p in plans), "workload must produce delete files"
    for plan in plans:
        change_rows = ours(spark, catalog_settings, table, plan.snapshot_id)
        replayed = apply_changes(rows_at(spark, ident, plan.parent_id, COLUMNS), change_rows, COLUMNS)
        assert replayed == rows_at(spark, ident, plan.snapshot_id, COLUMNS), f"seed {seed}, {plan}"
        # update detection: a key has at most one before and one after image per snapshot
        keys = Counter((r["id"], r["_change_type"]) for r in change_rows)
        assert max(keys.values(), default=1) == 1
        types = {r["id"]: set() for r in change_rows}
        for r in change_rows:
            types[r["id"]].add(r["_change_type"])
        assert all(t in ({"INSERT"}, {"DELETE"}, {UPDATE_BEFORE, UPDATE_AFTER}) for t in types.values())
    ids = [p.snapshot_id for p in plans]
    for start in sorted({0, len(ids) // 2}):
        end = len(ids) - 1
        net_rows = ours(spark, catalog_settings, table, (ids[start], ids[end]), net=True)
        replayed = apply_changes(rows_at(spark, ident, ids[start], COLUMNS), net_rows, COLUMNS)
        assert replayed == rows_at(spark, ident, ids[end], COLUMNS), f"seed {seed}, net {start}..{end}"
        assert len({(r["id"], r["_change_type"]) for r in net_rows}) == len(net_rows)


def icv_net(spark, cat: str, name: str, start: int | None, end: int) -> Counter:
    """Iceberg's keyless net changes: create_changelog_view(net_changes => true)."""
    start_option = f"'start-snapshot-id', '{start}', " if start is not None else ""
    view = f"icv_net_{end}".replace("-", "m")
    spark.sql(f"CALL {cat}.system.create_changelog_view(table => '{name}', changelog_view => '{view}', "
              f"options => map({start_option}'end-snapshot-id', '{end}'), net_changes => true)")
    return Counter(tuple(r) for r in spark.sql(
        f"SELECT {', '.join(COLUMNS)}, _change_type, _commit_snapshot_id FROM {view}").collect())


def ours_net_keyless(spark, catalog_settings, table, start: int | None, end: int) -> Counter:
    rows = changelog.changes(spark, catalog_settings.name, table, (start, end), (), net=True).rows.collect()
    return Counter(tuple(r[c] for c in [*COLUMNS, "_change_type", "_commit_snapshot_id"]) for r in rows)


def check_keyless_net_against_view(spark, catalog, catalog_settings, seed: int, partitioned: bool,
                                   version: int = 2) -> None:
    ident = f"{catalog_settings.name}.db.t"
    create_table(spark, ident, version, "copy-on-write", partitioned)
    run_workload(spark, ident, seed, steps=6)
    table = catalog.load_table("db.t")
    ids = [p.snapshot_id for p in changelog.snapshots_after(table, None)]
    for start in (None, ids[1], ids[len(ids) // 2]):
        got = ours_net_keyless(spark, catalog_settings, table, start, ids[-1])
        assert got == icv_net(spark, catalog_settings.name, "db.t", start, ids[-1]), f"seed {seed}, from {start}"


def test_keyless_net_changes_credit_the_last_rewrite_like_iceberg(spark, catalog, catalog_settings):
    """Issue 10 #9: a row inserted at s1 and rewritten unchanged at s2 and s3 is credited to s3."""
    ident = f"{catalog_settings.name}.db.t"
    create_table(spark, ident, 2, "copy-on-write", False)
    spark.sql(f"INSERT INTO {ident} VALUES (0, 0, 'old', 0.5)")
    spark.sql(f"INSERT INTO {ident} SELECT /*+ COALESCE(1) */ * FROM VALUES (1, 0, 'r', 1.0), (2, 0, 'x', NULL) "
              f"AS s(id, p, v, n)")
    spark.sql(f"UPDATE {ident} SET v = 'y' WHERE id = 2")   # rewrites row 1 unchanged
    spark.sql(f"UPDATE {ident} SET v = 'z' WHERE id = 2")   # and again
    table = catalog.load_table("db.t")
    ids = [p.snapshot_id for p in changelog.snapshots_after(table, None)]
    got = ours_net_keyless(spark, catalog_settings, table, ids[0], ids[-1])
    assert got == Counter({(1, 0, "r", 1.0, "INSERT", ids[3]): 1, (2, 0, "z", None, "INSERT", ids[3]): 1})
    assert got == icv_net(spark, catalog_settings.name, "db.t", ids[0], ids[-1])


ICEBERG_NET_COLUMNS = ["id", "data", "age", "_change_type", "_change_ordinal", "_commit_snapshot_id"]


def _net_rows(rows) -> list[tuple]:
    return sorted(tuple(r[c] for c in ICEBERG_NET_COLUMNS) for r in rows)


def _iceberg_net(spark, cat: str, start: int | None) -> list[tuple]:
    start_option = f"options => map('start-snapshot-id', '{start}'), " if start is not None else ""
    spark.sql(f"CALL {cat}.system.create_changelog_view(table => 'db.t', changelog_view => 'icv_port', "
              f"{start_option}net_changes => true)")
    return _net_rows(spark.sql("SELECT * FROM icv_port").collect())


def test_iceberg_net_changes_with_remove_carry_overs_ported(spark, catalog, catalog_settings):
    """Iceberg's TestCreateChangelogViewProcedure.testNetChangesWithRemoveCarryOvers, ported: its own writes
    (dynamic partition overwrites of a table partitioned by id), then the same changes as copy-on-write
    row-level MERGEs that also rewrite (1, 'a', 12) unchanged. Both carry-over settings, against the view.

    A row that a later snapshot carries over unchanged is credited to the last snapshot that rewrote it, by
    Iceberg as by us: (2, 'e', 12) in Iceberg's own expected rows, and (1, 'a', 12) once MERGE rewrites its
    file (Iceberg 1.10.2's view gives ordinal 2 for it too); (1, 'a', 12) keeps ordinal 0 only where no later
    snapshot touches its file."""
    ident = f"{catalog_settings.name}.db.t"
    later = [[(3, "c", 13), (2, "d", 11), (2, "e", 12)], [(3, "c", 15), (2, "e", 12)]]
    for writes in ("partition_overwrite", "row_level_merge"):
        partition = "PARTITIONED BY (id)" if writes == "partition_overwrite" else ""
        spark.sql(f"CREATE TABLE {ident} (id int, data string, age int) USING iceberg {partition} "
                  f"{mode_properties(2, 'copy-on-write')}")
        spark.sql(f"INSERT INTO {ident} SELECT /*+ COALESCE(1) */ * FROM VALUES (1, 'a', 12), (2, 'b', 11), "
                  f"(2, 'e', 12) AS s(id, data, age)")
        for rows in later:
            values = ", ".join(f"({i}, '{d}', {a})" for i, d, a in rows)
            if writes == "partition_overwrite":   # as Iceberg's test: only the partitions written are replaced
                spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
                try:
                    spark.sql(f"INSERT OVERWRITE {ident} SELECT * FROM VALUES {values} AS s(id, data, age)")
                finally:
                    spark.conf.unset("spark.sql.sources.partitionOverwriteMode")
            else:
                spark.sql(f"MERGE INTO {ident} t USING (SELECT * FROM VALUES {values} AS s(id, data, age)) s "
                          f"ON t.id = s.id AND t.data = s.data AND t.age = s.age WHEN NOT MATCHED THEN INSERT * "
                          f"WHEN NOT MATCHED BY SOURCE AND t.id IN (2, 3) THEN DELETE")
        table = catalog.load_table("db.t")
        s1, s2, s3 = (p.snapshot_id for p in changelog.snapshots_after(table, None))
        a_ordinal, a_snapshot = (0, s1) if writes == "partition_overwrite" else (2, s3)
        expected_all = sorted([(1, "a", 12, "INSERT", a_ordinal, a_snapshot), (3, "c", 15, "INSERT", 2, s3),
                               (2, "e", 12, "INSERT", 2, s3)])
        expected_from_s1 = sorted([(2, "b", 11, "DELETE", 0, s2), (3, "c", 15, "INSERT", 1, s3)])
        assert _iceberg_net(spark, catalog_settings.name, None) == expected_all, writes
        assert _iceberg_net(spark, catalog_settings.name, s1) == expected_from_s1, writes
        for carry_over in ("arrow", "spark"):
            for start, expected in ((None, expected_all), (s1, expected_from_s1)):
                got = changelog.changes(spark, catalog_settings.name, table, (start, s3), (), net=True,
                                        carry_over=carry_over).rows.collect()
                assert _net_rows(got) == expected, (writes, carry_over, start)
        # Per snapshot (no net), where the Arrow path does remove the carry-over: the same rows as the view.
        for parent, snapshot in ((s2, s3),):
            spark.sql(f"CALL {catalog_settings.name}.system.create_changelog_view(table => 'db.t', "
                      f"changelog_view => 'icv_port', options => map('start-snapshot-id', '{parent}', "
                      f"'end-snapshot-id', '{snapshot}'))")
            expected = _net_rows(spark.sql("SELECT * FROM icv_port").collect())
            for carry_over in ("arrow", "spark"):
                change_set = changelog.changes(spark, catalog_settings.name, table, snapshot, (),
                                               carry_over=carry_over)
                assert _net_rows(change_set.rows.collect()) == expected, (writes, carry_over, snapshot)
                assert (change_set.stats["carry_over_groups_in_arrow"] > 0) == (carry_over == "arrow")
        spark.sql(f"DROP TABLE {ident}")


@pytest.mark.parametrize("seed,partitioned", [(7, True), (8, False)])
def test_keyless_net_changes_equal_iceberg_net_changes_view(spark, catalog, catalog_settings, seed, partitioned):
    check_keyless_net_against_view(spark, catalog, catalog_settings, seed, partitioned)


@pytest.mark.parametrize("seed,partitioned", [(1, True), (2, False)])
def test_copy_on_write_equals_iceberg_changelog_view(spark, catalog, catalog_settings, seed, partitioned):
    check_cow_against_view(spark, catalog, catalog_settings, seed, partitioned)


def test_format_v1_copy_on_write_and_keyless_net_changes_equal_iceberg_views(spark, catalog, catalog_settings):
    """A v1 table (no sequence numbers: its line orders snapshots by ancestry) on a seeded workload."""
    check_cow_against_view(spark, catalog, catalog_settings, 40, True, version=1)
    spark.sql(f"DROP TABLE {catalog_settings.name}.db.t")
    check_keyless_net_against_view(spark, catalog, catalog_settings, 41, False, version=1)


@pytest.mark.parametrize("seed,version,partitioned", [(3, 2, True), (4, 3, True), (5, 2, False), (6, 3, False)])
def test_merge_on_read_replays_to_snapshot(spark, catalog, catalog_settings, seed, version, partitioned):
    check_replay(spark, catalog, catalog_settings, seed, version, partitioned)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10, 16))
def test_copy_on_write_many_seeds(spark, catalog, catalog_settings, seed):
    check_cow_against_view(spark, catalog, catalog_settings, seed, seed % 2 == 0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(30, 36))
def test_keyless_net_changes_many_seeds(spark, catalog, catalog_settings, seed):
    check_keyless_net_against_view(spark, catalog, catalog_settings, seed, seed % 2 == 0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20, 28))
def test_merge_on_read_many_seeds(spark, catalog, catalog_settings, seed):
    check_replay(spark, catalog, catalog_settings, seed, 2 + seed % 2, seed % 3 != 0)
