"""One OpenLineage run per batch step, when lineage is configured (see :mod:`icecdc_dagster.lineage`)."""

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from dagster import AssetExecutionContext, AssetKey

from icecdc_dagster.lineage import BatchFacet, LineageDataset, LineageEmitter
from icecdc_dagster.lineage.openlineage import RunOutcome
from icecdc_dagster.steps import lifecycle


@contextmanager
def lineage_run(lineage: LineageEmitter | None, context: AssetExecutionContext, asset_key: AssetKey,
                table_name: str, inputs: Callable[[], Sequence[LineageDataset]],
                outputs: Callable[[], Sequence[LineageDataset]]) -> Iterator[RunOutcome]:
    """START before the block, COMPLETE/FAIL after it; the block fills in the returned outcome.
    Without lineage configured nothing is built or sent."""
    if lineage is None:
        yield RunOutcome()
        return
    keys = context.partition_key_range if context.has_partition_key_range else None
    first = keys.start if keys else context.partition_key
    last = keys.end if keys else context.partition_key
    facet = BatchFacet(sourceTable=table_name, snapshotId=str(lifecycle.snapshot_id_of(last)),
                       firstSnapshotId=str(lifecycle.snapshot_id_of(first)),
                       partitionKey=first if first == last else f"{first}...{last}", dagsterRunId=context.run_id)
    with lineage.batch_run(asset_key.to_user_string(), inputs(), outputs(), facet) as outcome:
        yield outcome


@contextmanager
def ingest_lineage_run(lineage: LineageEmitter | None, context: AssetExecutionContext, asset_key: AssetKey,
                       landing: str, inputs: Callable[[], Sequence[LineageDataset]],
                       outputs: Callable[[], Sequence[LineageDataset]]) -> Iterator[tuple[RunOutcome, BatchFacet]]:
    """An ingest run's OpenLineage events (landing location -> targets and dead letters). Its batch
    facet names the landing location as the source; the block fills in the snapshot ids it committed
    (known only after the commit), which COMPLETE carries."""
    facet = BatchFacet(sourceTable=landing, snapshotId="", firstSnapshotId="", partitionKey="",
                       dagsterRunId=context.run_id)
    if lineage is None:
        yield RunOutcome(), facet
        return
    keys = list(context.partition_keys)
    facet.partitionKey = keys[0] if len(keys) == 1 else f"{keys[0]}...{keys[-1]}"
    with lineage.batch_run(asset_key.to_user_string(), inputs(), outputs(), facet) as outcome:
        yield outcome, facet
