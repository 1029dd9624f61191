"""At-least-once input through the real ingestion: a re-delivered run of events never loses a delete (issue 10 #3)."""

import json

from icecdc_dagster.ingest import IngestSettings, ingest_files, pending_files


def _event(op, key, name=None):
    image = {"id": key, "name": name}
    return json.dumps({"payload": {"op": op, "before": image if op == "d" else None,
                                   "after": None if op == "d" else image, "source": {"table": "customers"}}})


def test_redelivered_sequence_keeps_the_delete(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "001.json").write_text("\n".join([_event("c", 110, "a"), _event("c", 111, "b")]) + "\n")
    # c 111 and u 110 were delivered before (the consumer restarted from an older offset), then u 111, d 111
    (landing / "002.json").write_text("\n".join([_event("c", 111, "b"), _event("u", 110, "a2"),
                                                 _event("u", 111, "b2"), _event("d", 111)]) + "\n")
    settings = IngestSettings(landing=str(landing), target="db.customers", identifier_columns=("id",),
                              auto_create=True)
    results = [ingest_files(spark, cat, catalog, settings, [f]) for f in pending_files(spark, cat, settings)]
    assert {r.id: r.name for r in spark.table(f"{cat}.db.customers").collect()} == {110: "a2"}
    assert results[1].targets["db.customers"].counts["deleted"] == 1
    assert results[1].targets["db.customers"].counts["updated"] == 1
