"""The Iceberg catalog (pyiceberg SQL catalog, shared with Spark's JDBC catalog)."""

from typing import TYPE_CHECKING

from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr

from icecdc_dagster.runtime.catalog import CatalogSettings

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table


class IcebergCatalogResource(ConfigurableResource):
    """``uri`` is a SQLAlchemy URL; put a password in ``password`` (an ``EnvVar``), not in the URI."""

    type: str = "sql"
    name: str = "lake"
    uri: str
    warehouse: str
    password: str | None = Field(default=None, description="catalog database password (use EnvVar)")
    properties: dict[str, str] = {}
    # One pyiceberg catalog (and its SQLAlchemy engine pool) per resource instance, i.e. per run
    # worker, shared by every step and check instead of a new engine per call.
    _catalog: "Catalog | None" = PrivateAttr(default=None)

    def settings(self) -> CatalogSettings:
        uri = self.uri
        if self.password and self.type == "sql":
            from sqlalchemy.engine import make_url

            uri = make_url(uri).set(password=self.password).render_as_string(hide_password=False)
        return CatalogSettings(self.name, uri, self.warehouse, dict(self.properties), type=self.type)

    def load(self) -> "Catalog":
        if self._catalog is None:
            self._catalog = self.settings().load_pyiceberg()
        return self._catalog

    def load_table(self, table_name: str) -> "Table":
        return self.load().load_table(table_name)
