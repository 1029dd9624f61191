"""Oracle tests on seeded random workloads: CoW against Iceberg's changelog view, merge-on-read
(v2 position deletes, v3 deletion vectors) by replaying our changes onto the parent, net changes
against the diff of the range ends."""

from collections import Counter

import pytest

from icecdc_dagster import changelog
from icecdc_dagster.batch import UPDATE_AFTER, UPDATE_BEFORE
from tests.changelog.workload import apply_changes, create_table, rows_at, run_workload

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
