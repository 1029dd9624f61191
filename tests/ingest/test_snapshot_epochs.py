"""Snapshot epochs through real Spark and Iceberg: a completed Debezium snapshot is the table's whole content.

A source row deleted between two snapshot attempts (its delete is never streamed) is gone once the second
snapshot's last record commits; a row the stream inserts while the snapshot runs survives; an unfinished
snapshot deletes nothing; a batch re-run after a failure between its commits gives the same table. Through
landing files and a real Redis stream.
"""

import json

import pytest

from icecdc_dagster.config import IngestConfig
from icecdc_dagster.ingest import IngestSettings, ingest_files, snapshot_epoch
from icecdc_dagster.ingest.snapshot_epoch import Epoch, plan
from icecdc_dagster.inputs.registry import open_input
from icecdc_dagster.steps.ingest_entry import ingest_stream_batch
from tests.ingest.brokers import REDIS_URL, publish_redis, redis_stream


def _event(op, row=None, before=None, snapshot=None, schema=False):
    """A Debezium event (MySQL connector shape); ``snapshot``: the source's marker (None: a stream event)."""
    source = {"version": "2.7.0.Final", "connector": "mysql", "name": "dbserver1", "db": "inventory",
              "table": "customers", **({"snapshot": snapshot} if snapshot else {"snapshot": "false"})}
    payload = {"op": op, "before": before, "after": row, "source": source, "ts_ms": 1}
    if not schema:
        return json.dumps({"payload": payload})
    image = {"type": "struct", "optional": True, "fields": [{"type": "int32", "optional": False, "field": "id"},
                                                            {"type": "string", "optional": True, "field": "v"}]}
    return json.dumps({"schema": {"type": "struct", "fields": [{**image, "field": "before"},
                                                               {**image, "field": "after"}]}, "payload": payload})


def r(i, v, mark="true"):
    return _event("r", {"id": i, "v": v}, snapshot=mark)


def c(i, v):
    return _event("c", {"id": i, "v": v})


def u(i, v):
    return _event("u", {"id": i, "v": v}, before={"id": i, "v": "?"})


def d(i):
    return _event("d", None, before={"id": i, "v": "?"})


def test_plan_walks_markers_from_the_open_epoch():
    assert not plan(None, [], "b").active
    assert plan(None, [(5, "last")], "b").closed == ()                      # no start seen: nothing ends
    one = plan(None, [(1, "first"), (9, "last_in_data_collection")], "b")
    assert one.closed == ((Epoch("b@1", 1), 9),) and one.open_after is None
    resent = plan("a@3", [(2, "first_in_data_collection"), (7, "last")], "b")  # the older attempt is dropped
    assert resent.closed == ((Epoch("b@2", 2), 7),) and resent.prior == "a@3"
    spanning = plan("a@3", [(4, "last"), (6, "first")], "b")
    assert spanning.closed == ((Epoch("a@3", None), 4),) and spanning.open_after == Epoch("b@6", 6)
    assert plan("a@3", [], "b").open_after == Epoch("a@3", None)


def _settings(landing, **extra):
    return IngestSettings(landing=str(landing), target="db.snap", identifier_columns=("id",), auto_create=True,
                          **extra)


def _land(landing, name, lines):
    path = landing / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _rows(spark, cat, table="db.snap"):
    return {row.id: row.v for row in spark.table(f"{cat}.{table}").collect()}


def test_landing_second_snapshot_deletes_rows_deleted_between_attempts(spark, catalog, catalog_settings, tmp_path):
    """Attempt 1 dies before its last record; rows 2 and 9 are deleted in the source meanwhile (never streamed);
    attempt 2 spans three files with a stream insert (5) and update while it runs; a stream event after its
    last record re-creates a row the sweep deletes."""
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    landing.mkdir()
    settings = _settings(landing)
    files = [
        [c(9, "streamed-before")],                                                      # the target before
        [r(1, "a", "first"), r(2, "b"), r(3, "c", "true")],                             # attempt 1: no last
        [r(1, "a", "first"), c(5, "e"), r(3, "c")],                                     # attempt 2 starts
        [u(5, "e2"), r(4, "d", "last"), u(1, "a2"), c(9, "back")],                      # ... and ends
    ]
    paths = [_land(landing, f"{i:03d}.json", lines) for i, lines in enumerate(files)]
    seen = []
    for path in paths:
        result = ingest_files(spark, cat, catalog, settings, [path])
        assert not result.skipped
        seen.append(_rows(spark, cat))
    assert seen[1] == {9: "streamed-before", 1: "a", 2: "b", 3: "c"}        # an unfinished snapshot deletes nothing
    assert seen[2] == {9: "streamed-before", 1: "a", 2: "b", 3: "c", 5: "e"}
    assert seen[3] == {1: "a2", 3: "c", 4: "d", 5: "e2", 9: "back"}        # 2 gone; 9 re-created after the last
    marks = f"{cat}.db.snap{snapshot_epoch.MARKS_SUFFIX}"
    assert spark.table(marks).count() == 0                                  # no epoch open: no marks kept
    # a fourth snapshot-free batch changes nothing about epochs
    ingest_files(spark, cat, catalog, settings, [_land(landing, "004.json", [d(3)])])
    assert _rows(spark, cat) == {1: "a2", 4: "d", 5: "e2", 9: "back"}


def test_snapshot_deletes_off_keeps_upsert_only(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    landing.mkdir()
    settings = _settings(landing, snapshot_deletes=False)
    for i, lines in enumerate([[c(9, "x")], [r(1, "a", "first"), r(2, "b", "last")]]):
        ingest_files(spark, cat, catalog, settings, [_land(landing, f"{i:03d}.json", lines)])
    assert _rows(spark, cat) == {9: "x", 1: "a", 2: "b"}


def test_a_batch_failing_between_marks_and_target_is_completed_to_the_same_table(spark, catalog, catalog_settings,
                                                                                 tmp_path, monkeypatch):
    """The hardest batch: it ends one epoch and starts the next (the marks table now holds the new epoch's
    marks), then fails before the target commits. Re-run, it skips the marks (their own ledger) and sweeps
    with the marks as they were before the batch: the same table as an attempt that never failed."""
    from icecdc_dagster.ingest import commit as pipeline

    cat = catalog_settings.name
    landing = tmp_path / "landing"
    landing.mkdir()
    settings = _settings(landing)
    ingest_files(spark, cat, catalog, settings, [_land(landing, "000.json", [c(7, "old"), c(8, "old")])])
    ingest_files(spark, cat, catalog, settings, [_land(landing, "001.json", [
        _event("r", {"id": 1, "v": "a"}, snapshot="first", schema=True),
        _event("r", {"id": 8, "v": "h"}, snapshot="true", schema=True)])])
    both = _land(landing, "002.json", [r(2, "b", "last"), r(1, "a", "first"), r(2, "b")])
    real = pipeline.write_batch

    def dies_at_the_target(spark_, table, *args, **kwargs):
        if table.endswith(".db.snap"):
            raise RuntimeError("died between the marks' commit and the target's")
        return real(spark_, table, *args, **kwargs)

    monkeypatch.setattr(pipeline, "write_batch", dies_at_the_target)
    with pytest.raises(RuntimeError, match="died between"):
        ingest_files(spark, cat, catalog, settings, [both])
    marks = f"{cat}.db.snap{snapshot_epoch.MARKS_SUFFIX}"
    assert sorted(row.id for row in spark.table(marks).collect()) == [1, 2]   # the new epoch's marks
    assert _rows(spark, cat) == {1: "a", 7: "old", 8: "h"}
    monkeypatch.setattr(pipeline, "write_batch", real)
    again = ingest_files(spark, cat, catalog, settings, [both])
    assert not again.targets["db.snap"].skipped and again.targets["db.snap"].counts.get("deleted") == 1
    assert _rows(spark, cat) == {1: "a", 2: "b", 8: "h"}                   # 7 was not in the first snapshot
    ingest_files(spark, cat, catalog, settings, [_land(landing, "003.json", [r(3, "c", "last")])])
    assert _rows(spark, cat) == {1: "a", 2: "b", 3: "c"}                   # 8 was not in the second one


def test_redis_stream_second_snapshot_deletes_rows_deleted_between_attempts(spark, catalog, catalog_settings):
    """The same hand-off through a real Redis stream, batches of 2 cutting across every boundary."""
    cat = catalog_settings.name
    entry = None
    with redis_stream() as key:
        entry = IngestConfig.model_validate({
            "name": "snap", "target": "db.snap_stream", "identifier_columns": ["id"], "auto_create": True,
            "input": {"redis_stream": {"url": REDIS_URL, "key": key, "block": "PT0.1S", "max_messages": 2}}})

        def drain():
            with open_input(entry.input) as reader:
                while ingest_stream_batch(spark, cat, entry, reader).result is not None:
                    pass

        publish_redis(key, [line.encode() for line in [c(9, "x"), r(1, "a", "first"), r(2, "b"), r(3, "c")]])
        drain()
        assert _rows(spark, cat, "db.snap_stream") == {9: "x", 1: "a", 2: "b", 3: "c"}
        publish_redis(key, [line.encode() for line in [
            r(1, "a", "first"), c(5, "e"), r(3, "c"), r(4, "d", "last"), u(1, "a2")]])
        drain()
        assert _rows(spark, cat, "db.snap_stream") == {1: "a2", 3: "c", 4: "d", 5: "e"}
