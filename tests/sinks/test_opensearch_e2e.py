"""End to end: a real Iceberg table (CoW and MoR), the real changelog engine, the sink, over HTTP.

Export + 10 mixed CDC batches must leave the index equal to the table at its
last snapshot; reruns and stale replays change nothing; a server dying
mid-batch and a document rejected by the mapping fail their batch, keep the
checkpoint, and converge on rerun.
"""

import base64
import datetime as dt
from decimal import Decimal

import pytest
from opensearchpy import OpenSearch

from icecdc_dagster import changelog
from icecdc_dagster.batch import BatchInfo, Checkpoint
from icecdc_dagster.errors import SinkWriteError
from icecdc_dagster.sinks.opensearch import OpenSearchSink, OpenSearchSinkSettings, write_events
from tests.sinks.test_opensearch_support import CuttableProxy, all_documents, live_mappings

UTC = dt.UTC
TABLE = "db.products"
KEY = ("id",)


def _rows(ids: str, version: int) -> str:
    return (f"SELECT id, concat('p', id, '-v{version}') AS name, CAST(id * 1.25 + {version} AS decimal(10,2)) "
            f"AS price, CAST(id * {version} AS int) AS qty, array(concat('t', id), 'v{version}') AS tags, "
            f"named_struct('color', concat('c', id % 3), 'size', CAST(id % 5 AS int)) AS attrs, "
            f"timestamp_micros(1700000000000000 + id * 1000001 + {version}) AS updated_at, "
            f"date_add(DATE'2020-01-01', CAST(id AS int)) AS born, "
            f"unhex(lpad(hex(id * 7 + {version}), 6, '0')) AS payload FROM {ids}")


def _mode(spark, fq: str, mode: str) -> None:
    spark.sql(f"ALTER TABLE {fq} SET TBLPROPERTIES ('write.delete.mode'='{mode}', "
              f"'write.update.mode'='{mode}', 'write.merge.mode'='{mode}')")


def _changes(spark, fq: str) -> list:
    """The 10 CDC commits (after the export's snapshot), in order, as SQL statement lists."""
    return [
        [_insert(fq, "range(21, 26)", 1)],
        [f"UPDATE {fq} SET price = price + 100, updated_at = updated_at + INTERVAL 1 HOUR WHERE id % 4 = 0"],
        [f"DELETE FROM {fq} WHERE id % 7 = 0"],
        [f"MERGE INTO {fq} t USING ({_rows('range(18, 30)', 4)}) AS s ON t.id = s.id "
         f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"],
        ["MOR", f"UPDATE {fq} SET qty = -qty, tags = array('updated') WHERE id % 3 = 0"],
        [f"DELETE FROM {fq} WHERE id IN (1, 2, 25)"],
        [_insert(fq, "range(40, 46)", 7)],
        [f"MERGE INTO {fq} t USING ({_rows('range(38, 44)', 8)}) AS s ON t.id = s.id "
         f"WHEN MATCHED AND s.id % 2 = 0 THEN DELETE WHEN MATCHED THEN UPDATE SET * "
         f"WHEN NOT MATCHED THEN INSERT *"],
        ["ADD_NOTE", f"UPDATE {fq} SET note = concat('note ', id) WHERE id % 2 = 1"],
        ["COW", f"UPDATE {fq} SET attrs = named_struct('color', 'gold', 'size', 99), payload = NULL "
                f"WHERE id BETWEEN 10 AND 16"],
    ]


def _insert(fq: str, ids: str, version: int) -> str:
    return f"INSERT INTO {fq} {_rows(ids, version)}"


def expected_value(value):
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dt.datetime):
        return value.astimezone(UTC) if value.tzinfo is None else value
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: expected_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expected_value(v) for v in value]
    return value


def source_documents(spark, fq: str, snapshot_id: int) -> dict:
    rows = spark.sql(f"SELECT * FROM {fq} VERSION AS OF {snapshot_id}").collect()
    return {str(r["id"]): expected_value(r.asDict(recursive=True)) for r in rows}


def index_documents(url: str, index: str) -> dict:
    docs = all_documents(url, index)
    for doc in docs.values():
        doc["updated_at"] = dt.datetime.fromisoformat(doc["updated_at"].replace("Z", "+00:00"))
        # Documents last written before `note` was added do not carry it; the table reads it as null.
        doc.setdefault("note", None)
    return docs


def batch_of(spark, catalog_name: str, table, snapshot_id: int, export: bool, name: str = TABLE,
             key: tuple[str, ...] = KEY):
    plan = changelog.plan_snapshot(table, snapshot_id)
    if export:
        rows = changelog.export(spark, catalog_name, table, snapshot_id).rows
        operation, predecessors = "append", ()
    else:
        rows = changelog.changes(spark, catalog_name, table, snapshot_id, key).rows
        operation, predecessors = plan.operation, tuple(changelog.accepted_predecessors(table, snapshot_id))
    events = changelog.to_events(rows, name, key, operation, snapshot_id, use_row_id=not key).cache()
    info = BatchInfo(table_name=name, snapshot_id=snapshot_id, sequence_number=plan.sequence_number,
                     first_snapshot_id=snapshot_id, accepted_predecessors=predecessors, operation=plan.operation,
                     committed_at_ms=plan.committed_at_ms, is_export=export, identifier_columns=key,
                     snapshot_ids=(snapshot_id,))
    return info, events, plan


def test_export_and_ten_cdc_batches_converge_with_failures_reruns_and_replays(spark, catalog, catalog_settings,
                                                                               opensearch_url):
    cat = catalog_settings.name
    fq = f"{cat}.{TABLE}"
    spark.sql(f"CREATE TABLE {fq} (id bigint NOT NULL, name string, price decimal(10,2), qty int, "
              f"tags array<string>, attrs struct<color:string,size:int>, updated_at timestamp, born date, "
              f"payload binary) USING iceberg TBLPROPERTIES ('format-version'='2')")
    _mode(spark, fq, "copy-on-write")
    spark.sql(_insert(fq, "range(1, 21)", 0))
    proxy = CuttableProxy(opensearch_url)
    direct = OpenSearch(hosts=[opensearch_url])
    # Delete tombstones must outlive the test for the stale replays below to be refused by them
    # (index.gc_deletes is 60 s by default; a loaded machine takes longer than that).
    settings = OpenSearchSinkSettings(hosts=(proxy.url,), index="products", chunk_size=4, parallelism=1,
                                      max_retries=1, initial_backoff_s=0.05,
                                      index_settings={"index": {"gc_deletes": "1h"}})
    applied: list[tuple[BatchInfo, object]] = []
    with_delete_files: list[int] = []

    def apply_next(export: bool = False):
        table = catalog.load_table(TABLE)
        info, events, plan = batch_of(spark, cat, table, table.current_snapshot().snapshot_id, export)
        if plan.added_delete_files:
            with_delete_files.append(len(applied))
        sink = OpenSearchSink(settings, table.schema())  # as each run does: current schema
        return sink, info, events

    try:
        sink, info, events = apply_next(export=True)
        assert sink.apply(info, events).counts["indexed"] == 20
        applied.append((info, events))
        for number, statements in enumerate(_changes(spark, fq), start=1):
            for statement in statements:
                if statement == "MOR":
                    _mode(spark, fq, "merge-on-read")
                elif statement == "COW":
                    _mode(spark, fq, "copy-on-write")
                elif statement == "ADD_NOTE":
                    spark.sql(f"ALTER TABLE {fq} ADD COLUMN note string")
                    # Someone mapped `note` as a number before us: non-numeric notes get rejected.
                    direct.indices.put_mapping(index="products", body={"properties": {"note": {"type": "long"}}})
                else:
                    spark.sql(statement)
            sink, info, events = apply_next()
            before = sink.read_checkpoint()
            if number == 5:  # the server dies after the first bulk request of this batch
                proxy.cut_at_bulk = proxy.bulk_requests + 2
                with pytest.raises(SinkWriteError, match="stopped"):
                    sink.apply(info, events)
                proxy.restart()
                assert sink.read_checkpoint() == before
            if number == 9:
                with pytest.raises(SinkWriteError, match="mapper_parsing_exception.*note"):
                    sink.apply(info, events)
                assert sink.read_checkpoint() == before
                direct.indices.put_mapping(index="products", body={
                    "properties": {"note": {"type": "long", "ignore_malformed": True}}})
            result = sink.apply(info, events)
            assert not result.skipped and result.counts["failed"] == 0
            assert result.checkpoint == Checkpoint(info.snapshot_id, info.sequence_number)
            applied.append((info, events))

        assert with_delete_files == [5, 6, 8, 9]  # the merge-on-read batches really wrote delete files
        last = applied[-1][0]
        expected = source_documents(spark, fq, last.snapshot_id)
        docs = index_documents(opensearch_url, "products")
        assert len(expected) > 20 and docs == expected
        assert any(d.get("note") for d in docs.values()) and any(d["qty"] < 0 for d in docs.values())
        props = live_mappings(opensearch_url, "products")["properties"]
        assert {k: props[k].get("type") for k in ("price", "qty", "updated_at", "born", "payload", "name")} == {
            "price": "keyword", "qty": "long", "updated_at": "date", "born": "date", "payload": "binary",
            "name": "text"}
        assert props["attrs"]["properties"]["size"]["type"] == "long"

        # Rerun of every batch: skipped by the checkpoint; written straight to the index (stale replay,
        # no guard): every action is refused by its external version. Nothing changes.
        sink = OpenSearchSink(settings, catalog.load_table(TABLE).schema())
        for info, events in applied:
            assert sink.apply(info, events).skipped
            replay = write_events(settings, events)
            assert replay.ok and replay.counts["indexed"] == 0 and replay.counts["deleted"] == 0
        assert index_documents(opensearch_url, "products") == expected
        assert sink.read_checkpoint() == Checkpoint(last.snapshot_id, last.sequence_number)
    finally:
        proxy.stop()
        for _, events in applied:
            events.unpersist()


def test_v3_table_without_key_uses_row_ids(spark, catalog, catalog_settings, opensearch_url):
    name = "db.events_v3"
    fq = f"{catalog_settings.name}.{name}"
    spark.sql(f"CREATE TABLE {fq} (kind string, amount decimal(8,3), at timestamp) USING iceberg "
              f"TBLPROPERTIES ('format-version'='3', 'write.delete.mode'='merge-on-read', "
              f"'write.update.mode'='merge-on-read')")
    spark.sql(f"INSERT INTO {fq} SELECT concat('k', id), CAST(id / 8 AS decimal(8,3)), "
              f"timestamp_seconds(1700000000 + id) FROM range(0, 8)")
    settings = OpenSearchSinkSettings(hosts=(opensearch_url,), index="events")
    statements = [None, f"UPDATE {fq} SET amount = amount * 10 WHERE kind IN ('k1', 'k2')",
                  f"DELETE FROM {fq} WHERE kind = 'k3'", f"INSERT INTO {fq} VALUES ('k9', 1.5, TIMESTAMP'2024-01-01')"]
    for number, statement in enumerate(statements):
        if statement:
            spark.sql(statement)
        table = catalog.load_table(name)
        info, events, _ = batch_of(spark, catalog_settings.name, table, table.current_snapshot().snapshot_id,
                                   export=number == 0, name=name, key=())
        OpenSearchSink(settings, table.schema()).apply(info, events)
        events.unpersist()
    rows = spark.sql(f"SELECT _row_id, kind, amount, at FROM {fq}").collect()
    expected = {str(r["_row_id"]): {"kind": r["kind"], "amount": str(r["amount"]),
                                    "at": expected_value(r["at"])} for r in rows}
    docs = all_documents(opensearch_url, "events")
    for doc in docs.values():
        doc["at"] = dt.datetime.fromisoformat(doc["at"].replace("Z", "+00:00"))
    assert len(expected) == 8 and docs == expected  # ids are the row ids; no lineage columns in documents
