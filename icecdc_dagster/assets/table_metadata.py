"""Dagster's own table metadata for the table-shaped assets, so the asset pages, the catalog and
every tool reading Dagster metadata see tables, not opaque boxes.

- ``dagster/table_name`` (catalog.namespace.table), ``dagster/uri`` (the table location) and
  ``dagster/column_schema`` (the Iceberg schema: names, types including nested ones, nullability,
  field docs, identifier columns as constraints), with the schema id so an evolution is visible;
- ``dagster/row_count`` from the current snapshot's summary (``total-records`` minus position
  deletes), never a scan; omitted while equality deletes make the summary inexact;
- ``dagster/column_lineage``: each column of a sink or of the changelog store <- the source
  column(s) it comes from (a document id <- the identifier columns).

Everything here reads table metadata already loaded: no extra catalog or Spark work per batch.
"""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster import (AssetKey, MetadataValue, TableColumn, TableColumnConstraints, TableColumnDep,
                     TableColumnLineage, TableConstraints, TableSchema)

if TYPE_CHECKING:
    from pyiceberg.table import Table

TABLE_NAME = "dagster/table_name"
URI = "dagster/uri"
COLUMN_SCHEMA = "dagster/column_schema"
ROW_COUNT = "dagster/row_count"
PARTITION_ROW_COUNT = "dagster/partition_row_count"
COLUMN_LINEAGE = "dagster/column_lineage"


def table_metadata(catalog_name: str, table: "Table", identifier_columns: Sequence[str] = ()) -> dict[str, Any]:
    """Name, location, column schema and (when exact) row count of an Iceberg table."""
    schema = table.schema()
    keys = tuple(identifier_columns) or tuple(sorted(schema.identifier_field_names()))
    columns = [TableColumn(name=field.name, type=str(field.field_type), description=field.doc,
                           constraints=TableColumnConstraints(
                               nullable=not field.required, unique=keys == (field.name,),
                               other=["identifier column"] if field.name in keys else None))
               for field in schema.fields]
    constraints = TableConstraints(other=[f"identifier columns: {', '.join(keys)}"]) if keys else None
    metadata: dict[str, Any] = {
        TABLE_NAME: ".".join((catalog_name, *table.name())),
        URI: MetadataValue.path(table.location()),
        COLUMN_SCHEMA: TableSchema(columns=columns, constraints=constraints),
        "schema_id": schema.schema_id,
        "format_version": table.metadata.format_version,
    }
    rows = exact_row_count(table)
    if rows is not None:
        metadata[ROW_COUNT] = rows
    return metadata


def exact_row_count(table: "Table") -> int | None:
    """Live rows from the snapshot summary; None when equality deletes (or a missing summary)
    leave the count unknown without a scan."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return 0
    summary = snapshot.summary
    if summary is None or summary.get("total-records") is None:
        return None
    if int(summary.get("total-equality-deletes") or 0) > 0:
        return None
    return int(summary.get("total-records") or 0) - int(summary.get("total-position-deletes") or 0)

def column_lineage(source: AssetKey, derived_from: Mapping[str, Sequence[str]]) -> TableColumnLineage:
    """``derived_from``: column of this asset -> the source columns it is computed from."""
    return TableColumnLineage(deps_by_column={
        column: [TableColumnDep(asset_key=source, column_name=name) for name in names]
        for column, names in derived_from.items() if names})
