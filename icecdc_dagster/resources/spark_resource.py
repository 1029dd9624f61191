"""The SparkSession, started once per process with Iceberg and attached to the catalog.

It is a ``dagster_pyspark`` resource (:class:`LazyPySparkResource`): a Dagster user's ``spark_config``
(flat ``{"spark.executor.memory": "2g"}`` or nested ``{"spark": {"executor": {"memory": "2g"}}}``, as
dagster-pyspark takes it) works unchanged, and ``spark_session`` / ``spark_context`` are there for their
own ops. Unlike dagster-pyspark's, the session is the process's one warm session (``runtime.spark``):
started with Iceberg once, attached to each catalog once, shared by every lane and run of the process.
"""

from typing import TYPE_CHECKING, Any

from dagster_pyspark import LazyPySparkResource, PySparkResource
from dagster_spark.utils import flatten_dict

from icecdc_dagster.resources.catalog_resource import IcebergCatalogResource
from icecdc_dagster.runtime.spark import SparkSettings, build_spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkResource(LazyPySparkResource):
    """``master`` may be a cluster URL; then set ``jars`` to the cluster's own Iceberg jars.

    ``spark_config`` (dagster-pyspark's) and ``conf`` (the pipeline file's) are both applied, ``conf`` last;
    ``spark.master`` / ``spark.app.name`` in ``spark_config`` stand for ``master`` / ``app_name``."""

    spark_config: dict[str, Any] = {}
    master: str = "local[*]"
    app_name: str = "icecdc_dagster"
    conf: dict[str, str] = {}
    jars: list[str] = []
    # What every catalog of the pipeline needs loaded when the session starts ("rest", "sqlite",
    # "postgresql"): a step attaches only the catalogs it uses, but jars cannot be added later.
    catalog_kinds: list[str] = []

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        return False

    @classmethod
    def from_pyspark(cls, resource: LazyPySparkResource | PySparkResource, **fields: Any) -> "SparkResource":
        """Ours, from a user's dagster-pyspark resource: its ``spark_config`` carried over unchanged."""
        return cls(spark_config=dict(resource.spark_config), **fields)

    def settings(self) -> SparkSettings:
        user = {key: str(value) for key, value in flatten_dict(self.spark_config or {})}
        master = user.pop("spark.master", None) or self.master
        app_name = user.pop("spark.app.name", None) or self.app_name
        drivers = tuple(sorted(kind for kind in set(self.catalog_kinds) if kind != "rest"))
        return SparkSettings(master=master, app_name=app_name, conf={**user, **self.conf}, jars=tuple(self.jars),
                             jdbc_drivers=drivers, rest_catalog="rest" in self.catalog_kinds)

    def _init_session(self) -> None:
        """dagster-pyspark's lazy start, on the process's warm session (no catalog attached yet)."""
        if self._spark_session is None:
            self._spark_session = build_spark_session(self.settings())  # type: ignore[assignment]  # None-typed upstream

    def session(self, catalog: IcebergCatalogResource, *more: IcebergCatalogResource) -> "SparkSession":
        """The process's session, attached to ``catalog`` and ``more`` (a replica's in another catalog)."""
        session = build_spark_session(self.settings(), [c.settings() for c in (catalog, *more)])
        self._spark_session = session  # type: ignore[assignment]  # dagster-pyspark declares it None-typed
        return session
