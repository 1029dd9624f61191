from icecdc_dagster.resources.catalog import IcebergCatalogResource
from icecdc_dagster.resources.opensearch import OpenSearchResource
from icecdc_dagster.resources.spark import SparkResource

__all__ = ["IcebergCatalogResource", "OpenSearchResource", "SparkResource"]
