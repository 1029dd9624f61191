"""The SparkSession, started once per process with Iceberg and attached to the catalog."""

from typing import TYPE_CHECKING

from dagster import ConfigurableResource

from icecdc_dagster.resources.catalog import IcebergCatalogResource
from icecdc_dagster.runtime.spark import SparkSettings, build_spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkResource(ConfigurableResource):
    """``master`` may be a cluster URL; then set ``jars`` to the cluster's own Iceberg jars."""

    master: str = "local[*]"
    app_name: str = "icecdc_dagster"
    conf: dict[str, str] = {}
    jars: list[str] = []

    def settings(self) -> SparkSettings:
        return SparkSettings(master=self.master, app_name=self.app_name, conf=dict(self.conf),
                             jars=tuple(self.jars))

    def session(self, catalog: IcebergCatalogResource) -> "SparkSession":
        return build_spark_session(self.settings(), [catalog.settings()])
