"""The Iceberg catalog (pyiceberg SQL catalog, shared with Spark's JDBC catalog)."""

from dagster import ConfigurableResource
from pydantic import Field

from icecdc_dagster.runtime.catalog import CatalogSettings


class IcebergCatalogResource(ConfigurableResource):
    """``uri`` is a SQLAlchemy URL; put a password in ``password`` (an ``EnvVar``), not in the URI."""

    name: str = "lake"
    uri: str
    warehouse: str
    password: str | None = Field(default=None, description="catalog database password (use EnvVar)")
    properties: dict[str, str] = {}

    def settings(self) -> CatalogSettings:
        uri = self.uri
        if self.password:
            from sqlalchemy.engine import make_url

            uri = make_url(uri).set(password=self.password).render_as_string(hide_password=False)
        return CatalogSettings(self.name, uri, self.warehouse, dict(self.properties))

    def load(self):  # noqa: ANN201 - pyiceberg Catalog
        return self.settings().load_pyiceberg()

    def load_table(self, table_name: str):  # noqa: ANN201 - pyiceberg Table
        return self.load().load_table(table_name)
