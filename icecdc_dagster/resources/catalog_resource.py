"""The Iceberg catalog (a REST catalog, or a SQL catalog shared with Spark's JDBC catalog)."""

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr

from icecdc_dagster.resources.keys import CATALOG_KEY
from icecdc_dagster.resources.secrets import require_resolved
from icecdc_dagster.runtime.catalog import CatalogSettings, with_password

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table


def catalog_resource_key(name: str | None) -> str:
    """The resource key of catalog ``name`` (``catalogs:``); None: the default catalog's. One rule, used by
    the definitions that register the resources and by every step that asks for one."""
    return CATALOG_KEY if name is None else f"{CATALOG_KEY}__{name}"


def catalog_resource_keys(*names: str | None) -> set[str]:
    """The resource keys a step needs for the catalogs it touches (the default's always: the source)."""
    return {CATALOG_KEY, *(catalog_resource_key(name) for name in names)}


def run_catalog(resources: Any, name: str | None) -> "IcebergCatalogResource":
    """Catalog ``name`` (None: the default) among a run's resources (``context.resources``)."""
    return getattr(resources, catalog_resource_key(name))


class IcebergCatalogResource(ConfigurableResource[Any]):
    """``uri`` is a REST catalog's URL or a SQLAlchemy URL; put a password in ``password`` and a token or
    credential in ``properties`` as an ``EnvVar``, never in the URI or as text. Outside a run, use it only
    as ``resources.resolved`` gives it (Dagster's initialisation): the raw one refuses to connect."""

    type: str = "sql"
    name: str = "lake"
    uri: str
    warehouse: str | None = None
    password: str | None = Field(default=None, description="catalog database password (use EnvVar)")
    properties: dict[str, str] = Field(default={}, description="catalog properties; secrets as EnvVar")
    # One pyiceberg catalog (and its SQLAlchemy engine pool) per resource instance, i.e. per run
    # worker, shared by every step and check instead of a new engine per call.
    _catalog: "Catalog | None" = PrivateAttr(default=None)

    def settings(self) -> CatalogSettings:
        """Both engines' settings.

        Raises:
            UnresolvedResourceError: this resource was not initialised by Dagster (``resources.resolved``).
        """
        require_resolved(self, f"catalog {self.name!r}")
        return CatalogSettings(self.name, with_password(self.uri, self.type, self.password), self.warehouse,
                               dict(self.properties), type=self.type)

    def load(self) -> "Catalog":
        if self._catalog is None:
            self._catalog = shared_catalog(self.settings())
        return self._catalog

    def load_table(self, table_name: str) -> "Table":
        return self.load().load_table(table_name)

    def source_table(self, run_id: str | None, table_name: str) -> "Table":
        """A table the run reads, loaded once per run: its steps and checks share the first load
        instead of one catalog load (and metadata file parse) each. A table the run writes is
        loaded fresh with :meth:`load_table`; so is every table outside a run (``run_id`` None)."""
        if run_id is None:
            return self.load_table(table_name)
        key = (run_id, self.name, self.uri, table_name)
        with _RUN_TABLES_LOCK:
            table = _RUN_TABLES.get(key)
        if table is None:
            table = self.load_table(table_name)
            with _RUN_TABLES_LOCK:
                _RUN_TABLES[key] = table
                while len(_RUN_TABLES) > _RUN_TABLES_KEPT:  # oldest first (insertion order)
                    del _RUN_TABLES[next(iter(_RUN_TABLES))]
        return table

    def metadata_location(self, table_name: str) -> str | None:
        """The table's current metadata file as the catalog database records it: one indexed query,
        no metadata file read (what an idle sensor tick compares). None when the table is not found
        or the catalog is not a SQL catalog (then load the table)."""
        return self.metadata_locations([table_name]).get(table_name)

    def metadata_locations(self, table_names: Sequence[str]) -> dict[str, str]:
        """:meth:`metadata_location` of many tables in one query (one sensor ticking every table: one
        catalog round trip per tick, not one per table). Tables not found, and every table of a catalog
        that is not a SQL catalog, are left out."""
        catalog = self.load()
        from pyiceberg.catalog.sql import IcebergTables, SqlCatalog  # ~1.6 s; a REST catalog never loads it

        if not isinstance(catalog, SqlCatalog) or not table_names:
            return {}
        from sqlalchemy import select  # a SQL catalog only (loaded with it above)
        from sqlalchemy.orm import Session  # a SQL catalog only (loaded with it above)

        wanted = {(catalog.namespace_to_string(catalog.namespace_from(name)), catalog.table_name_from(name)): name
                  for name in table_names}
        query = select(IcebergTables.table_namespace, IcebergTables.table_name, IcebergTables.metadata_location).where(
            IcebergTables.catalog_name == catalog.name,
            IcebergTables.table_name.in_(sorted({table for _, table in wanted})))
        with Session(catalog.engine) as session:
            rows = session.execute(query).all()
        return {wanted[(namespace, table)]: location for namespace, table, location in rows
                if (namespace, table) in wanted and location is not None}


_RUN_TABLES: dict[tuple[str, str, str, str], "Table"] = {}
_RUN_TABLES_LOCK = threading.Lock()
_RUN_TABLES_KEPT = 256  # tables of the runs in flight (a run reads one source table)
_CATALOGS: dict[tuple[Any, ...], "Catalog"] = {}
_CATALOGS_LOCK = threading.Lock()


def shared_catalog(settings: CatalogSettings) -> "Catalog":
    """One pyiceberg catalog (one SQLAlchemy engine and its pool) per catalog configuration and process.

    Dagster builds resources per run and per sensor tick: 20 tables ticking at PT5S created 4 catalogs
    (engines) a second, each checking the catalog tables. The catalog holds no table state (every
    ``load_table`` reads the catalog), so sharing it changes no result.
    """
    key = (settings.type, settings.name, settings.uri, settings.warehouse, tuple(sorted(settings.properties.items())))
    with _CATALOGS_LOCK:
        catalog = _CATALOGS.get(key)
        if catalog is None:
            catalog = _CATALOGS[key] = settings.load_pyiceberg()
        return catalog
