"""``- iceberg: {table_name: ...}``: the Iceberg replica sink kind — a downstream table kept by MERGE."""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from icecdc_dagster.fields import TableName
from icecdc_dagster.sinks.iceberg.consistency import compare_replica
from icecdc_dagster.sinks.iceberg.sink import SOURCE_ROW_ID, SOURCE_ROW_ID_DOC, IcebergReplicaSink
from icecdc_dagster.sinks.kind import Comparison, SinkConfig, SinkContext

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame

    from icecdc_dagster.batch import Checkpoint


class IcebergSinkConfig(SinkConfig):
    """A replica, in the source's catalog or another (``catalog``): created like the source, then one MERGE
    commit per batch."""

    kind: ClassVar[str] = "iceberg"
    asset_prefix: ClassVar[str] = "replica"
    tags: ClassVar[frozenset[str]] = frozenset({"iceberg", "spark"})

    table_name: TableName = Field(description="<namespace>.<table> of the replica (created when missing)")
    catalog: str | None = Field(default=None, strict=True, min_length=1,
                                description="the catalog the replica lives in: a name under catalogs (default: "
                                            "the default catalog, the source's)")
    write_mode: Literal["merge-on-read", "copy-on-write"] = Field(
        default="merge-on-read",
        description="how the replica it creates takes each batch's MERGE (its write.merge/update/delete.mode; "
                    "a replica that exists keeps its own): merge-on-read writes delete files or deletion vectors "
                    "that maintenance compacts, copy-on-write rewrites the data files a batch touches (format v1: "
                    "always copy-on-write). A created replica also gets `commit.manifest.min-count-to-merge` = 8 "
                    "(unless the source sets it): each batch adds a manifest and every MERGE plans from all of "
                    "them; `ALTER TABLE … SET TBLPROPERTIES` gives an older replica the same")

    @property
    def target_catalog(self) -> str | None:
        return self.catalog

    @property
    def target(self) -> str:
        return self.table_name

    def describe(self, source_table: str) -> str:
        where = f" in catalog {self.catalog}" if self.catalog else ""
        return f"Iceberg replica {self.table_name}{where} of {source_table} (MERGE per batch)"

    def maintained_table(self) -> str:
        return self.table_name

    def derived_columns(self, source_columns: Sequence[str], identifier_columns: Sequence[str],
                        by_row_id: bool) -> dict[str, list[str]]:
        lineage = super().derived_columns(source_columns, identifier_columns, by_row_id)
        if by_row_id:
            lineage["_source_row_id"] = ["_row_id"]
        return lineage

    def target_schema(self, source: "Table", identifier_columns: Sequence[str], by_row_id: bool) -> Schema:
        """The replica's schema as the sink makes it: the source's columns (created by copying the source
        schema, new source columns added before each batch), the identifier columns required, and the
        ``_source_row_id`` key after them for a keyless v3 source (see ``sinks/iceberg/sink.py``)."""
        schema = source.schema()
        fields = [NestedField(field_id=f.field_id, name=f.name, field_type=f.field_type, doc=f.doc,
                              required=f.required or f.name in identifier_columns) for f in schema.fields]
        keys = [f.field_id for f in fields if f.name in identifier_columns]
        if by_row_id:
            fields.append(NestedField(field_id=schema.highest_field_id + 1, name=SOURCE_ROW_ID, field_type=LongType(),
                                      required=True, doc=SOURCE_ROW_ID_DOC))
            keys = [fields[-1].field_id]
        return Schema(*fields, identifier_field_ids=keys)

    def refuse_source(self, table_name: str, source: "Table", rows_identifiable: bool) -> str | None:
        if rows_identifiable:
            return None
        return (f"{table_name!r} has an Iceberg replica sink ({self.table_name}) but no identifier columns "
                f"(config or table identifier fields) and no v3 row lineage (format version "
                f"{source.metadata.format_version}), so its updates and deletes cannot be matched in the "
                f"replica; set identifier_columns, upgrade the table to format v3, or declare the table "
                f"append_only: true")

    def open(self, context: SinkContext) -> IcebergReplicaSink:
        catalog_name, catalog = context.target_catalog()
        return IcebergReplicaSink(context.spark, catalog_name, catalog, self.table_name,
                                  context.source_table, identifier_columns=context.identifier_columns,
                                  name=self.name, source_catalog=context.catalog_name, write_mode=self.write_mode)

    def compare(self, context: SinkContext, sink: Any, checkpoint: "Checkpoint", source_rows: "DataFrame",
                source_count: int, sample_size: int) -> Comparison:
        assert context.spark is not None
        catalog_name, catalog = context.target_catalog()
        return compare_replica(context.spark, f"{catalog_name}.{self.table_name}", source_rows,
                               source_count, sample_size, catalog.load_table(self.table_name))
