"""The equality_deletes write mode: data files + equality deletes in one row delta, no read of the target
(issue 30 #2). Equal to a MERGE target on the same batches; Spark and pyiceberg agree once compacted."""

import pytest

from icecdc_dagster.errors import EqualityDeleteTargetError
from icecdc_dagster.writer.equality_deletes import write_equality_delta
from icecdc_dagster.writer.exactly_once import BATCH_ID_PROPERTY, java_table
from icecdc_dagster.writer.merge import OP_COLUMN, OP_DELETE, OP_INSERT, OP_UPSERT, ORDER_COLUMN, write_batch

SCHEMA = f"id bigint, v string, {OP_COLUMN} string, {ORDER_COLUMN} bigint"


def _batch(spark, rows, schema=SCHEMA):
    return spark.createDataFrame(rows, schema)


def _create(spark, name, extra="", columns="id bigint NOT NULL, v string"):
    spark.sql(f"CREATE TABLE {name} ({columns}) USING iceberg {extra} TBLPROPERTIES ('format-version'='2')")


def _rows(spark, name):
    return {r.id: r.v for r in spark.table(name).collect()}


def test_one_row_delta_whose_new_rows_survive_its_own_deletes(spark, catalog, catalog_settings):
    t = f"{catalog_settings.name}.db.t"
    _create(spark, t)
    first = write_equality_delta(spark, t, _batch(spark, [(1, "a", OP_INSERT, 1), (2, "b", OP_INSERT, 2)]),
                                 ("id",), "b1", ledger=True)
    assert first.counts == {"upserted": 2, "delete_keys": 0}
    batch = [(1, "a2", OP_UPSERT, 1), (2, None, OP_DELETE, 2), (3, "c", OP_INSERT, 3), (3, "c2", OP_UPSERT, 4),
             (4, "d", OP_INSERT, 5), (4, None, OP_DELETE, 6)]
    second = write_equality_delta(spark, t, _batch(spark, batch), ("id",), "b2", ledger=True)
    assert _rows(spark, t) == {1: "a2", 3: "c2"}
    assert second.counts == {"upserted": 2, "delete_keys": 2}
    jtable = java_table(spark, t)
    snap = jtable.currentSnapshot()
    summary = dict(snap.summary())
    # one commit: the batch's data files and equality deletes share its sequence number
    assert snap.operation() == "overwrite" and summary[BATCH_ID_PROPERTY] == "b2"
    assert summary["added-equality-delete-files"] != "0" and summary["added-data-files"] != "0"
    files = spark.sql(f"SELECT content, count(*) AS n FROM {t}.all_files GROUP BY content").collect()
    assert {r.content: r.n for r in files}[2] >= 1  # equality deletes (content 2) are live
    again = write_equality_delta(spark, t, _batch(spark, [(9, "x", OP_INSERT, 1)]), ("id",), "b2", ledger=True)
    assert again.skipped and _rows(spark, t) == {1: "a2", 3: "c2"}
