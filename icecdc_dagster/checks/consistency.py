"""Each sink agrees with its source at the sink's own checkpoint: same row count,
and a random sample of source rows found in the sink exactly as the pipeline
would write them (time travel read of the source at the checkpoint snapshot).

Documents written with ``include_iceberg_metadata`` are compared on the row's
columns; their ``iceberg_operation`` must name a live row (INSERT or
UPDATE_AFTER) and their ``iceberg_table_name`` the source table."""

import json

from dagster import AssetCheckResult, AssetCheckSeverity, asset_check

from icecdc_dagster import changelog
from icecdc_dagster.assets import naming
from icecdc_dagster.batch import ICEBERG_OPERATION, ICEBERG_TABLE_NAME, INSERT, UPDATE_AFTER
from icecdc_dagster.column_names import column
from icecdc_dagster.config import IcebergSinkConfig, OpenSearchSinkConfig, SinkConfig, TableConfig
from icecdc_dagster.pipeline.batches import identifier_columns_of, uses_row_lineage
from icecdc_dagster.pipeline.sinks import open_configured_sink

SAMPLE_SIZE = 20


def build_consistency_checks(table: TableConfig) -> list:
    return [_build_check(table, sink) for sink in table.sinks]


def _build_check(table: TableConfig, sink: SinkConfig):  # noqa: ANN202
    is_opensearch = isinstance(sink, OpenSearchSinkConfig)
    resource_key = naming.opensearch_resource_key(sink) if is_opensearch else None

    @asset_check(
        asset=naming.sink_key(sink),
        name="matches_source_at_checkpoint",
        description=(f"Row count and a sample of {SAMPLE_SIZE} rows of {table.table_name} at the sink's "
                     f"checkpoint snapshot agree with {sink.asset_name}."),
        required_resource_keys={"spark", "catalog", *([resource_key] if resource_key else [])},
        blocking=False,
    )
    def _check(context) -> AssetCheckResult:  # noqa: ANN001
        catalog = context.resources.catalog
        spark = context.resources.spark.session(catalog)
        source = catalog.load_table(table.table_name)
        cluster = getattr(context.resources, resource_key) if is_opensearch else None
        target = open_configured_sink(sink, table, spark=spark, catalog=catalog, source_table=source,
                                      cluster=cluster)
        settings = getattr(target, "settings", None)
        checkpoint = target.read_checkpoint()
        if checkpoint is None:
            return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN,
                                    metadata={"reason": "the sink has no checkpoint yet"})
        source_rows = (spark.read.option("snapshot-id", checkpoint.snapshot_id)
                       .table(f"{catalog.name}.{table.table_name}"))
        source_count = source_rows.count()
        if isinstance(sink, OpenSearchSinkConfig):
            sink_count, mismatches, sampled = _opensearch_compare(spark, catalog.name, source, table, settings,
                                                                   checkpoint.snapshot_id)
        else:
            sink_count, mismatches, sampled = _replica_compare(spark, catalog.name, sink, source_rows, source_count)
        passed = sink_count == source_count and not mismatches
        return AssetCheckResult(
            passed=passed, severity=AssetCheckSeverity.ERROR,
            metadata={"checkpoint_snapshot_id": str(checkpoint.snapshot_id), "source_rows": source_count,
                      "sink_rows": sink_count, "sampled_rows": sampled, "sample_mismatches": len(mismatches),
                      "first_mismatch": mismatches[0] if mismatches else "none"})

    return _check


def _replica_compare(spark, catalog_name: str, sink: IcebergSinkConfig, source_rows, source_count: int):  # noqa: ANN001, ANN202
    target = spark.table(f"{catalog_name}.{sink.table_name}")
    # A Bernoulli sample (no sort of the table), capped at SAMPLE_SIZE rows.
    fraction = min(1.0, 5.0 * SAMPLE_SIZE / max(source_count, 1))
    sample = source_rows.sample(fraction=fraction, seed=7).limit(SAMPLE_SIZE).cache()
    missing = sample.exceptAll(target.select(*[column(c) for c in source_rows.columns])).limit(5).collect()
    sampled = sample.count()
    sample.unpersist()
    return target.count(), [str(row.asDict()) for row in missing], sampled


def _opensearch_compare(spark, catalog_name: str, source, table: TableConfig, settings, snapshot_id: int):  # noqa: ANN001, ANN202
    from icecdc_dagster.sinks.opensearch.documents import ICEBERG_METADATA_COLUMNS, ID, SOURCE, bulk_rows

    client = settings.client()
    client.indices.refresh(index=settings.index)
    sink_count = int(client.count(index=settings.index)["count"])
    key = identifier_columns_of(table.identifier_columns, source)
    if not key and not uses_row_lineage(source):
        return sink_count, [], 0  # generated document ids: only the count can be compared
    rows = changelog.export(spark, catalog_name, source, snapshot_id).rows
    events = changelog.to_events(rows, table.table_name, key, "append", snapshot_id,
                                 use_row_id=uses_row_lineage(source) and not key)
    expected = {r[ID]: json.loads(r[SOURCE]) for r in bulk_rows(events).limit(SAMPLE_SIZE).collect()}
    if not expected:
        return sink_count, [], 0
    found = client.mget(index=settings.index, body={"ids": list(expected)})["docs"]
    mismatches = []
    for doc in found:
        if not doc.get("found"):
            mismatches.append(f"document {doc['_id']} is missing")
            continue
        row = {k: v for k, v in doc["_source"].items() if k not in ICEBERG_METADATA_COLUMNS}
        if row != expected[doc["_id"]]:
            mismatches.append(f"document {doc['_id']} differs: {row} != {expected[doc['_id']]}")
        elif settings.include_iceberg_metadata and (
                doc["_source"].get(ICEBERG_OPERATION) not in (INSERT, UPDATE_AFTER)
                or doc["_source"].get(ICEBERG_TABLE_NAME) != table.table_name):
            mismatches.append(f"document {doc['_id']} has {ICEBERG_OPERATION}={doc['_source'].get(ICEBERG_OPERATION)!r}"
                              f", {ICEBERG_TABLE_NAME}={doc['_source'].get(ICEBERG_TABLE_NAME)!r}; a live row of "
                              f"{table.table_name} was last written by an {INSERT} or {UPDATE_AFTER}")
    return sink_count, mismatches, len(expected)
