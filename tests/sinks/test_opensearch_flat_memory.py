"""What the driver receives from the OpenSearch sink's writes does not grow with the documents.

The executors write; the driver gets ONE summary row per Spark partition, whose list of failure
reasons is capped, however many documents the batch holds or how many of them fail
(bench/opensearch_sink.py measures the driver's peak RSS at 100k and 1M documents).
"""

import json

from opensearchpy import OpenSearch

from icecdc_dagster import batch as b
from icecdc_dagster.sinks.opensearch import OpenSearchSinkSettings, write_events
from icecdc_dagster.sinks.opensearch.actions import FAILED, INDEXED, VERSION_CONFLICT
from icecdc_dagster.sinks.opensearch.bulk import SUMMARY, partition_summaries
from icecdc_dagster.sinks.opensearch.documents import bulk_rows
from tests.sinks.test_opensearch_support import all_documents, events_frame

DOCS, PARTITIONS, REASONS = 600, 3, 4


def test_driver_gets_one_bounded_summary_per_partition_whatever_the_document_count(spark, opensearch_url):
    # `name` is a long in this index: every odd document (non-numeric name) is rejected.
    OpenSearch(hosts=[opensearch_url]).indices.create(index="items", body={"mappings": {"properties": {
        "id": {"type": "long"}, "name": {"type": "long"}, "qty": {"type": "long"}}}})
    rows = [(b.INSERT, i, str(i) if i % 2 == 0 else f"bad-{i}", i) for i in range(DOCS)]
    events = events_frame(spark, "id long, name string, qty int", rows, 10, 1).repartition(PARTITIONS)
    settings = OpenSearchSinkSettings(hosts=(opensearch_url,), index="items", chunk_size=50,
                                      max_reported_failures=REASONS, max_retries=0)

    collected = partition_summaries(settings, bulk_rows(events)).collect()
    assert len(collected) == PARTITIONS  # one row per partition, not per document
    summaries = [json.loads(row[SUMMARY]) for row in collected]
    assert sum(s["actions"] for s in summaries) == DOCS
    assert sum(s["counts"][INDEXED] for s in summaries) == DOCS // 2
    assert sum(s["counts"][FAILED] for s in summaries) == DOCS // 2
    assert all(len(s["reasons"]) <= REASONS and s["partitions"] == 1 for s in summaries)
    assert len(all_documents(opensearch_url, "items")) == DOCS // 2

    again = write_events(settings, events)  # the same batch again: what the sink sums up
    assert again.partitions == PARTITIONS and again.actions == DOCS
    assert again.counts[VERSION_CONFLICT] == DOCS // 2 and again.counts[FAILED] == DOCS // 2
    assert len(again.reasons) == REASONS and all("mapper_parsing_exception" in r for r in again.reasons)
    assert not again.fatal
