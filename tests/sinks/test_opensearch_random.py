"""The index equals the source at every applied snapshot: random workloads, random catch-up ranges, replays.

Hypothesis draws the table kind (CoW/MoR, v2/v3), the statements, where a run catches up a range of
snapshots with net changes, and which earlier batch is replayed. Oracle: Iceberg time travel at the
snapshot the sink's checkpoint names; a replayed batch must change nothing.
"""

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icecdc_dagster import changelog
from icecdc_dagster.batch import BatchInfo
from icecdc_dagster.sinks.opensearch import OpenSearchSink, OpenSearchSinkSettings
from tests.changelog.workload import create_table
from tests.sinks.test_opensearch_support import all_documents

KEY = ("id",)

STATEMENTS = st.sampled_from(["insert", "update", "move", "delete", "merge", "noop_update", "compact"])


def _statement(kind: str, fq: str, name: str, next_id: int, ids: list[int]) -> tuple[str, int]:
    id_list = ", ".join(str(i) for i in ids)
    if kind == "insert":
        values = ", ".join(f"({i}, {i % 4}, 'v{i}', {i / 4})" for i in range(next_id, next_id + 3))
        return f"INSERT INTO {fq} VALUES {values}", next_id + 3
    if kind == "update":
        return f"UPDATE {fq} SET v = concat(v, 'u'), n = NULL WHERE id IN ({id_list})", next_id
    if kind == "move":
        return f"UPDATE {fq} SET p = (p + 1) % 4 WHERE id IN ({id_list})", next_id
    if kind == "noop_update":
        return f"UPDATE {fq} SET v = v WHERE id IN ({id_list})", next_id
    if kind == "delete":
        return f"DELETE FROM {fq} WHERE id IN ({id_list})", next_id
    if kind == "compact":
        return f"CALL {fq.split('.')[0]}.system.rewrite_data_files(table => '{name}', " \
               "options => map('rewrite-all', 'true'))", next_id
    return (f"MERGE INTO {fq} t USING (SELECT id, 'm' AS v FROM VALUES ({next_id}), {', '.join(f'({i})' for i in ids)}"
            f" AS s(id)) s ON t.id = s.id WHEN MATCHED AND t.id % 2 = 0 THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT (id, p, v, n) "
            f"VALUES (s.id, 1, s.v, 1.5)"), next_id + 1


def _batch(spark, cat: str, name: str, table, first: int, last: int, export: bool):
    """Events and position of one run: the export, one snapshot, or the net changes of first..last."""
    plan = changelog.plan_snapshot(table, last)
    if export:
        rows, preds = changelog.export(spark, cat, table, last, KEY).rows, ()
    elif first == last:
        rows, preds = changelog.changes(spark, cat, table, last, KEY).rows, changelog.accepted_predecessors(table, last)
    else:
        parent = changelog.plan_snapshot(table, first).parent_id
        rows = changelog.changes(spark, cat, table, (parent, last), KEY, net=True).rows
        preds = changelog.accepted_predecessors(table, first)
    events = changelog.to_events(rows, name, KEY, plan.operation, last, use_row_id=False).cache()
    info = BatchInfo(name, last, plan.sequence_number, first, tuple(preds), plan.operation, plan.committed_at_ms,
                     is_export=export, identifier_columns=KEY, snapshot_ids=(first, last))
    return info, events


def _source(spark, fq: str, snapshot_id: int) -> dict:
    return {str(r["id"]): r.asDict() for r in spark.sql(f"SELECT * FROM {fq} VERSION AS OF {snapshot_id}").collect()}


def _index(url: str, index: str) -> dict:
    return {k: {**{"n": None}, **v} for k, v in all_documents(url, index).items()}


def _run(spark, catalog, catalog_settings, url, data, version: int, mode: str, steps: int) -> None:
    cat = catalog_settings.name
    name = f"db.rand_{uuid.uuid4().hex[:8]}"
    fq = f"{cat}.{name}"
    index = "rand"
    create_table(spark, fq, version, mode, partitioned=data.draw(st.booleans(), label="partitioned"))
    spark.sql(f"INSERT INTO {fq} VALUES " + ", ".join(f"({i}, {i % 4}, 'v{i}', {i / 2})" for i in range(12)))
    settings_ = OpenSearchSinkSettings(hosts=(url,), index=index, chunk_size=7, parallelism=1)
    table = catalog.load_table(name)
    pending: list[int] = []
    applied = []
    info, events = _batch(spark, cat, name, table, table.current_snapshot().snapshot_id,
                          table.current_snapshot().snapshot_id, export=True)
    OpenSearchSink(settings_, table.schema()).apply(info, events)
    applied.append((info, events))
    next_id = 12
    for step in range(steps):
        ids = data.draw(st.lists(st.integers(0, next_id - 1), min_size=1, max_size=4, unique=True), label="ids")
        statement, next_id = _statement(data.draw(STATEMENTS, label="statement"), fq, name, next_id, ids)
        spark.sql(statement)
        table = catalog.load_table(name)
        pending.append(table.current_snapshot().snapshot_id)
        if step < steps - 1 and data.draw(st.booleans(), label="wait (catch up later as a range)"):
            continue
        info, events = _batch(spark, cat, name, table, pending[0], pending[-1], export=False)
        sink = OpenSearchSink(settings_, table.schema())
        result = sink.apply(info, events)
        assert not result.skipped and sink.read_checkpoint().snapshot_id == pending[-1]
        applied.append((info, events))
        pending = []
        assert _index(url, index) == _source(spark, fq, info.snapshot_id), f"{statement} (snapshot {info.snapshot_id})"
        # A replayed earlier batch (a duplicate or retried run) is a no-op.
        old_info, old_events = applied[data.draw(st.integers(0, len(applied) - 1), label="replayed batch")]
        assert OpenSearchSink(settings_, table.schema()).apply(old_info, old_events).skipped
        assert _index(url, index) == _source(spark, fq, info.snapshot_id)
    for _, events in applied:
        events.unpersist()


KINDS = [(2, "copy-on-write"), (2, "merge-on-read"), (3, "merge-on-read")]


@pytest.mark.parametrize("version,mode", [  # v2 copy-on-write: -m slow (the end-to-end tests sync it too)
    k if k != (2, "copy-on-write") else pytest.param(*k, marks=pytest.mark.slow) for k in KINDS])
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_index_equals_source_at_every_applied_snapshot(spark, catalog, catalog_settings, osmem_server, data,
                                                       version, mode):
    clone = osmem_server.clone()  # a fresh cluster and table per example
    try:
        _run(spark, catalog, catalog_settings, clone.url, data, version, mode, steps=5)
    finally:
        clone.close()
