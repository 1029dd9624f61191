"""Which source schema changes an index version follows in place, and which need a new version.

Every index version records the source schema its documents were written with, as a map of
Iceberg field ids to names and types (nested fields by their dotted path; list elements and map
keys/values by their own ids). Iceberg identifies a column by its field id, so comparing ids
tells a rename (same id, new name) from a drop plus an add (a new id), which comparing names
cannot. Pure functions, no I/O.

- In place: a new field (a mapping addition; documents written before it simply lack it), a
  column reorder, int -> long and a wider decimal of the same scale (the mapping and the JSON of
  every value stay the same).
- New version (zero-downtime reindex): a renamed field (documents carry the old name), a dropped
  field (documents still carry it), and every other type change (float -> double renders values
  differently; a mapped field's type cannot change in OpenSearch).
"""

from dataclasses import dataclass, field

from pyiceberg import types as it
from pyiceberg.schema import Schema, index_by_id, index_name_by_id

FieldMap = dict[str, dict[str, str]]  # str(field id) -> {"name": dotted path, "field": own name, "type": type}


def _type_label(field_type: it.IcebergType) -> str:
    """A primitive's full type; only the kind of a nested type (its fields are compared by id)."""
    if isinstance(field_type, it.StructType):
        return "struct"
    if isinstance(field_type, it.ListType):
        return "list"
    if isinstance(field_type, it.MapType):
        return "map"
    return str(field_type)


def field_map(schema: Schema) -> FieldMap:
    """The field id -> name/type map an index version records (JSON-ready: ids as strings)."""
    names = index_name_by_id(schema)
    return {str(fid): {"name": names[fid], "field": f.name, "type": _type_label(f.field_type)}
            for fid, f in sorted(index_by_id(schema).items())}


def _parse_decimal(label: str) -> tuple[int, int] | None:
    if not label.startswith("decimal(") or not label.endswith(")"):
        return None
    precision, scale = label[len("decimal("):-1].split(",")
    return int(precision), int(scale)


def same_documents(old: str, new: str) -> bool:
    """Whether values of type ``old`` read as ``new`` keep their JSON and their mapping."""
    if old == new or (old, new) == ("int", "long"):
        return True
    before, after = _parse_decimal(old), _parse_decimal(new)
    return before is not None and after is not None and before[1] == after[1] and after[0] >= before[0]


@dataclass(frozen=True)
class SchemaChange:
    """How the source schema moved from what a version recorded: what forces a new version
    (``reindex``), what the version takes in place (``in_place``)."""

    reindex: list[str] = field(default_factory=list)
    in_place: list[str] = field(default_factory=list)

    @property
    def needs_reindex(self) -> bool:
        return bool(self.reindex)

    def describe(self) -> str:
        return "; ".join(self.reindex)


def compare(recorded: FieldMap, current: FieldMap) -> SchemaChange:
    """Field by field id: renames, drops and type changes the documents cannot take need a reindex."""
    reindex: list[str] = []
    in_place: list[str] = []
    for fid, was in recorded.items():
        now = current.get(fid)
        if now is None:
            reindex.append(f"column {was['name']} (field id {fid}) was dropped; documents still carry it")
            continue
        if now.get("field") != was.get("field"):  # a field's own name (a parent's rename is the parent's)
            reindex.append(f"column {was['name']} (field id {fid}) was renamed to {now['name']}")
        if now["type"] != was["type"]:
            change = f"column {now['name']} (field id {fid}) changed type {was['type']} -> {now['type']}"
            (in_place if same_documents(was["type"], now["type"]) else reindex).append(change)
    in_place += [f"column {now['name']} (field id {fid}) was added" for fid, now in current.items()
                 if fid not in recorded]
    return SchemaChange(reindex, in_place)
