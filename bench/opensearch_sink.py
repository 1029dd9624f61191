"""200k changed rows through OpenSearchSink vs raw opensearch-py helpers.bulk of the same documents.

Same osmem server, same run, one clone each (so the two indexes do not share
memory limits). Ours includes everything a batch costs: checkpoint read,
index creation, Spark JSON rendering, executor-side bulk writes with external
versions, refresh and checkpoint write. Raw gets the documents already in
driver memory (collected before the clock starts) and bulk-indexes them from
one process with default chunking. The server is the bottleneck (~1,700
docs/s), so compare the ratio, not the absolute rates.

Both runs follow an untimed warm-up of the server (its first requests are slower).

Run: /work/venv/bin/python bench/opensearch_sink.py [rows]
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
SCHEMA = Schema(
    it.NestedField(1, "id", it.LongType(), required=True),
    it.NestedField(2, "name", it.StringType(), required=False),
    it.NestedField(3, "category", it.StringType(), required=False),
    it.NestedField(4, "price", it.DecimalType(10, 2), required=False),
    it.NestedField(5, "qty", it.IntegerType(), required=False),
    it.NestedField(6, "updated_at", it.TimestamptzType(), required=False),
    identifier_field_ids=[1])


def events(spark, rows: int):
    """CDC events of one snapshot: INSERTs and UPDATE_AFTERs (all INDEX actions), one per key."""
    return (spark.range(rows, numPartitions=2)
            .select(F.col("id"),
                    F.concat(F.lit("product "), F.col("id").cast("string")).alias("name"),
                    F.concat(F.lit("cat-"), (F.col("id") % 37).cast("string")).alias("category"),
                    (F.col("id") % 10_000 / 100).cast("decimal(10,2)").alias("price"),
                    (F.col("id") % 500).cast("int").alias("qty"),
                    F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id")).alias("updated_at"),
                    F.when(F.col("id") % 3 == 0, F.lit(b.UPDATE_AFTER)).otherwise(F.lit(b.INSERT)).alias(b.CHANGE_TYPE),
                    F.lit(7).cast("long").alias(b.COMMIT_SNAPSHOT_ID),
                    F.lit(3).cast("long").alias(b.COMMIT_SEQUENCE_NUMBER),
                    F.lit(0).alias(b.CHANGE_ORDINAL),
                    F.lit("overwrite").alias(b.ICEBERG_OPERATION),
                    F.lit("db.products").alias(b.ICEBERG_TABLE_NAME),
                    F.lit(7).cast("long").alias(b.ICEBERG_SNAPSHOT_ID),
                    F.col("id").cast("string").alias(b.DOCUMENT_ID),
                    F.lit(b.INDEX_ACTION).alias(b.BULK_ACTION)))


def warm_up(server, documents) -> None:
    """Untimed: the server's first bulk requests are slower (allocation), which would favour whoever runs second."""
    with server.clone() as clone:
        client = OpenSearch(hosts=[clone.url], timeout=120)
        helpers.bulk(client, ({"_index": "warm-up", "_id": i, "_source": s} for i, s in documents), chunk_size=500)
        client.close()


def main() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = build_spark_session(SparkSettings(master="local[2]", app_name="bench-opensearch-sink",
                                              conf={"spark.ui.enabled": "false"}))
    server = OsmemServer.start()
    try:
        changed = events(spark, ROWS).cache()
        print(f"events: {changed.count()} changed rows (cached before timing)")
        documents = [(r[ID], r[SOURCE]) for r in bulk_rows(changed).select(ID, SOURCE).collect()]
        warm_up(server, documents[:10_000])

        with server.clone() as ours_clone:
            settings = OpenSearchSinkSettings(hosts=(ours_clone.url,), index="bench-ours")
            sink = OpenSearchSink(settings, SCHEMA)
            info = BatchInfo("db.products", 7, 3, 7, (), "overwrite", 0, is_export=True,
                             identifier_columns=("id",), snapshot_ids=(7,))
            started = time.perf_counter()
            result = sink.apply(info, changed)
            ours_s = time.perf_counter() - started
            client = OpenSearch(hosts=[ours_clone.url], timeout=120)
            ours_count = client.count(index="bench-ours")["count"]
            client.close()
            sink.close()
        assert result.counts["indexed"] == ROWS and ours_count == ROWS, (result.counts, ours_count)
        ours_dps = ROWS / ours_s
        print(f"ours: {ROWS} docs in {ours_s:.1f} s = {ours_dps:.0f} docs/s "
              f"(partitions={result.details['partitions']}, parallelism={settings.parallelism}, "
              f"chunk_size={settings.chunk_size})")

        with server.clone() as raw_clone:
            client = OpenSearch(hosts=[raw_clone.url], timeout=120)
            client.indices.create(index="bench-raw", body={"mappings": iceberg_schema_to_mapping(SCHEMA)})
            actions = ({"_index": "bench-raw", "_id": doc_id, "_source": json.loads(source)}
                       for doc_id, source in documents)
            started = time.perf_counter()
            ok, errors = helpers.bulk(client, actions, chunk_size=500, stats_only=True)
            client.indices.refresh(index="bench-raw")
            raw_s = time.perf_counter() - started
            raw_count = client.count(index="bench-raw")["count"]
            client.close()
        assert ok == ROWS and not errors and raw_count == ROWS, (ok, errors, raw_count)
        raw_dps = ROWS / raw_s
        print(f"raw helpers.bulk: {ROWS} docs in {raw_s:.1f} s = {raw_dps:.0f} docs/s")
    finally:
        server.close()
        spark.stop()
    print(f"RESULT ours_dps={ours_dps:.0f} raw_dps={raw_dps:.0f} ratio={ours_dps / raw_dps:.2f}")


if __name__ == "__main__":
    main()
