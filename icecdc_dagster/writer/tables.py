"""Table-level operations the writer needs through Iceberg's Java API (exact copies, v3 included)."""

from collections.abc import Sequence
from typing import Any

from icecdc_dagster.writer.exactly_once import java_table


def spark_catalog(spark: Any, catalog_name: str) -> Any:
    """The Iceberg Java ``Catalog`` behind a Spark catalog name."""
    return spark._jsparkSession.sessionState().catalogManager().catalog(catalog_name).icebergCatalog()


def table_exists(spark: Any, catalog_name: str, table: str) -> bool:
    ident = spark._jvm.org.apache.iceberg.catalog.TableIdentifier.parse(table)
    return bool(spark_catalog(spark, catalog_name).tableExists(ident))


def copy_table(spark: Any, catalog_name: str, source: str, target: str,
               identifier_columns: Sequence[str] = ()) -> None:
    """Create ``target`` with the source's schema, partition spec, sort order and properties."""
    src = java_table(spark, f"{catalog_name}.{source}")
    jvm = spark._jvm
    ident = jvm.org.apache.iceberg.catalog.TableIdentifier.parse(target)
    props = jvm.java.util.HashMap(src.properties())
    props.put("format-version", str(src.operations().current().formatVersion()))
    builder = (spark_catalog(spark, catalog_name).buildTable(ident, src.schema()).withPartitionSpec(src.spec())
               .withSortOrder(src.sortOrder()).withProperties(props))
    builder.create()
    if identifier_columns:
        set_identifier_fields(spark, f"{catalog_name}.{target}", identifier_columns)


def set_identifier_fields(spark: Any, table: str, columns: Sequence[str]) -> None:
    jtable = java_table(spark, table)
    names = spark._jvm.java.util.ArrayList()
    for c in columns:
        names.add(c)
    if set(jtable.schema().identifierFieldNames()) != set(columns):
        update = jtable.updateSchema()
        for c in columns:
            field = jtable.schema().findField(c)
            if field is not None and field.isOptional():
                update = update.requireColumn(c)
        update.setIdentifierFields(names).commit()


def union_schema(spark: Any, source: str, target: str) -> list[str]:
    """Add the source's new columns (nested too) to the target; returns the added top-level names."""
    src = java_table(spark, source)
    tgt = java_table(spark, target)
    before = {f.name() for f in tgt.schema().columns()}
    identifier = tgt.schema().identifierFieldNames()
    tgt.updateSchema().unionByNameWith(src.schema()).setIdentifierFields(identifier).commit()
    tgt.refresh()
    return [f.name() for f in tgt.schema().columns() if f.name() not in before]
