"""Table-level operations the writer needs through Iceberg's Java API (exact copies, v3 included)."""

from collections.abc import Sequence
from typing import Any

from icecdc_dagster.writer.exactly_once import java_table

MANIFEST_MERGE_PROPERTY = "commit.manifest.min-count-to-merge"
# A table we create takes one MERGE per batch, each commit adding a manifest (two with merge-on-read: data and
# deletes), and every MERGE plans its read from all of them. Iceberg merges them at 100 by default, so such a
# table is read from ~50 manifests per batch on average; at 8 from a few, and each merge rewrites at most one
# 8 MB bin of small manifests. bench/batch_profile.py at 45-60 batches: the replica MERGE's JVM CPU
# 0.565 -> 0.435 s, the whole batch's 1.10 -> 1.00 (docs/performance.md).
MERGED_MANIFEST_COUNT = 8


def spark_catalog(spark: Any, catalog_name: str) -> Any:
    """The Iceberg Java ``Catalog`` behind a Spark catalog name."""
    return spark._jsparkSession.sessionState().catalogManager().catalog(catalog_name).icebergCatalog()


def table_exists(spark: Any, catalog_name: str, table: str) -> bool:
    """Whether the catalog holds ``table`` (asked through Spark's catalog, no table read).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the catalog cannot be asked (passes through);
            nothing of its own.
    """
    ident = spark._jvm.org.apache.iceberg.catalog.TableIdentifier.parse(table)
    return bool(spark_catalog(spark, catalog_name).tableExists(ident))


def copy_table(spark: Any, catalog_name: str, source: str, target: str,
               identifier_columns: Sequence[str] = (), key_column: tuple[str, str] | None = None,
               schema_id: int | None = None, target_catalog: str | None = None) -> None:
    """Create ``target`` with the source's schema, partition spec, sort order, properties and format version.

    ``target_catalog``: the catalog ``target`` is created in, when not the source's (its namespace is
    created there when missing: a replica in another catalog usually starts in an empty one).
    The source schema holds its data columns only (never v3 ``_row_id`` / ``_last_updated_sequence_number``,
    which are metadata), so a v3 target gets its own row lineage. ``key_column``: (name, doc) of a
    required ``long`` column added after the source's columns and made the identifier field (the replica
    of a keyless v3 table keeps the source's ``_row_id`` there).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the source cannot be read or the target cannot
            be created (passes through);
            nothing of its own.
    """
    src = java_table(spark, f"{catalog_name}.{source}")
    jvm = spark._jvm
    ident = jvm.org.apache.iceberg.catalog.TableIdentifier.parse(target)
    props = jvm.java.util.HashMap(src.properties())
    props.put("format-version", str(src.operations().current().formatVersion()))
    schema = _schema_to_copy(src, schema_id)
    if key_column is not None:
        name, doc = key_column
        fields = jvm.java.util.ArrayList(schema.columns())
        fields.add(jvm.org.apache.iceberg.types.Types.NestedField.required(
            schema.highestFieldId() + 1, name, jvm.org.apache.iceberg.types.Types.LongType.get(), doc))
        schema = jvm.org.apache.iceberg.Schema(fields)
        identifier_columns = (*identifier_columns, name)
    target_catalog = target_catalog or catalog_name
    catalog = spark_catalog(spark, target_catalog)
    _ensure_namespace(jvm, catalog, ident.namespace())
    builder = (catalog.buildTable(ident, schema).withPartitionSpec(src.spec())
               .withSortOrder(src.sortOrder()).withProperties(props))
    builder.create()
    if identifier_columns:
        set_identifier_fields(spark, f"{target_catalog}.{target}", identifier_columns)


def _ensure_namespace(jvm: Any, catalog: Any, namespace: Any) -> None:
    """Create ``namespace`` in ``catalog`` when it supports namespaces and lacks it (a REST catalog
    refuses a table in a missing namespace)."""
    if not jvm.org.apache.iceberg.catalog.SupportsNamespaces._java_lang_class.isInstance(catalog):
        return
    if not catalog.namespaceExists(namespace):
        try:
            catalog.createNamespace(namespace)
        except Exception as exc:  # noqa: BLE001 - another writer created it meanwhile: fine
            if "AlreadyExists" not in str(exc):
                raise


def _schema_to_copy(src: Any, schema_id: int | None) -> Any:
    """The source schema ``schema_id``, unless the current partition spec needs a column it lacks."""
    chosen = src.schemas().get(schema_id) if schema_id is not None else None
    if chosen is None:
        return src.schema()
    if any(chosen.findField(f.sourceId()) is None for f in src.spec().fields()):
        return src.schema()
    return chosen


def drop_table(spark: Any, catalog_name: str, table: str) -> None:
    """Drop ``table`` and its files (a replica rebuilt by a resync export).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the catalog refuses the DROP (passes through);
            nothing of its own.
    """
    ident = spark._jvm.org.apache.iceberg.catalog.TableIdentifier.parse(table)
    spark_catalog(spark, catalog_name).dropTable(ident, True)


def set_identifier_fields(spark: Any, table: str, columns: Sequence[str]) -> None:
    """Set the table's identifier fields to ``columns`` (one schema commit).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Iceberg refuses the columns (nullable, missing)
            or the commit;
            nothing of its own.
    """
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
