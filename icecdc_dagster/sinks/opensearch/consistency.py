"""An index compared with its source at the index checkpoint: count, and a sample of documents
fetched by id and compared with the documents the pipeline would write for those rows.

Documents written with ``include_iceberg_metadata`` are compared on the row's columns; their
``iceberg_operation`` must name a live row (INSERT or UPDATE_AFTER) and their
``iceberg_table_name`` the source table. A table with generated document ids (append-only,
keyless) can only be compared by count."""

import json
from typing import Any

from icecdc_dagster import changelog
from icecdc_dagster.batch import ICEBERG_OPERATION, ICEBERG_TABLE_NAME, INSERT, UPDATE_AFTER
from icecdc_dagster.changelog import uses_row_lineage
from icecdc_dagster.sinks.kind import Comparison, SinkContext
from icecdc_dagster.sinks.opensearch.documents import ICEBERG_METADATA_COLUMNS, ID, SOURCE, bulk_rows
from icecdc_dagster.sinks.opensearch.settings import OpenSearchSinkSettings


def compare_index(context: SinkContext, settings: OpenSearchSinkSettings, snapshot_id: int,
                  sample_size: int) -> Comparison:
    client = settings.client()
    client.indices.refresh(index=settings.index)
    sink_count = int(client.count(index=settings.index)["count"])
    source, key = context.source_table, context.identifier_columns
    if not key and not uses_row_lineage(source):
        return Comparison(sink_count)
    assert context.spark is not None, "the index is compared with the source read by Spark"
    rows = changelog.export(context.spark, context.catalog_name, source, snapshot_id).rows
    # The source at a checkpoint holds each key once (the export and every batch up to it were held to
    # that rule, a v3 row id cannot repeat): no ranking, whose shuffle and sort of every row of the table
    # would be most of the check's cost, for 20 documents.
    events = changelog.to_events(rows, context.table_name, key, "append", snapshot_id,
                                 use_row_id=uses_row_lineage(source) and not key, unique_ids=True)
    expected = {r[ID]: json.loads(r[SOURCE]) for r in bulk_rows(events).limit(sample_size).collect()}
    if not expected:
        return Comparison(sink_count)
    found = client.mget(index=settings.index, body={"ids": list(expected)})["docs"]
    mismatches = [m for doc in found for m in _mismatch(doc, expected, settings, context.table_name)]
    return Comparison(sink_count, mismatches, len(expected))


def _mismatch(doc: dict[str, Any], expected: dict[str, Any], settings: OpenSearchSinkSettings,
              table_name: str) -> list[str]:
    if not doc.get("found"):
        return [f"document {doc['_id']} is missing"]
    source = doc["_source"]
    row = {k: v for k, v in source.items() if k not in ICEBERG_METADATA_COLUMNS}
    if row != expected[doc["_id"]]:
        return [f"document {doc['_id']} differs: {row} != {expected[doc['_id']]}"]
    if settings.include_iceberg_metadata and (source.get(ICEBERG_OPERATION) not in (INSERT, UPDATE_AFTER)
                                              or source.get(ICEBERG_TABLE_NAME) != table_name):
        return [f"document {doc['_id']} has {ICEBERG_OPERATION}={source.get(ICEBERG_OPERATION)!r}, "
                f"{ICEBERG_TABLE_NAME}={source.get(ICEBERG_TABLE_NAME)!r}; a live row of {table_name} was last "
                f"written by an {INSERT} or {UPDATE_AFTER}"]
    return []
