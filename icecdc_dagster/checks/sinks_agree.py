"""Each sink agrees with its source at the sink's own checkpoint: same row count, and a sample of
source rows found in the sink exactly as the pipeline would write them (a time-travel read of the
source at the checkpoint snapshot). How a sample is looked up is the sink kind's own
(:meth:`~icecdc_dagster.sinks.kind.SinkConfig.compare`)."""

from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetChecksDefinition, AssetCheckSeverity, asset_check

from icecdc_dagster.assets import naming
from icecdc_dagster.changelog import row_count
from icecdc_dagster.config import SinkConfig, TableConfig
from icecdc_dagster.lines.batch_metadata import BatchMetadata
from icecdc_dagster.resources import catalog_resource_keys, run_catalog
from icecdc_dagster.resources.keys import SPARK_KEY
from icecdc_dagster.steps.open_sink import sink_context

SAMPLE_SIZE = 20


def build_consistency_checks(table: TableConfig) -> list[AssetChecksDefinition]:
    return [_build_check(table, sink) for sink in table.sinks]


def _build_check(table: TableConfig, sink: SinkConfig) -> AssetChecksDefinition:
    resource_key = sink.resource_key()

    @asset_check(
        asset=naming.sink_key(sink),
        name=naming.CONSISTENCY_CHECK,
        description=(f"Row count and a sample of {SAMPLE_SIZE} rows of {table.table_name} at the sink's "
                     f"checkpoint snapshot agree with {sink.asset_name}."),
        required_resource_keys={SPARK_KEY, *catalog_resource_keys(sink.target_catalog),
                                *([resource_key] if resource_key else [])},
        blocking=False,
    )
    def _check(context: AssetCheckExecutionContext) -> AssetCheckResult:
        catalog = run_catalog(context.resources, None)
        target_catalog = run_catalog(context.resources, sink.target_catalog)
        spark = getattr(context.resources, SPARK_KEY).session(catalog, *([target_catalog] if sink.target_catalog
                                                                          else []))
        source = catalog.load_table(table.table_name)
        opened = sink_context(table, spark=spark, catalog=catalog, source_table=source,
                              connection=getattr(context.resources, resource_key) if resource_key else None,
                              target_catalog=target_catalog)
        target = sink.open(opened)
        checkpoint = target.read_checkpoint()
        if checkpoint is None:
            return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN,
                                    metadata={"reason": "the sink has no checkpoint yet"})
        source_rows = (spark.read.option("snapshot-id", checkpoint.snapshot_id)
                       .table(f"{catalog.name}.{table.table_name}"))
        source_count = row_count(source, source_rows, checkpoint.snapshot_id)
        found = sink.compare(opened, target, checkpoint, source_rows, source_count, SAMPLE_SIZE)
        passed = found.sink_rows == source_count and not found.mismatches
        return AssetCheckResult(
            passed=passed, severity=AssetCheckSeverity.ERROR,
            metadata={**BatchMetadata(checkpoint_snapshot_id=str(checkpoint.snapshot_id)), "source_rows": source_count,
                      "sink_rows": found.sink_rows, "sampled_rows": found.sampled_rows,
                      "sample_mismatches": len(found.mismatches),
                      "first_mismatch": found.mismatches[0] if found.mismatches else "none"})

    return _check

