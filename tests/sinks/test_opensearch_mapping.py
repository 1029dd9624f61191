"""Pure parts of the OpenSearch sink: type mapping, mapping evolution, settings, bulk item outcomes."""

import pickle

import pytest
from pyiceberg import types as it
from pyiceberg.schema import Schema

from icecdc_dagster.errors import ConfigError
from icecdc_dagster.sinks.opensearch import OpenSearchSinkSettings, iceberg_schema_to_mapping
from icecdc_dagster.sinks.opensearch import actions as a
from icecdc_dagster.sinks.opensearch.mapping import missing_properties


def field(i, name, t):
    return it.NestedField(i, name, t, required=False)


def test_every_iceberg_type_maps_as_the_issue_specifies():
    schema = Schema(
        field(1, "b", it.BooleanType()), field(2, "i", it.IntegerType()), field(3, "l", it.LongType()),
        field(4, "f", it.FloatType()), field(5, "d", it.DoubleType()), field(6, "s", it.StringType()),
        field(7, "u", it.UUIDType()), field(8, "dt", it.DateType()), field(9, "ts", it.TimestampType()),
        field(10, "tz", it.TimestamptzType()), field(11, "dec", it.DecimalType(38, 10)),
        field(12, "bin", it.BinaryType()), field(13, "fx", it.FixedType(16)),
        field(14, "st", it.StructType(field(20, "x", it.IntegerType()),
                                      field(21, "inner", it.StructType(field(22, "y", it.DecimalType(5, 1)))))),
        field(15, "ls", it.ListType(23, it.TimestamptzType(), element_required=False)),
        field(16, "lst", it.ListType(24, it.StructType(field(25, "z", it.StringType())), element_required=False)),
        field(17, "m", it.MapType(26, it.StringType(), 27, it.LongType(), value_required=False)),
    )
    props = iceberg_schema_to_mapping(schema)["properties"]
    types = {name: spec.get("type") for name, spec in props.items()}
    assert types == {"b": "boolean", "i": "long", "l": "long", "f": "double", "d": "double", "s": "text",
                     "u": "text", "dt": "date", "ts": "date", "tz": "date", "dec": "keyword", "bin": "binary",
                     "fx": "binary", "st": None, "ls": "date", "lst": None, "m": "object"}
    for text in ("s", "u"):
        assert props[text]["fields"]["keyword"]["type"] == "keyword"
    assert all("strict_date_optional_time" in props[k]["format"] for k in ("dt", "ts", "tz", "ls"))
    assert props["st"]["properties"]["inner"]["properties"]["y"] == {"type": "keyword"}
    assert props["lst"]["properties"]["z"]["type"] == "text"
    assert props["m"]["dynamic"] is True
    with_meta = iceberg_schema_to_mapping(schema, include_iceberg_metadata=True)["properties"]
    assert with_meta["iceberg_snapshot_id"] == {"type": "long"}
    assert with_meta["iceberg_table_name"] == {"type": "keyword"}
    assert with_meta["iceberg_operation"] == with_meta["iceberg_snapshot_operation"] == {"type": "keyword"}


def test_missing_properties_adds_new_fields_and_never_changes_existing_ones():
    current = {"properties": {"id": {"type": "keyword"}, "s": {"properties": {"a": {"type": "long"}}}}}
    wanted = {"properties": {"id": {"type": "long"}, "new": {"type": "double"},
                             "s": {"properties": {"a": {"type": "double"}, "b": {"type": "boolean"}}}}}
    assert missing_properties(wanted, current) == {"new": {"type": "double"},
                                                   "s": {"properties": {"b": {"type": "boolean"}}}}
    assert missing_properties(current, current) == {}


def test_settings_hide_the_password_survive_pickling_and_validate():
    s = OpenSearchSinkSettings(hosts=["https://h:9200"], index="orders", username="u", password="s3cret!")
    assert "s3cret" not in repr(s) and "s3cret" not in str(s)
    assert s.hosts == ("https://h:9200",)
    copy = pickle.loads(pickle.dumps(s))
    assert copy == s and copy.password == "s3cret!"
    for bad in ({"index": "Orders"}, {"index": "_x"}, {"chunk_size": 0}, {"refresh": "sometimes"},
                {"hosts": ()}, {"password": "p"}, {"parallelism": 0},
                {"mapping": {"properties": {}}, "template_name": "t"}):
        kwargs = {"hosts": ("http://h",), "index": "orders", **bad}
        with pytest.raises(ConfigError, match="opensearch sink for index"):
            OpenSearchSinkSettings(**kwargs)


@pytest.mark.parametrize("ok,item,outcome", [
    (True, {"index": {"_id": "1", "status": 201, "result": "created"}}, a.INDEXED),
    (True, {"delete": {"_id": "1", "status": 200, "result": "deleted"}}, a.DELETED),
    (False, {"delete": {"_id": "1", "status": 404, "result": "not_found"}}, a.DELETE_NOT_FOUND),
    (False, {"index": {"_id": "1", "status": 409,
                       "error": {"type": "version_conflict_engine_exception", "reason": "v"}}}, a.VERSION_CONFLICT),
    (False, {"index": {"_id": "1", "status": 409, "error": {"type": "other_conflict", "reason": "x"}}}, a.FAILED),
    (False, {"index": {"_id": "1", "status": 400, "error": {"type": "mapper_parsing_exception"}}}, a.FAILED),
    (False, {"delete": {"_id": "1", "status": 404, "error": {"type": "index_not_found_exception"}}}, a.FAILED),
    (False, {"index": {"_id": "1", "status": 429, "error": {"type": "es_rejected_execution_exception"}}}, a.RETRY),
    (False, {"index": {"_id": "1", "status": 503, "error": {"type": "unavailable_shards_exception"}}}, a.RETRY),
])
def test_bulk_item_outcomes(ok, item, outcome):
    assert a.classify(ok, item)[0] == outcome


def test_bulk_actions_carry_external_versions_and_refuse_keyless_deletes():
    assert a.bulk_action("ix", "k|1", "INDEX", 7, '{"a":1}') == {
        "_op_type": "index", "_index": "ix", "_id": "k|1", "_version": 7, "_version_type": "external",
        "_source": '{"a":1}'}
    assert a.bulk_action("ix", "k", "DELETE", 8, None) == {
        "_op_type": "delete", "_index": "ix", "_id": "k", "_version": 8, "_version_type": "external"}
    with pytest.raises(a.MissingDocumentIdError, match="DELETE event without document_id for index ix"):
        a.bulk_action("ix", None, "DELETE", 8, None)
    with pytest.raises(ValueError, match="document 'k' of index ix has no _commit_sequence_number"):
        a.bulk_action("ix", "k", "INDEX", None, "{}")
    with pytest.raises(ValueError, match="unknown bulk_action 'UPSERT'"):
        a.bulk_action("ix", "k", "UPSERT", 8, None)
