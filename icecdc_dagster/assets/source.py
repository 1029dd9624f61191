"""``iceberg/<ns>/<table>``: the source table as an observable asset (data version = snapshot id)."""

from collections.abc import Mapping
from typing import Any

from dagster import AssetExecutionContext, AssetKey, AssetSpec, DataVersion, SourceAsset, observable_source_asset

from icecdc_dagster.assets import naming
from icecdc_dagster.config import TableConfig


def build_source_asset(table: TableConfig, written_by: tuple[AssetKey, ...] = (),
                       described: Mapping[str, Any] | None = None) -> SourceAsset | AssetSpec:
    """``written_by``: keys of ingest assets that write this table. Then the table is an external
    asset downstream of them (one lineage graph: landing -> table -> changelog -> sinks); its
    observations still come from the sensor. ``described``: table metadata known at load (schema,
    location), shown on the asset page before any observation."""
    metadata = {"table_name": table.table_name, **(described or {})}
    if written_by:
        return AssetSpec(
            key=naming.source_key(table), deps=list(written_by), group_name=naming.group_name(table),
            description=f"Iceberg table {table.table_name}, written by ingestion; data version = snapshot id.",
            metadata=metadata, kinds={"iceberg"})

    @observable_source_asset(
        key=naming.source_key(table),
        group_name=naming.group_name(table),
        description=f"Iceberg table {table.table_name}; its data version is the current snapshot id.",
        required_resource_keys={"catalog"},
        metadata=metadata,
        tags={"dagster/kind/iceberg": ""},
    )
    def _observe(context: AssetExecutionContext) -> DataVersion:
        snapshot = context.resources.catalog.load_table(table.table_name).current_snapshot()
        return DataVersion(str(snapshot.snapshot_id) if snapshot else "empty")

    return _observe


__all__ = ["AssetSpec", "build_source_asset"]
