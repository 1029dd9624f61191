"""Follow a source table's schema by Iceberg field id, never by name.

Iceberg names a column by its field id: a rename keeps the id, a drop + add of the same name makes a
new one. A table that follows a source (the replica, the changelog store) records which of its field
ids holds which source field id (table property ``icecdc.source-field-ids``, nested fields included),
and evolves with Iceberg schema updates: rename, delete (or keep as a tombstone), widen, add, move.

Tables written by earlier versions have no recorded mapping: it is inferred once, by name, against the
source's schema history (newest first), so a column renamed in the source before the upgrade is
still recognised. Two columns that claim one source field (what matching by name left behind after a
rename) are a conflict the caller decides about.
"""

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.column_names import column
from icecdc_dagster.errors import SchemaChangeError

if TYPE_CHECKING:
    from pyspark.sql import Column

FIELD_MAP_PROPERTY = "icecdc.source-field-ids"
DROPPED_SUFFIX = "__dropped_"  # a changelog store keeps a dropped source column as <name>__dropped_<id>
Op = tuple[str, tuple[Any, ...]]  # one call on a Java UpdateSchema: method name, arguments


@dataclass(frozen=True)
class Located:
    """A field with its Iceberg full name parts and the id of the field that contains it."""

    path: tuple[str, ...]
    field: NestedField
    parent_id: int | None
    named: bool  # a struct field (renamable); False for list elements and map keys/values

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


def children(field_type: IcebergType) -> list[NestedField]:
    if isinstance(field_type, StructType):
        return list(field_type.fields)
    if isinstance(field_type, ListType):
        return [field_type.element_field]
    if isinstance(field_type, MapType):
        return [field_type.key_field, field_type.value_field]
    return []


def fields_by_id(schema: Schema | StructType) -> dict[int, Located]:
    """Every field by id (depth first, parents before children, in schema order).

    Raises:
        Nothing of its own: it walks a schema in memory.
    """
    found: dict[int, Located] = {}

    def visit(fields: Iterable[NestedField], path: tuple[str, ...], parent: int | None, named: bool) -> None:
        for f in fields:
            here = (*path, f.name)
            found[f.field_id] = Located(here, f, parent, named)
            visit(children(f.field_type), here, f.field_id, isinstance(f.field_type, StructType))

    visit(schema.fields, (), None, True)
    return found


def schema_of(spark: Any, jschema: Any) -> Schema:
    """A Java ``org.apache.iceberg.Schema`` as a pyiceberg ``Schema`` (ids, names, types, nesting).

    Raises:
        py4j.protocol.Py4JJavaError: the Java schema cannot be rendered as JSON (passes through).
    """
    return Schema.model_validate_json(str(spark._jvm.org.apache.iceberg.SchemaParser.toJson(jschema)))


def java_type(spark: Any, nested: NestedField) -> Any:
    """The Java Iceberg type of a pyiceberg field (ids are reassigned by ``addColumn``)."""
    parsed = spark._jvm.org.apache.iceberg.SchemaParser.fromJson(Schema(nested).model_dump_json(by_alias=True))
    return parsed.columns().get(0).type()


class SourceSchemas:
    """A source table's schemas as pyiceberg schemas, converted on demand (its whole history only when a
    mapping must be inferred)."""

    def __init__(self, spark: Any, jsource: Any) -> None:
        self.spark, self.jsource = spark, jsource
        self._history: list[Schema] | None = None

    def of(self, schema_id: int | None) -> Schema:
        """The schema ``schema_id`` (None or no longer in the metadata: the current one)."""
        wanted = self.jsource.schemas().get(schema_id) if schema_id is not None else None
        return schema_of(self.spark, wanted if wanted is not None else self.jsource.schema())

    @property
    def current(self) -> Schema:
        return self.of(None)

    @property
    def history(self) -> list[Schema]:
        """Every schema of the table, newest first."""
        if self._history is None:
            self._history = sorted((schema_of(self.spark, s) for s in self.jsource.schemas().values()),
                                   key=lambda s: -s.schema_id)
        return self._history


def load_mapping(jtable: Any) -> dict[int, int] | None:
    """Target field id -> source field id, as recorded on the table (None: never recorded).

    Raises:
        json.JSONDecodeError: the table property holds no JSON (edited by hand); nothing of its own.
    """
    raw = jtable.properties().get(FIELD_MAP_PROPERTY)
    if raw is None:
        return None
    return {int(t): int(s) for t, s in json.loads(str(raw)).items()}


def encode_mapping(mapping: dict[int, int]) -> str:
    """A target -> source field-id mapping as the compact JSON the table property holds.

    Raises:
        Nothing of its own: it renders a mapping as JSON.
    """
    return json.dumps({str(t): s for t, s in sorted(mapping.items())}, separators=(",", ":"))


@dataclass
class Inferred:
    mapping: dict[int, int]
    conflicts: list[tuple[str, str, int]] = field(default_factory=list)  # (stale column, current column, source id)


def infer_mapping(target: Schema, schemas: Sequence[Schema], only: Iterable[int] | None = None) -> Inferred:
    """Match a table written before ids were recorded: by name path, against ``schemas`` (the wanted source
    schema first, then its history newest first). ``only``: target field ids to consider (None: all).

    A column carrying a current name wins its source field; an older column that another one already
    claims is a conflict (a rename followed by name, leaving a stale column next to the new one).

    Raises:
        Nothing of its own: it matches schemas in memory (a field it cannot match is left out).
    """
    by_path: dict[tuple[str, ...], int] = {}
    for schema in schemas:
        for sid, loc in fields_by_id(schema).items():
            by_path.setdefault(loc.path, sid)
    current = {loc.path for loc in fields_by_id(schemas[0]).values()} if schemas else set()
    allowed = set(only) if only is not None else None
    located = [loc for tid, loc in fields_by_id(target).items() if allowed is None or tid in allowed]
    located.sort(key=lambda loc: (loc.path not in current, len(loc.path)))
    result = Inferred({})
    owner: dict[int, str] = {}
    for loc in located:
        claimed = by_path.get(loc.path)
        if claimed is None:
            continue
        if claimed in owner:
            result.conflicts.append((loc.dotted, owner[claimed], claimed))
            continue
        owner[claimed] = loc.dotted
        result.mapping[loc.field.field_id] = claimed
    return result


def align_by_name(target: Schema | StructType, source: Schema | StructType) -> dict[int, int]:
    """Target id -> source id for fields at the same name path (a table just created from ``source``).

    Raises:
        Nothing of its own: it compares two schemas in memory.
    """
    by_path = {loc.path: sid for sid, loc in fields_by_id(source).items()}
    return {tid: by_path[loc.path] for tid, loc in fields_by_id(target).items() if loc.path in by_path}


@dataclass
class Evolution:
    mapping: dict[int, int]
    changes: list[str] = field(default_factory=list)  # what was done, for the batch's metadata
    added: list[str] = field(default_factory=list)    # top-level columns added


class _Follower:
    """One pass of Iceberg schema updates that makes ``jtable`` follow ``source`` (see :func:`follow`)."""

    def __init__(self, spark: Any, jtable: Any, source: Schema, mapping: dict[int, int], drop: bool,
                 describe: Callable[[str], str]) -> None:
        self.spark, self.source, self.drop, self.describe = spark, source, drop, describe
        self.tx = jtable.newTransaction()
        self.sindex = fields_by_id(source)
        self.evolution = Evolution(dict(mapping))
        self.dirty = False
        self._refresh()

    def _refresh(self) -> None:
        self.target = schema_of(self.spark, self.tx.table().schema())
        self.tindex = fields_by_id(self.target)
        self.evolution.mapping = {t: s for t, s in self.evolution.mapping.items() if t in self.tindex}
        self.inverse = {s: t for t, s in self.evolution.mapping.items()}

    def _mapped(self, sid: int | None) -> Located | None:
        tid = self.inverse.get(sid) if sid is not None else None
        return self.tindex.get(tid) if tid is not None else None

    def dropped(self) -> None:
        """Source fields gone: deleted from a replica; a store renames them aside (old batches hold data)."""
        gone = {t for t, s in self.evolution.mapping.items() if s not in self.sindex}
        top = [self.tindex[t] for t in gone if self.tindex[t].parent_id not in gone]
        if not self.drop:
            top = [loc for loc in top if DROPPED_SUFFIX not in loc.field.name]
        ops: list[Op] = []
        for loc in top:
            sid = self.evolution.mapping[loc.field.field_id]
            if self.drop:
                ops.append(("deleteColumn", (loc.dotted,)))
            else:
                aside = f"{loc.field.name}{DROPPED_SUFFIX}{sid}"
                ops.append(("renameColumn", (loc.dotted, aside)))
                if loc.field.required:
                    ops.append(("makeColumnOptional", (loc.dotted,)))
            self.evolution.changes.append(f"{'dropped' if self.drop else 'kept aside'} {loc.dotted}")
        self._commit(ops)

    def _commit(self, ops: "list[Op]") -> None:
        """One schema update of ``ops`` in the transaction (none when there is nothing to change)."""
        if not ops:
            return
        update = self.tx.updateSchema()
        for op in ops:
            update = getattr(update, op[0])(*op[1])
        update.commit()
        self.dirty = True
        self._refresh()

    def changed(self) -> None:
        """Renames, widenings and required -> optional of fields both sides hold."""
        ops: list[Op] = []
        for sid, sloc in self.sindex.items():
            tloc = self._mapped(sid)
            if tloc is None:
                continue
            want, have = sloc.field.field_type, tloc.field.field_type
            if want.is_primitive != have.is_primitive or (not want.is_primitive and type(want) is not type(have)):
                raise SchemaChangeError(self.describe(f"column {sloc.dotted} changed from {have} to {want}"))
            if want.is_primitive and want != have:
                if not self._promotable(tloc.field, sloc.field):
                    raise SchemaChangeError(self.describe(f"column {sloc.dotted} is {want} in the source but "
                                                         f"{have} in the target, which cannot be changed to it"))
                wider = java_type(self.spark, sloc.field)
                ops.append(("updateColumn", (tloc.dotted, wider)))
                self.evolution.changes.append(f"widened {tloc.dotted} {have} -> {want}")
            if tloc.field.required and not sloc.field.required:
                ops.append(("makeColumnOptional", (tloc.dotted,)))
            if tloc.named and tloc.field.name != sloc.field.name:
                ops.append(("renameColumn", (tloc.dotted, sloc.field.name)))
                self.evolution.changes.append(f"renamed {tloc.dotted} -> {sloc.field.name}")
        self._commit(ops)

    def _promotable(self, have: NestedField, want: NestedField) -> bool:
        types = self.spark._jvm.org.apache.iceberg.types.TypeUtil
        return bool(types.isPromotionAllowed(java_type(self.spark, have).asPrimitiveType(),
                                             java_type(self.spark, want).asPrimitiveType()))

    def added(self) -> None:
        """Source fields the target lacks, added in place (a whole new struct comes with its fields)."""
        ops: list[Op] = []
        pending = []
        for sid, sloc in self.sindex.items():
            if sid in self.inverse or (sloc.parent_id is not None and sloc.parent_id not in self.inverse):
                continue
            parent = self._mapped(sloc.parent_id)
            if sloc.parent_id is not None and parent is None:
                continue
            siblings = children(parent.field.field_type) if parent is not None else self.target.fields
            same = next((f for f in siblings if f.name == sloc.field.name
                         and f.field_id not in self.evolution.mapping), None)
            if same is not None:  # left by an interrupted evolution or a by-name version: adopt it
                self.evolution.mapping[same.field_id] = sid
                self.inverse[sid] = same.field_id
                continue
            ops.append(("addColumn", (parent.dotted if parent is not None else None, sloc.field.name,
                                       java_type(self.spark, sloc.field), sloc.field.doc)))
            pending.append(sid)
            self.evolution.changes.append(f"added {sloc.dotted}")
            if parent is None:
                self.evolution.added.append(sloc.field.name)
        self._commit(ops)
        for sid in pending:  # the new field and everything inside it, by name under its parent
            sloc = self.sindex[sid]
            parent = self._mapped(sloc.parent_id)
            siblings = children(parent.field.field_type) if parent is not None else self.target.fields
            new = next(f for f in siblings if f.name == sloc.field.name and f.field_id not in self.evolution.mapping)
            self.evolution.mapping.update(align_by_name(StructType(new), StructType(sloc.field)))
        self._refresh()

    def ordered(self) -> None:
        """The target's fields in the source's order, at every struct level (unmapped ones stay after)."""
        ops: list[Op] = []
        levels = [(list(self.source.fields), list(self.target.fields))]
        for sid, sloc in self.sindex.items():
            tloc = self._mapped(sid)
            if tloc is not None and isinstance(sloc.field.field_type, StructType):
                levels.append((list(sloc.field.field_type.fields), children(tloc.field.field_type)))
        for wanted, present in levels:
            mapped = [self.inverse[f.field_id] for f in wanted if f.field_id in self.inverse]
            actual = [f.field_id for f in present if f.field_id in set(mapped)]
            if mapped == actual or not mapped:
                continue
            names = [self.tindex[t].dotted for t in mapped]
            ops.append(("moveFirst", (names[0],)))
            for before, name in zip(names, names[1:], strict=False):
                ops.append(("moveAfter", (name, before)))
            self.evolution.changes.append(f"reordered {', '.join(names)}")
        self._commit(ops)

    def commit(self, recorded: dict[int, int] | None) -> Evolution:
        if recorded != self.evolution.mapping:
            self.tx.updateProperties().set(FIELD_MAP_PROPERTY, encode_mapping(self.evolution.mapping)).commit()
            self.dirty = True
        if self.dirty:  # nothing to change: no new metadata version
            self.tx.commitTransaction()
        return self.evolution


def follow_source_schema(spark: Any, jtable: Any, source: Schema, mapping: dict[int, int],
                         recorded: dict[int, int] | None, drop: bool, describe: Callable[[str], str]) -> Evolution:
    """Make ``jtable`` follow ``source`` by field id in one Iceberg transaction (schema + recorded mapping).

    ``mapping``: target id -> source id to start from; ``recorded``: what the table records (None: nothing,
    the mapping is saved). ``drop``: delete fields the source dropped (a replica) or keep them under a
    tombstone name (the changelog store, whose older batches still hold their values). A change that
    cannot be followed (a narrowed type, a field that changed kind) raises :class:`SchemaChangeError` with
    ``describe(cause)`` and leaves the table untouched.

    Raises:
        SchemaChangeError: a source change the target cannot follow in place (a narrowed type,
            two columns for one field), naming the column and the ``icecdc resync`` command.
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Iceberg refuses the schema update or its commit
        (passes through).
    """
    follower = _Follower(spark, jtable, source, mapping, drop, describe)
    follower.dropped()
    follower.changed()
    follower.added()
    follower.ordered()
    return follower.commit(recorded)


# --- rows: present Spark columns of one schema as another, by field id -------------------------------

def spark_type(field_type: IcebergType) -> Any:
    """The Spark type Iceberg reads an Iceberg type as."""
    simple = {BooleanType: T.BooleanType, IntegerType: T.IntegerType, LongType: T.LongType, FloatType: T.FloatType,
              DoubleType: T.DoubleType, DateType: T.DateType, TimestampType: T.TimestampNTZType,
              TimestamptzType: T.TimestampType, StringType: T.StringType, UUIDType: T.StringType,
              BinaryType: T.BinaryType, FixedType: T.BinaryType}
    for kind, spark_kind in simple.items():
        if isinstance(field_type, kind):
            return spark_kind()
    if isinstance(field_type, DecimalType):
        return T.DecimalType(field_type.precision, field_type.scale)
    if isinstance(field_type, StructType):
        return T.StructType([T.StructField(f.name, spark_type(f.field_type), not f.required)
                             for f in field_type.fields])
    if isinstance(field_type, ListType):
        return T.ArrayType(spark_type(field_type.element_type), not field_type.element_required)
    if isinstance(field_type, MapType):
        return T.MapType(spark_type(field_type.key_type), spark_type(field_type.value_type),
                         not field_type.value_required)
    raise SchemaChangeError(f"Iceberg type {field_type} has no Spark type to follow it with")


def _same(want: IcebergType, have: IcebergType, have_of: dict[int, int]) -> bool:
    """Rows of ``have`` already read as ``want`` (same ids in the same places, names and types)."""
    if want.is_primitive or have.is_primitive:
        return want == have
    wanted, present = children(want), children(have)
    return (type(want) is type(have) and len(wanted) == len(present)
            and all(have_of.get(w.field_id) == h.field_id and w.name == h.name and _same(w.field_type, h.field_type,
                                                                                         have_of)
                    for w, h in zip(wanted, present, strict=True)))


def convert(value: "Column", want: IcebergType, have: IcebergType, have_of: dict[int, int]) -> "Column":
    """``value`` (of type ``have``) as type ``want``: struct fields matched by id, renamed, widened;
    fields ``have`` lacks are null."""
    if _same(want, have, have_of):
        return value
    if want.is_primitive:
        return value.cast(spark_type(want))
    if isinstance(want, ListType) and isinstance(have, ListType):
        return F.transform(value, lambda e: convert(e, want.element_type, have.element_type, have_of))
    if isinstance(want, MapType) and isinstance(have, MapType):
        keyed = F.transform_keys(value, lambda k, _: convert(k, want.key_type, have.key_type, have_of))
        return F.transform_values(keyed, lambda _, v: convert(v, want.value_type, have.value_type, have_of))
    if not isinstance(want, StructType) or not isinstance(have, StructType):
        raise SchemaChangeError(f"a {have} column cannot be read as {want}")
    present = {f.field_id: f for f in have.fields}
    parts = []
    for w in want.fields:
        h = present.get(have_of.get(w.field_id, -1))
        part = (F.lit(None).cast(spark_type(w.field_type)) if h is None
                else convert(value.getField(h.name), w.field_type, h.field_type, have_of))
        parts.append(part.alias(w.name))
    return F.when(value.isNull(), F.lit(None).cast(spark_type(want))).otherwise(F.struct(*parts))


def columns_by_field_id(want: Sequence[NestedField], have: Schema, have_of: dict[int, int],
               missing_as_null: bool = True) -> list["Column"]:
    """Top-level columns of ``have``-shaped rows presented as the fields ``want``, matched by field id
    (``have_of``: want id -> have id). A field ``have`` lacks is null, or left out (``missing_as_null``).

    Raises:
        SchemaChangeError: a field's type cannot be converted to the wanted one (names the column).
    """
    present = {f.field_id: f for f in have.fields}
    columns = []
    for w in want:
        h = present.get(have_of.get(w.field_id, -1))
        if h is None:
            if missing_as_null:
                columns.append(F.lit(None).cast(spark_type(w.field_type)).alias(w.name))
            continue
        columns.append(convert(column(h.name), w.field_type, h.field_type, have_of).alias(w.name))
    return columns
