"""``ingest/<name>``: Debezium landing files written into Iceberg, one partition per landing file.

A run covers consecutive files (at most ``files_per_batch``) as one batch; the engine records the
batch id in the targets' snapshot summaries and skips a batch already committed, so retries and
re-executions never write twice.
"""

import time

from dagster import AssetExecutionContext, BackfillPolicy, MaterializeResult, MetadataValue, asset

from icecdc_dagster.assets import naming
from icecdc_dagster.config import IngestConfig
from icecdc_dagster.ingest.pipeline import ingest_files
from icecdc_dagster.pipeline.ingest import files_of, fixed_target, ingest_settings
from icecdc_dagster.resources import IcebergCatalogResource, SparkResource


def build_ingest_asset(entry: IngestConfig):  # noqa: ANN201 - AssetsDefinition
    target = fixed_target(entry)

    @asset(
        key=naming.ingest_key(entry),
        partitions_def=naming.ingest_partitions_def(entry),
        backfill_policy=BackfillPolicy.single_run(),
        group_name=naming.ingest_group_name(entry),
        kinds={"iceberg", "spark"},
        description=(f"Debezium events from {entry.landing} upserted into "
                     f"{target or 'the tables named by ' + entry.target}; bad events go to dead-letter tables."),
        metadata={"landing": entry.landing, "target": entry.target,
                  "identifier_columns": ", ".join(entry.identifier_columns) or "(table's own or none)"},
    )
    def _ingest(context: AssetExecutionContext, spark: SparkResource,
                catalog: IcebergCatalogResource) -> MaterializeResult:
        started = time.monotonic()
        session = spark.session(catalog)
        files = files_of(entry, context.partition_keys)
        result = ingest_files(session, catalog.name, catalog.load(), ingest_settings(entry), files)
        totals = result.totals()
        context.log.info(f"ingest {entry.name}: {'skipped (already committed)' if result.skipped else 'committed'} "
                         f"{len(files)} file(s): {totals}")
        return MaterializeResult(metadata={
            "files": MetadataValue.json([f.rsplit("/", 1)[-1] for f in files]),
            "batch_id": result.batch_id,
            "skipped_already_committed": result.skipped,
            **{key: int(value) for key, value in sorted(totals.items())},
            "targets": MetadataValue.json({
                name: {"snapshot_id": str(t.snapshot_id) if t.snapshot_id is not None else None,
                       "skipped": t.skipped, "added_columns": list(t.added_columns), **t.counts}
                for name, t in sorted(result.targets.items())}),
            "duration_s": MetadataValue.float(round(time.monotonic() - started, 3)),
        })

    return _ingest
