"""Create an ingestion target: from a declared schema, or from the field types of the first batch.

Declared schema (YAML)::

    schema:
      columns: [{name: id, type: long, required: true}, {name: ts, type: timestamptz}]
      partition_spec: [{column: ts, transform: day}, "bucket[16](id)"]
      table_properties: {format-version: "2"}

Auto-created tables default to format v2 and merge-on-read (cheap CDC upserts, still
readable by pyiceberg/DuckDB because Spark writes positional deletes only).
"""

import re
from collections.abc import Mapping, Sequence
from typing import Any

from icecdc_dagster.errors import SchemaDeclarationError
from icecdc_dagster.writer.tables import (
    MANIFEST_MERGE_PROPERTY,
    MERGED_MANIFEST_COUNT,
    set_identifier_fields,
    spark_catalog,
)
from icecdc_dagster.writer.type_ddl import spark_ddl

DEFAULT_PROPERTIES = {"format-version": "2", "write.merge.mode": "merge-on-read",
                      "write.update.mode": "merge-on-read", "write.delete.mode": "merge-on-read",
                      MANIFEST_MERGE_PROPERTY: str(MERGED_MANIFEST_COUNT)}
_TRANSFORM = re.compile(r"^(identity|year|month|day|hour|void|bucket\[(\d+)\]|truncate\[(\d+)\])(?:\((\w+)\))?$")
_SPARK_TRANSFORM = {"year": "years", "month": "months", "day": "days", "hour": "hours"}


def declared_columns(schema: Mapping[str, Any], where: str) -> list[tuple[str, str, bool]]:
    """(name, iceberg type, required) from ``columns`` as a list of dicts or a name -> type mapping.

    Raises:
        SchemaDeclarationError: a declared column is malformed (names ``where``).
    """
    raw = schema.get("columns") or []
    if isinstance(raw, Mapping):
        return [(n, str(t), False) for n, t in raw.items()]
    out = []
    for i, col in enumerate(raw):
        if not isinstance(col, Mapping) or "name" not in col or "type" not in col:
            raise SchemaDeclarationError(f"{where}: schema.columns[{i}] needs 'name' and 'type'")
        out.append((str(col["name"]), str(col["type"]), bool(col.get("required", False))))
    return out


def partition_clause(spec: Sequence[Any], columns: set[str], where: str) -> str:
    parts = []
    for i, item in enumerate(spec or []):
        if isinstance(item, Mapping):
            text = f"{item.get('transform', 'identity')}({item.get('column') or item.get('source')})"
        else:
            text = str(item) if "(" in str(item) else f"identity({item})"
        m = _TRANSFORM.match(text.replace(" ", ""))
        if not m or m.group(4) not in columns:
            raise SchemaDeclarationError(f"{where}: schema.partition_spec[{i}] {item!r} is not a transform "
                                         "(identity/year/month/day/hour/bucket[N]/truncate[W]) of a declared column")
        kind, column = m.group(1), f"`{m.group(4)}`"
        if kind == "identity":
            parts.append(column)
        elif kind.startswith("bucket"):
            parts.append(f"bucket({m.group(2)}, {column})")
        elif kind.startswith("truncate"):
            parts.append(f"truncate({m.group(3)}, {column})")
        else:
            parts.append(f"{_SPARK_TRANSFORM.get(kind, kind)}({column})")
    return f"PARTITIONED BY ({', '.join(parts)})" if parts else ""


def check_declared(schema: Mapping[str, Any], table: str, key_columns: Sequence[str] = ()) -> None:
    """A declared schema checked as :func:`create_table` reads it (columns, their types, the identifier columns
    among them, the partition spec), without a catalog: the config checks it when it loads, so a typo fails
    ``icecdc sync`` before a run instead of the first batch that creates the table.

    Raises:
        SchemaDeclarationError: the first thing :func:`create_table` would refuse, naming the table and column.
    """
    where = f"table {table}"
    columns = declared_columns(schema, where)
    for name, iceberg_type, _ in columns:
        spark_ddl(iceberg_type, f"{where} column {name}")
    names = {c[0] for c in columns}
    _check_keys(key_columns, names, where)
    partition_clause(schema.get("partition_spec") or (), names, where)


def _check_keys(key_columns: Sequence[str], names: set[str], where: str) -> None:
    missing = [k for k in key_columns if k not in names]
    if missing:
        raise SchemaDeclarationError(f"{where}: identifier columns {missing} are not in the schema")


def create_table(spark: Any, catalog_name: str, table: str, columns: Sequence[tuple[str, str, bool]],
                 key_columns: Sequence[str] = (), partition_spec: Sequence[Any] = (),
                 properties: Mapping[str, Any] | None = None) -> None:
    """CREATE TABLE IF NOT EXISTS (a concurrent creator wins harmlessly), then set identifier fields.

    Raises:
        SchemaDeclarationError: a column type, partition transform or property is invalid.
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the catalog refuses the CREATE TABLE (passes
            through).
    """
    where = f"table {table}"
    names = {c[0] for c in columns}
    _check_keys(key_columns, names, where)
    cols = ", ".join(f"`{n}` {spark_ddl(t, f'{where} column {n}')}"
                     f"{' NOT NULL' if required or n in key_columns else ''}" for n, t, required in columns)
    props = {**DEFAULT_PROPERTIES, **{str(k): str(v) for k, v in (properties or {}).items()}}
    tblprops = ", ".join(f"'{k}'='{v}'" for k, v in props.items())
    spark.sql(f"CREATE TABLE IF NOT EXISTS {catalog_name}.{table} ({cols}) USING iceberg "
              f"{partition_clause(partition_spec, names, where)} TBLPROPERTIES ({tblprops})")
    if key_columns:
        set_identifier_fields(spark, f"{catalog_name}.{table}", key_columns)


def _namespace(spark: Any, table_or_namespace: str, is_table: bool) -> Any:
    parse = spark._jvm.org.apache.iceberg.catalog.TableIdentifier.parse
    return parse(table_or_namespace).namespace() if is_table else parse(f"{table_or_namespace}.t").namespace()


def namespace_exists(spark: Any, catalog_name: str, namespace: str) -> bool:
    """Whether the catalog holds ``namespace`` (asked through Spark's catalog, no table read).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the catalog cannot be asked (passes through);
            nothing of its own.
    """
    return bool(spark_catalog(spark, catalog_name).namespaceExists(_namespace(spark, namespace, False)))


def ensure_namespace(spark: Any, catalog_name: str, table: str) -> None:
    """Create the namespace of ``table`` when missing (a routed target on a fresh catalog).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the catalog refuses to create the namespace for
            another reason than that it exists already (a concurrent creation is not an error).
    """
    namespace = _namespace(spark, table, True)
    catalog = spark_catalog(spark, catalog_name)
    if namespace.isEmpty() or catalog.namespaceExists(namespace):
        return
    try:
        catalog.createNamespace(namespace)
    except Exception as exc:  # noqa: BLE001 - a concurrent creator won
        if not catalog.namespaceExists(namespace):
            raise exc


def widen_columns(spark: Any, catalog_name: str, table: str, changes: Mapping[str, tuple[Any, Any]]) -> list[str]:
    """Promote columns (old Spark type, new Spark type); returns ``"name: old -> new"`` per change.

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Iceberg refuses a type change (one it cannot
            widen); nothing of its own.
    """
    done = []
    for name, (old, new) in changes.items():
        spark.sql(f"ALTER TABLE {catalog_name}.{table} ALTER COLUMN `{name.replace('`', '``')}` "
                  f"TYPE {new.simpleString()}")
        done.append(f"{name}: {old.simpleString()} -> {new.simpleString()}")
    return done


def add_columns(spark: Any, catalog_name: str, table: str, columns: Mapping[str, str]) -> list[str]:
    """Add optional columns; one that a concurrent writer added meanwhile is fine.

    Raises:
        SchemaDeclarationError: a declared type is not valid Spark DDL.
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Iceberg refuses the ALTER TABLE (no such table,
            a name taken).
    """
    added = []
    for name, iceberg_type in columns.items():
        existing = {f.name for f in spark.table(f"{catalog_name}.{table}").schema.fields}
        if name in existing:
            continue
        try:
            spark.sql(f"ALTER TABLE {catalog_name}.{table} ADD COLUMN `{name}` "
                      f"{spark_ddl(iceberg_type, f'table {table} column {name}')}")
            added.append(name)
        except Exception as exc:  # noqa: BLE001 - concurrent add of the same column
            if "already exists" not in str(exc):
                raise
    return added
