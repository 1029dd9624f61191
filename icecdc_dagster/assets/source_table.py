"""``iceberg/<ns>/<table>``: the source table as an observable asset, partitioned like its line.

Each partition (a snapshot the line applies) is observed once, when the line learns of it, with
that snapshot id as its data version; the changelog partition of the same key is computed from
it. So a changelog (and sink) partition is stale only if the snapshot it was computed from is
observed with another version, never because the table moved on: the newer snapshots are new
partitions, missing until applied, which is what ``icecdc status`` counts as pending.
"""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    AllPartitionMapping,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetSpec,
    DataVersion,
    DataVersionsByPartition,
    SourceAsset,
    observable_source_asset,
)
from dagster._core.definitions.data_version import DATA_VERSION_TAG

from icecdc_dagster.assets import naming
from icecdc_dagster.assets.table_metadata import source_fallback, table_metadata
from icecdc_dagster.config import TableConfig
from icecdc_dagster.lines.batch_metadata import SourceMetadata
from icecdc_dagster.lines.line import TAIL_PAGE
from icecdc_dagster.steps import lifecycle

if TYPE_CHECKING:
    from pyiceberg.table import Table


def build_source_asset(table: TableConfig, written_by: tuple[AssetKey, ...] = (),
                       described: Mapping[str, Any] | None = None) -> SourceAsset | AssetSpec:
    """``written_by``: keys of ingest assets that write this table. Then the table is an external
    asset downstream of them (one lineage graph: landing -> table -> changelog -> sinks); its
    observations still come from the sensor. ``described``: table metadata known at load (schema,
    location), shown on the asset page before any observation."""
    metadata = {"table_name": table.table_name, **(described or {})}
    if written_by:
        return AssetSpec(
            key=naming.source_key(table), group_name=naming.group_name(table),
            # Each snapshot may hold rows of any landing file written so far.
            deps=[AssetDep(key, partition_mapping=AllPartitionMapping()) for key in written_by],
            partitions_def=naming.partitions_def(table),
            description=f"Iceberg table {table.table_name}, written by ingestion; data version = snapshot id.",
            metadata=metadata, kinds={"iceberg"})

    @observable_source_asset(
        key=naming.source_key(table),
        group_name=naming.group_name(table),
        partitions_def=naming.partitions_def(table),
        description=f"Iceberg table {table.table_name}; one partition per snapshot of its line, data version = "
                    f"the snapshot id.",
        metadata=metadata,
        tags={"dagster/kind/iceberg": ""},
    )
    def _observe(context: AssetExecutionContext) -> DataVersionsByPartition:
        # A key's data version is its snapshot id, which never changes: re-observing a year of keys
        # would write one event per key and tell nothing new. The newest page of keys is observed.
        keys = context.instance.get_paginated_dynamic_partitions(
            naming.partitions_name(table), limit=TAIL_PAGE, ascending=False).results
        return DataVersionsByPartition({key: DataVersion(str(lifecycle.snapshot_id_of(key))) for key in keys})

    return _observe


def source_observations(table: TableConfig, catalog_name: str, source: "Table",
                        new_keys: Sequence[str]) -> list[AssetObservation | AssetMaterialization]:
    """What the line records of its new partitions, once they are in the partition set: per partition an
    observation (its data version = its snapshot id, which Dagster reads for a source's staleness) and a
    materialisation (the snapshot exists: the partition is filled, as the UI's partition status counts
    only materialisations). The newest materialisation carries the table's metadata as it is now."""
    events: list[AssetObservation | AssetMaterialization] = []
    for key in new_keys:
        version = {DATA_VERSION_TAG: str(lifecycle.snapshot_id_of(key))}
        metadata: dict[str, Any] = dict(SourceMetadata(snapshot_id=str(lifecycle.snapshot_id_of(key))))
        events.append(AssetObservation(asset_key=naming.source_key(table), partition=key, metadata=metadata,
                                       tags=version))
        if key == new_keys[-1]:
            metadata = {**metadata, **SourceMetadata(current_snapshot_id=key, new_snapshots=len(new_keys)),
                        **table_metadata(catalog_name, source, table.identifier_columns,
                                         fallback=source_fallback(table.table_name))}
        events.append(AssetMaterialization(asset_key=naming.source_key(table), partition=key, metadata=metadata,
                                           tags=version))
    return events


__all__ = ["AssetSpec", "build_source_asset", "source_observations"]
