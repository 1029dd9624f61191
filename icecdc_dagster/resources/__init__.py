"""Dagster resources shared by every asset: the catalog and the SparkSession. A sink's own
connection resource lives with its kind (``sinks/<kind>/resource.py``)."""

from icecdc_dagster.resources.catalog_resource import (
    IcebergCatalogResource,
    catalog_resource_key,
    catalog_resource_keys,
    run_catalog,
)
from icecdc_dagster.resources.spark_resource import SparkResource

__all__ = ["IcebergCatalogResource", "SparkResource", "catalog_resource_key", "catalog_resource_keys", "run_catalog"]
