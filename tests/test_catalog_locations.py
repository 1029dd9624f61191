"""An idle tick of one sensor for every table compares each table's metadata file as the catalog records it:
read for every table in one query, each the same as the table's own record."""

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from sqlalchemy import event

from icecdc_dagster.resources import IcebergCatalogResource
from icecdc_dagster.resources.resolved import initialized


def test_every_tables_metadata_location_in_one_query_and_the_same_as_each_ones(tmp_path):
    uri, warehouse = f"sqlite:///{tmp_path}/cat.db", f"file://{tmp_path}/wh"
    lake = SqlCatalog("lake", uri=uri, warehouse=warehouse)
    schema = Schema(NestedField(1, "id", LongType(), required=True), identifier_field_ids=[1])
    for namespace in ("db", "other"):
        lake.create_namespace(namespace)
    tables = {name: lake.create_table(name, schema) for name in ("db.t", "other.t", "db.u")}
    tables["db.u"].append(pa.table({"id": [1]}, schema=schema.as_arrow()))
    resource = initialized(IcebergCatalogResource(name="lake", uri=uri, warehouse=warehouse))
    engine = resource.load().engine  # the resource's own catalog: count what it sends
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, sql, *_: statements.append(sql))

    found = resource.metadata_locations(["db.t", "other.t", "db.u", "db.missing"])

    assert len(statements) == 1
    assert found == {name: lake.load_table(name).metadata_location for name in ("db.t", "other.t", "db.u")}
    assert found["db.t"] != found["other.t"]  # the same table name in two namespaces stays apart
    assert resource.metadata_location("db.u") == found["db.u"] and resource.metadata_location("db.missing") is None
    assert resource.metadata_locations([]) == {}
