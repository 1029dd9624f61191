"""Seeded random workloads on real Iceberg tables, and the oracles the changelog must satisfy."""

import random
from collections import Counter

from icecdc_dagster import changelog
from icecdc_dagster.batch import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from icecdc_dagster.column_names import quote


def mode_properties(version: int, mode: str) -> str:
    return (f"TBLPROPERTIES ('format-version'='{version}', 'write.delete.mode'='{mode}', "
            f"'write.update.mode'='{mode}', 'write.merge.mode'='{mode}')")


def create_table(spark, ident: str, version: int, mode: str, partitioned: bool) -> None:
    partition = "PARTITIONED BY (p)" if partitioned else ""
    spark.sql(f"CREATE TABLE {ident} (id bigint NOT NULL, p int, v string, n double) USING iceberg "
              f"{partition} {mode_properties(version, mode)}")


def run_workload(spark, ident: str, seed: int, steps: int = 5) -> None:
    """Random inserts, updates (value and partition moves), deletes and MERGEs, one snapshot each."""
    rng = random.Random(seed)
    next_id = 0

    def insert(count: int) -> None:
        nonlocal next_id
        values = ", ".join(f"({i}, {rng.randrange(4)}, 'v{rng.randrange(5)}', "
                           f"{'NULL' if rng.random() < 0.2 else rng.randrange(100) / 4})"
                           for i in range(next_id, next_id + count))
        next_id += count
        spark.sql(f"INSERT INTO {ident} VALUES {values}")

    insert(rng.randrange(15, 30))
    for _ in range(steps):
        op = rng.choice(["insert", "update", "update", "move", "delete", "merge", "noop_update"])
        ids = ", ".join(str(i) for i in sorted({rng.randrange(next_id) for _ in range(rng.randrange(1, 6))}))
        if op == "insert":
            insert(rng.randrange(1, 6))
        elif op == "update":
            spark.sql(f"UPDATE {ident} SET v = concat(v, '{rng.randrange(9)}'), n = NULL WHERE id IN ({ids})")
        elif op == "move":
            spark.sql(f"UPDATE {ident} SET p = (p + 1) % 4 WHERE id IN ({ids})")
        elif op == "noop_update":
            spark.sql(f"UPDATE {ident} SET v = v WHERE id IN ({ids})")
        elif op == "delete":
            spark.sql(f"DELETE FROM {ident} WHERE id IN ({ids})")
        else:
            new = next_id
            next_id += 2
            spark.sql(f"MERGE INTO {ident} t USING (SELECT id, 'm' AS v FROM VALUES ({new}), ({new + 1}), "
                      f"{', '.join(f'({i})' for i in ids.split(', '))} AS s(id)) s ON t.id = s.id "
                      f"WHEN MATCHED AND t.id % 2 = 0 THEN DELETE "
                      f"WHEN MATCHED THEN UPDATE SET v = s.v "
                      f"WHEN NOT MATCHED THEN INSERT (id, p, v, n) VALUES (s.id, 1, s.v, 1.5)")


def rows_at(spark, ident: str, snapshot_id: int | None, columns: list[str]) -> Counter:
    if snapshot_id is None:
        return Counter()
    return Counter(freeze(tuple(r)) for r in spark.sql(
        f"SELECT {', '.join(quote(c) for c in columns)} FROM {ident} VERSION AS OF {snapshot_id}").collect())


def freeze(value):  # noqa: ANN001, ANN201
    """A hashable, comparable-by-value form of a collected value (structs, lists, maps, binary)."""
    if isinstance(value, tuple):  # Row is a tuple
        return tuple(freeze(v) for v in value)
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return ("map", tuple(sorted(((freeze(k), freeze(v)) for k, v in value.items()), key=repr)))
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def apply_changes(before: Counter, change_rows: list, columns: list[str]) -> Counter:
    """Apply change rows to a multiset of rows; a before image must exist to be removed."""
    after = Counter(before)
    for row in change_rows:
        values = freeze(tuple(row[c] for c in columns))
        if row["_change_type"] in (DELETE, UPDATE_BEFORE):
            assert after[values] > 0, f"change removes a row that is not there: {row}"
            after[values] -= 1
        else:
            assert row["_change_type"] in (INSERT, UPDATE_AFTER)
            after[values] += 1
    return +after


def snapshot_ids(catalog, name: str) -> list[int]:
    table = catalog.load_table(name)
    return [p.snapshot_id for p in changelog.snapshots_after(table, None)]
