"""200k changed rows through OpenSearchSink vs raw opensearch-py helpers.bulk of the same documents.

Same osmem server, same run, one clone per side. Ours includes everything a
batch costs: checkpoint read, index creation/mapping check, Spark JSON
rendering, executor-side bulk writes with external versions, refresh and
checkpoint write. Raw gets the documents already in driver memory (collected
before the clock starts) and bulk-indexes them from one process with default
chunking.

The server is the bottleneck (~1,700-2,300 docs/s) and its speed drifts
during a run (warm-up, growing memory), so: an untimed warm-up first, then
the rows in two halves in ABBA order (ours, raw, raw, ours), each side timed
over both halves. Compare the ratio, not the absolute rates.

Run: .venv/bin/python bench/opensearch_sink.py [rows]
"""

import json
import os
import sys
import time

from opensearchpy import OpenSearch, helpers
from osmem_server import OsmemServer
from pyiceberg import types as it
from pyiceberg.schema import Schema
from pyspark.sql import functions as F

from icecdc_dagster import batch as b
from icecdc_dagster.batch import BatchInfo
from icecdc_dagster.runtime.spark import SparkSettings, build_spark_session
from icecdc_dagster.sinks.opensearch import OpenSearchSink, OpenSearchSinkSettings, iceberg_schema_to_mapping
from icecdc_dagster.sinks.opensearch.documents import ID, SOURCE, bulk_rows

ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
TABLE = "db.products"
SCHEMA = Schema(
    it.NestedField(1, "id", it.LongType(), required=True),
    it.NestedField(2, "name", it.StringType(), required=False),
    it.NestedField(3, "category", it.StringType(), required=False),
    it.NestedField(4, "price", it.DecimalType(10, 2), required=False),
    it.NestedField(5, "qty", it.IntegerType(), required=False),
    it.NestedField(6, "updated_at", it.TimestamptzType(), required=False),
    identifier_field_ids=[1])


def events(spark, start: int, end: int, snapshot_id: int, sequence_number: int):
    """CDC events of one snapshot: INSERTs and UPDATE_AFTERs (all INDEX actions), one per key."""
    return (spark.range(start, end, numPartitions=2)
            .select(F.col("id"),
                    F.concat(F.lit("product "), F.col("id").cast("string")).alias("name"),
                    F.concat(F.lit("cat-"), (F.col("id") % 37).cast("string")).alias("category"),
                    (F.col("id") % 10_000 / 100).cast("decimal(10,2)").alias("price"),
                    (F.col("id") % 500).cast("int").alias("qty"),
                    F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id")).alias("updated_at"),
                    F.when(F.col("id") % 3 == 0, F.lit(b.UPDATE_AFTER)).otherwise(F.lit(b.INSERT)).alias(b.CHANGE_TYPE),
                    F.lit(snapshot_id).cast("long").alias(b.COMMIT_SNAPSHOT_ID),
                    F.lit(sequence_number).cast("long").alias(b.COMMIT_SEQUENCE_NUMBER),
                    F.lit(0).alias(b.CHANGE_ORDINAL),
                    F.lit("overwrite").alias(b.ICEBERG_OPERATION),
                    F.lit(TABLE).alias(b.ICEBERG_TABLE_NAME),
                    F.lit(snapshot_id).cast("long").alias(b.ICEBERG_SNAPSHOT_ID),
                    F.col("id").cast("string").alias(b.DOCUMENT_ID),
                    F.lit(b.INDEX_ACTION).alias(b.BULK_ACTION)))


def batch(snapshot_id: int, sequence_number: int, parent: int | None) -> BatchInfo:
    return BatchInfo(TABLE, snapshot_id, sequence_number, snapshot_id, () if parent is None else (parent,),
                     "overwrite", 0, is_export=parent is None, identifier_columns=("id",),
                     snapshot_ids=(snapshot_id,))


def warm_up(server, documents) -> None:
    """Untimed: the server's first bulk requests are slower, which would favour whoever runs second."""
    with server.clone() as clone:
        client = OpenSearch(hosts=[clone.url], timeout=120)
        helpers.bulk(client, ({"_index": "warm-up", "_id": i, "_source": s} for i, s in documents), chunk_size=500)
        client.close()


def run_ours(sink: OpenSearchSink, info: BatchInfo, changed) -> float:
    started = time.perf_counter()
    result = sink.apply(info, changed)
    elapsed = time.perf_counter() - started
    assert result.counts["failed"] == 0 and result.counts["indexed"] == result.counts["actions"], result.counts
    return elapsed


def run_raw(client, documents) -> float:
    actions = ({"_index": "bench-raw", "_id": doc_id, "_source": json.loads(source)} for doc_id, source in documents)
    started = time.perf_counter()
    ok, errors = helpers.bulk(client, actions, chunk_size=500, stats_only=True)
    client.indices.refresh(index="bench-raw")
    elapsed = time.perf_counter() - started
    assert ok == len(documents) and not errors, (ok, errors)
    return elapsed


def main() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = build_spark_session(SparkSettings(master="local[2]", app_name="bench-opensearch-sink",
                                              conf={"spark.ui.enabled": "false"}))
    server = OsmemServer.start()
    half = ROWS // 2
    try:
        first = events(spark, 0, half, 7, 3).cache()
        second = events(spark, half, ROWS, 8, 4).cache()
        print(f"events: {first.count() + second.count()} changed rows in two batches (cached before timing)")
        docs_first = [(r[ID], r[SOURCE]) for r in bulk_rows(first).select(ID, SOURCE).collect()]
        docs_second = [(r[ID], r[SOURCE]) for r in bulk_rows(second).select(ID, SOURCE).collect()]
        warm_up(server, docs_first[:10_000])

        with server.clone() as ours_clone, server.clone() as raw_clone:
            settings = OpenSearchSinkSettings(hosts=(ours_clone.url,), index="bench-ours")
            sink = OpenSearchSink(settings, SCHEMA)
            raw = OpenSearch(hosts=[raw_clone.url], timeout=120)
            raw.indices.create(index="bench-raw", body={"mappings": iceberg_schema_to_mapping(SCHEMA)})
            ours_a = run_ours(sink, batch(7, 3, None), first)
            raw_a = run_raw(raw, docs_first)
            raw_b = run_raw(raw, docs_second)
            ours_b = run_ours(sink, batch(8, 4, 7), second)
            ours_count = OpenSearch(hosts=[ours_clone.url]).count(index="bench-ours")["count"]
            raw_count = raw.count(index="bench-raw")["count"]
            raw.close()
            sink.close()
        assert ours_count == ROWS and raw_count == ROWS, (ours_count, raw_count)
        ours_s, raw_s = ours_a + ours_b, raw_a + raw_b
        ours_dps, raw_dps = ROWS / ours_s, ROWS / raw_s
        print(f"ours: {ROWS} docs in {ours_s:.1f} s ({ours_a:.1f} + {ours_b:.1f}) = {ours_dps:.0f} docs/s "
              f"(parallelism={settings.parallelism}, chunk_size={settings.chunk_size}, 2 Spark partitions)")
        print(f"raw helpers.bulk: {ROWS} docs in {raw_s:.1f} s ({raw_a:.1f} + {raw_b:.1f}) = {raw_dps:.0f} docs/s")
    finally:
        server.close()
        spark.stop()
    print(f"RESULT ours_dps={ours_dps:.0f} raw_dps={raw_dps:.0f} ratio={ours_dps / raw_dps:.2f}")


if __name__ == "__main__":
    main()
