"""Document ids never collide (composite keys are escaped), and ``iceberg_operation`` is the row's change.

Expected ids are written by hand from the rule in ``changelog/events.py``.
"""

from opensearchpy import OpenSearch
from pyspark.sql import types as T

from icecdc_dagster import changelog
from icecdc_dagster.batch import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from icecdc_dagster.sinks.opensearch import OpenSearchSink, OpenSearchSinkSettings
from tests.sinks.test_opensearch_e2e import batch_of
from tests.sinks.test_opensearch_support import all_documents

CHANGE_FIELDS = [T.StructField("_change_type", T.StringType()), T.StructField("_commit_snapshot_id", T.LongType()),
                 T.StructField("_commit_sequence_number", T.LongType()),
                 T.StructField("_change_ordinal", T.IntegerType())]
# (first part, second part) -> the id the documented rule gives
COMPOSITE_IDS = {
    ("a|b", "c"): r"a\|b|c",
    ("a", "b|c"): r"a|b\|c",
    ("a\\", "|c"): r"a\\|\|c",
    ("a\\|", "c"): r"a\\\||c",
    ("plain", "x"): "plain|x",
}


def test_composite_ids_are_escaped_and_distinct_single_ids_unchanged(spark):
    fields = [T.StructField("the.k", T.StringType()), T.StructField("the k2", T.StringType()),
              T.StructField("v", T.IntegerType())]
    rows = [(a, b, i, INSERT, 5, 1, 0) for i, (a, b) in enumerate(COMPOSITE_IDS)]
    rows.append((None, "n", 99, INSERT, 5, 1, 0))
    frame = spark.createDataFrame(rows, T.StructType([*fields, *CHANGE_FIELDS]))
    events = changelog.to_events(frame, "db.t", ["the.k", "the k2"], "append", 5, use_row_id=False).collect()
    got = {(e["the.k"], e["the k2"]): e["document_id"] for e in events}
    assert got == {**COMPOSITE_IDS, (None, "n"): r"\N|n"}
    # A single identifier column keeps its canonical string as is (no escaping): "b|c" stays "b|c".
    single = changelog.to_events(frame.where("v < 99"), "db.t", ["the.k"], "append", 5, use_row_id=False)
    single_ids = {e["v"]: e["document_id"] for e in single.collect()}
    assert single_ids == {0: "a|b", 1: "a", 2: "a\\", 3: "a\\|", 4: "plain"}


def test_iceberg_operation_is_the_change_and_snapshot_operation_is_kept(spark):
    fields = [T.StructField("id", T.IntegerType()), T.StructField("v", T.StringType())]
    rows = [(1, "old", UPDATE_BEFORE, 7, 3, 0), (1, "new", UPDATE_AFTER, 7, 3, 0), (2, "x", DELETE, 7, 3, 0),
            (3, "y", INSERT, 7, 3, 0)]
    frame = spark.createDataFrame(rows, T.StructType([*fields, *CHANGE_FIELDS]))
    events = changelog.to_events(frame, "db.t", ["id"], "overwrite", 7, use_row_id=False).collect()
    assert sorted((e["id"], e["iceberg_operation"], e["iceberg_snapshot_operation"], e["bulk_action"])
                  for e in events) == [(1, "UPDATE_AFTER", "overwrite", "INDEX"), (2, "DELETE", "overwrite", "DELETE"),
                                       (3, "INSERT", "overwrite", "INDEX")]


def test_events_of_a_net_range_name_the_snapshot_that_produced_each_row(spark):
    fields = [T.StructField("id", T.IntegerType()), T.StructField("v", T.StringType())]
    rows = [(1, "a", INSERT, 11, 1, 0), (2, "b", INSERT, 12, 2, 1), (3, "c", DELETE, 13, 3, 2)]
    frame = spark.createDataFrame(rows, T.StructType([*fields, *CHANGE_FIELDS]))
    events = changelog.to_events(frame, "db.t", ["id"], "overwrite", 13, use_row_id=False).collect()
    assert sorted((e["id"], e["iceberg_snapshot_id"]) for e in events) == [(1, 11), (2, 12), (3, 13)]


def test_colliding_composite_keys_are_separate_documents_end_to_end(spark, catalog, catalog_settings,
                                                                     opensearch_url):
    name, key = "db.pairs", ("left part", "right_part")
    fq = f"{catalog_settings.name}.{name}"
    spark.sql(f"CREATE TABLE {fq} (`left part` string NOT NULL, `right_part` string NOT NULL, qty int) USING iceberg "
              "TBLPROPERTIES ('format-version'='2', 'write.update.mode'='merge-on-read', "
              "'write.delete.mode'='merge-on-read')")
    values = ", ".join(f"('{a.replace(chr(92), chr(92) * 2)}', '{b.replace(chr(92), chr(92) * 2)}', {i})"
                       for i, (a, b) in enumerate(COMPOSITE_IDS))
    spark.sql(f"INSERT INTO {fq} VALUES {values}")
    settings = OpenSearchSinkSettings(hosts=(opensearch_url,), index="pairs", include_iceberg_metadata=True)

    def sync(export: bool) -> None:
        table = catalog.load_table(name)
        info, events, _ = batch_of(spark, catalog_settings.name, table, table.current_snapshot().snapshot_id,
                                   export=export, name=name, key=key)
        assert not OpenSearchSink(settings, table.schema()).apply(info, events).skipped
        events.unpersist()

    sync(export=True)
    docs = all_documents(opensearch_url, "pairs")
    assert {i: (d["left part"], d["right_part"], d["qty"]) for i, d in docs.items()} == {
        doc_id: (a, b, n) for n, ((a, b), doc_id) in enumerate(COMPOSITE_IDS.items())}
    assert {(d["iceberg_operation"], d["iceberg_snapshot_operation"]) for d in docs.values()} == {(INSERT, "append")}

    spark.sql(f"UPDATE {fq} SET qty = 100 WHERE `left part` = 'a|b'")
    sync(export=False)
    spark.sql(f"DELETE FROM {fq} WHERE `left part` = 'a' AND `right_part` = 'b|c'")
    sync(export=False)
    docs = all_documents(opensearch_url, "pairs")
    assert {i: (d["qty"], d["iceberg_operation"], d["iceberg_snapshot_operation"]) for i, d in docs.items()} == {
        r"a\|b|c": (100, UPDATE_AFTER, "overwrite"), r"a\\|\|c": (2, INSERT, "append"),
        r"a\\\||c": (3, INSERT, "append"), "plain|x": (4, INSERT, "append")}
    client = OpenSearch(hosts=[opensearch_url])
    assert client.count(index="pairs")["count"] == 4
