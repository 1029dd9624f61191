"""Dagster's own table metadata for the table-shaped assets, so the asset pages, the catalog and
every tool reading Dagster metadata see tables, not opaque boxes.

- ``dagster/table_name`` (catalog.namespace.table), ``dagster/uri`` (the table location) and
  ``dagster/column_schema`` (the Iceberg schema: names, types including nested ones, nullability,
  field docs, identifier columns as constraints), with the schema id so an evolution is visible;
- ``dagster/row_count``, only where it is exact without a scan (:func:`exact_row_count`): the
  summary's ``total-records`` when the snapshot has no delete files, else the live data files'
  records minus the distinct positions their position deletes / deletion vectors remove (dangling
  deletes that outlived a compaction count for nothing); omitted with equality deletes;
- ``dagster/column_lineage``: each column of a sink or of the changelog store <- the source
  column(s) it comes from (a document id <- the identifier columns); open-source Dagster's UI
  renders that entry only in Dagster+, so the same lineage is also a markdown table
  (``column_lineage_table``) the UI renders everywhere; an ingest target has the table alone (its
  columns come from the landing's Debezium fields, which are no asset).

Everything here reads table metadata already loaded: no extra catalog or Spark work per batch.

Definition metadata (what the asset pages show before and between runs) costs no catalog call per
asset at load: a source's from the table the load checks read anyway; a replica's derived from that
source (:meth:`SinkConfig.target_schema`), a dead-letter table's from the schema the engine creates;
the changelog store's and an ingest target's (and every table's location) from a small cache
(:mod:`icecdc_dagster.assets.metadata_cache`, :func:`~.metadata_cache.described_table`) that each
materialisation refreshes when the table's
schema or location changed.
"""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetKey,
    MetadataValue,
    TableColumn,
    TableColumnConstraints,
    TableColumnDep,
    TableColumnLineage,
    TableConstraints,
    TableSchema,
)
from pyiceberg.types import ListType, MapType, StructType

from icecdc_dagster.changelog import exact_row_count
from icecdc_dagster.steps.batches import identifier_columns_of, uses_row_id

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.types import IcebergType

    from icecdc_dagster.config import SinkConfig, TableConfig

TABLE_NAME = "dagster/table_name"
URI = "dagster/uri"
COLUMN_SCHEMA = "dagster/column_schema"
ROW_COUNT = "dagster/row_count"
PARTITION_ROW_COUNT = "dagster/partition_row_count"
COLUMN_LINEAGE = "dagster/column_lineage"
COLUMN_LINEAGE_TABLE = "column_lineage_table"


# Descriptions of the columns we add, where the table's schema carries no doc of its own.
CHANGELOG_DOCS = {
    "_change_type": "INSERT, DELETE, UPDATE_BEFORE (the old image of an updated row) or UPDATE_AFTER (its new image)",
    "_commit_snapshot_id": "the source snapshot that made this change",
    "_commit_sequence_number": "that snapshot's sequence number: orders changes across snapshots",
    "_change_ordinal": "position of the change among the batch's snapshots (0 = first)",
    "_commit_timestamp": "commit time of that snapshot (UTC)",
    "_batch_snapshot_id": "the batch (and changelog partition) this row belongs to: its last source snapshot",
    "_batch_first_snapshot_id": "the batch's first source snapshot (differs from the last in a catch-up batch)",
    "_source_row_id": "the source row's v3 _row_id (row lineage)",
    "_source_last_updated_sequence_number": "the source row's v3 _last_updated_sequence_number",
}
DEAD_LETTER_DOCS = {
    "raw": "the event as it was read (the landing file's line)",
    "reason": "why it could not be written: parse error, unknown op, missing key, type the target cannot hold...",
    "source_file": "landing file the event came from",
    "source_offset": "line number of the event in that file",
    "target": "the table the event was meant for",
    "batch_id": "the ingest batch that read it",
    "dead_lettered_at": "when it was dead-lettered (UTC)",
}


def column_schema(schema: "Schema", identifier_columns: Sequence[str] = (), docs: Mapping[str, str] | None = None,
                  fallback: str | None = None) -> TableSchema:
    """``dagster/column_schema`` of an Iceberg schema; ``identifier_columns`` default to its identifier fields.

    A column's description is its Iceberg doc, else ``docs[name]``, else ``fallback`` formatted with
    ``column``: every column the UI lists says something."""
    keys = tuple(identifier_columns) or tuple(sorted(schema.identifier_field_names()))
    known = docs or {}
    columns = [TableColumn(name=field.name, type=type_string(field.field_type),
                           description=field.doc or known.get(field.name)
                           or (fallback.format(column=field.name) if fallback else None),
                           constraints=TableColumnConstraints(
                               nullable=not field.required, unique=keys == (field.name,),
                               other=["identifier column"] if field.name in keys else None))
               for field in schema.fields]
    constraints = TableConstraints(other=[f"identifier columns: {', '.join(keys)}"]) if keys else None
    return TableSchema(columns=columns, constraints=constraints)


def type_string(field_type: "IcebergType") -> str:
    """An Iceberg type as the UI shows it, nested types spelled out without field ids (ids are an
    internal of each table: a replica's differ from its source's after a dropped column)."""
    if isinstance(field_type, StructType):
        return "struct<" + ", ".join(f"{f.name}: {'required' if f.required else 'optional'} "
                                     f"{type_string(f.field_type)}" for f in field_type.fields) + ">"
    if isinstance(field_type, ListType):
        return f"list<{type_string(field_type.element_type)}>"
    if isinstance(field_type, MapType):
        return f"map<{type_string(field_type.key_type)}, {type_string(field_type.value_type)}>"
    return str(field_type)


def table_metadata(catalog_name: str, table: "Table", identifier_columns: Sequence[str] = (),
                   docs: Mapping[str, str] | None = None, fallback: str | None = None) -> dict[str, Any]:
    """Name, location, column schema and (when exact) row count of an Iceberg table."""
    schema = table.schema()
    metadata: dict[str, Any] = {
        TABLE_NAME: ".".join((catalog_name, *table.name())),
        URI: uri_value(table.location()),
        COLUMN_SCHEMA: column_schema(schema, identifier_columns, docs, fallback),
        "schema_id": schema.schema_id,
        "format_version": table.metadata.format_version,
    }
    rows = exact_row_count(table)
    if rows is not None:
        metadata[ROW_COUNT] = rows
    return metadata


def definition_metadata(catalog_name: str, table: "TableConfig", sink: "SinkConfig", source: "Table | None",
                        remembered: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Load-time metadata of the table a sink writes: its name; its column schema derived from the
    source's (exact: the sink makes the table so); its location (and schema id, while the derived
    schema is the one last seen) remembered from the last batch. An index: nothing."""
    target = sink.maintained_table()
    if target is None:
        return {}
    name = f"{catalog_name}.{target}"
    metadata = {**remembered.get(name, {}), TABLE_NAME: name}
    if source is not None:
        keys = identifier_columns_of(table.identifier_columns, source)
        schema = sink.target_schema(source, keys, uses_row_id(source, keys))
        if schema is not None:
            derived = column_schema(schema, keys, fallback=replica_fallback(table.table_name))
            if metadata.get(COLUMN_SCHEMA) != derived:  # the source evolved since: the next batch follows
                metadata.pop("schema_id", None)
            metadata[COLUMN_SCHEMA] = derived
    return metadata


def source_fallback(table_name: str) -> str:
    """The description of a source column without an Iceberg doc: what it is, plainly (how to give it a doc,
    ``ALTER TABLE ... ALTER COLUMN ... COMMENT``, is said once, in docs/dagster-ui.md, not on every column)."""
    return f"column {{column}} of {table_name}"


def replica_fallback(source_table: str) -> str:
    return f"{{column}} of {source_table}, as of the replica's checkpoint"


def changelog_fallback(source_table: str) -> str:
    return f"{{column}} of the changed {source_table} row (the before image for DELETE and UPDATE_BEFORE)"


def uri_value(location: str) -> Any:
    """``dagster/uri`` as the UI's Storage panel renders it: a link for http(s), else text (a path
    value shows as an empty copy icon)."""
    return MetadataValue.url(location) if location.startswith(("http://", "https://")) else MetadataValue.text(location)


def column_lineage(source: AssetKey, derived_from: Mapping[str, Sequence[str]]) -> TableColumnLineage:
    """``derived_from``: column of this asset -> the source columns it is computed from."""
    return TableColumnLineage(deps_by_column={
        column: [TableColumnDep(asset_key=source, column_name=name) for name in names]
        for column, names in derived_from.items() if names})


def lineage_metadata(source: AssetKey, derived_from: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Column lineage twice: Dagster's structured entry (rendered by Dagster+ and read by tools) and
    the same as a markdown table, which open-source Dagster's asset page shows."""
    return {COLUMN_LINEAGE: column_lineage(source, derived_from),
            COLUMN_LINEAGE_TABLE: lineage_table(source.to_user_string(), derived_from)}


def lineage_table(source: str, derived_from: Mapping[str, Sequence[str]]) -> Any:
    """``| column | from | from column |``, one row per column of this asset (a column computed
    from several source columns, like a document id from a composite key, lists them all)."""
    lines = ["| column | from | from column |", "|---|---|---|"]
    lines += [f"| {code_cell(column)} | {code_cell(source)} | {', '.join(code_cell(n) for n in names)} |"
              for column, names in derived_from.items() if names]
    return MetadataValue.md("\n".join(lines) + "\n")


def code_cell(text: str) -> str:
    """``text`` as inline code in a markdown table cell: pipes escaped, a backtick in the name
    fenced by a longer run of backticks."""
    escaped = text.replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    return f"{fence} {escaped} {fence}" if fence == "``" else f"`{escaped}`"
