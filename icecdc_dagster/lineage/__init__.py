"""Lineage for tools outside Dagster: OpenLineage run events per batch (no Dagster imports)."""

from icecdc_dagster.lineage.openlineage import (
                                                BatchFacet,
                                                LineageDataset,
                                                LineageEmitter,
                                                iceberg_dataset,
                                                location_dataset,
                                                opensearch_dataset,
)

__all__ = ["BatchFacet", "LineageDataset", "LineageEmitter", "iceberg_dataset", "location_dataset",
           "opensearch_dataset"]
