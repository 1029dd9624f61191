"""Routed targets on a fresh catalog: the template's namespace does not exist yet (issue 10 #4)."""

import json

from icecdc_dagster.ingest import IngestSettings, committed_batches, ingest_files, pending_files
from tests.helpers import BOTH_CATALOGS


@BOTH_CATALOGS
def test_routing_template_creates_its_namespace(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    assert ("lake",) not in catalog.list_namespaces()
    landing = tmp_path / "landing"
    landing.mkdir()
    events = [json.dumps({"payload": {"op": "c", "after": {"id": i, "v": f"x{i}"},
                                      "source": {"schema": "inv", "table": t}}}) for i, t in ((1, "a"), (2, "b"))]
    (landing / "001.json").write_text("\n".join(events + ["{broken"]) + "\n")
    settings = IngestSettings(landing=str(landing), target="lake.{source.schema}_{source.table}",
                              identifier_columns=("id",), auto_create=True)
    assert committed_batches(spark, cat, settings) == set()          # a missing namespace is an empty ledger
    files = pending_files(spark, cat, settings)
    result = ingest_files(spark, cat, catalog, settings, files)
    assert ("lake",) in catalog.list_namespaces()
    assert {r.id: r.v for r in spark.table(f"{cat}.lake.inv_a").collect()} == {1: "x1"}
    assert {r.id: r.v for r in spark.table(f"{cat}.lake.inv_b").collect()} == {2: "x2"}
    # a dead letter names its file and line (the third)
    assert [(r.raw, r.source_file, r.source_offset) for r in spark.table(f"{cat}.lake.unrouted__dead_letters").collect()
            ] == [("{broken", files[0], 3)]
    assert committed_batches(spark, cat, settings) == {result.batch_id}
    assert pending_files(spark, cat, settings) == []
