"""Matching by field id without Spark: a table written by an earlier version is matched by name once,
through the source's schema history; two columns for one source field are a conflict, not a guess."""

from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType, StructType

from icecdc_dagster.writer.field_ids import align_by_name, fields_by_id, infer_mapping


def _schema(schema_id, *fields):
    return Schema(*fields, schema_id=schema_id)


OLD = _schema(0, NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()),
              NestedField(3, "info", StructType(NestedField(4, "a", IntegerType()))))
RENAMED = _schema(1, NestedField(1, "id", LongType(), required=True), NestedField(2, "full_name", StringType()),
                  NestedField(3, "info", StructType(NestedField(4, "alpha", IntegerType()))))


def test_a_rename_before_the_upgrade_is_matched_through_history():
    replica = _schema(0, NestedField(11, "id", LongType(), required=True), NestedField(12, "name", StringType()),
                      NestedField(13, "info", StructType(NestedField(14, "a", IntegerType()))))
    inferred = infer_mapping(replica, [RENAMED, RENAMED, OLD])
    assert inferred.mapping == {11: 1, 12: 2, 13: 3, 14: 4} and inferred.conflicts == []


def test_two_columns_for_one_field_are_a_conflict_the_current_name_wins():
    replica = _schema(0, NestedField(11, "id", LongType(), required=True), NestedField(12, "name", StringType()),
                      NestedField(15, "full_name", StringType()))
    inferred = infer_mapping(replica, [RENAMED, OLD])
    assert inferred.mapping == {11: 1, 15: 2}
    assert inferred.conflicts == [("name", "full_name", 2)]


def test_align_by_name_maps_nested_fields_and_index_names_them():
    created = _schema(0, NestedField(21, "id", LongType(), required=True), NestedField(22, "full_name", StringType()),
                      NestedField(23, "info", StructType(NestedField(24, "alpha", IntegerType()))))
    assert align_by_name(created, RENAMED) == {21: 1, 22: 2, 23: 3, 24: 4}
    assert fields_by_id(RENAMED)[4].dotted == "info.alpha" and fields_by_id(RENAMED)[4].parent_id == 3
