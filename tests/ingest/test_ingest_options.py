"""Declared-schema auto-create (partition transforms), missing target, no evolution, key-less append."""

import json

import pytest

from icecdc_dagster.errors import TargetTableMissingError
from icecdc_dagster.ingest import IngestSettings, ingest_files, pending_files


def _write(tmp_path, name, events):
    landing = tmp_path / "landing"
    landing.mkdir(exist_ok=True)
    (landing / name).write_text("\n".join(e if isinstance(e, str) else json.dumps(e) for e in events) + "\n")
    return str(landing)


def test_declared_schema_and_no_evolution(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    events = [{"op": "c", "after": {"id": i, "ts": f"2024-03-0{1 + i % 3}T10:00:00Z", "code": f"abcdef{i}",
                                    "qty": str(i), "surprise": True}} for i in range(6)]
    events.append({"op": "c", "after": {"id": 9, "ts": "not a time", "code": "x", "qty": 1}})
    events.append({"op": "u", "after": {"id": 10, "ts": None, "code": "y", "qty": 2}})
    landing = _write(tmp_path, "a.json", events)
    schema = {"columns": [{"name": "id", "type": "long", "required": True},
                          {"name": "ts", "type": "timestamptz", "required": True},
                          {"name": "code", "type": "string"}, {"name": "qty", "type": "int"}],
              "partition_spec": [{"column": "ts", "transform": "day"}, "bucket[16](id)", "truncate[4](code)"],
              "table_properties": {"format-version": "2", "write.merge.mode": "copy-on-write"}}
    missing = IngestSettings(landing=landing, target="db.t", identifier_columns=("id",))
    with pytest.raises(TargetTableMissingError, match="db.t"):
        ingest_files(spark, cat, catalog, missing, pending_files(spark, cat, missing))
    settings = IngestSettings(landing=landing, target="db.t", identifier_columns=("id",), auto_create=True,
                              schema=schema)
    result = ingest_files(spark, cat, catalog, settings, pending_files(spark, cat, settings))
    counts = result.targets["db.t"].counts
    assert counts["inserted"] == 6 and counts["ignored_fields"] == 6 and counts["dead_lettered"] == 2
    table = catalog.load_table("db.t")
    assert [str(f.transform) for f in table.spec().fields] == ["day", "bucket[16]", "truncate[4]"]
    assert table.properties["write.merge.mode"] == "copy-on-write"  # the declared property wins, ours stay
    assert table.properties["commit.manifest.min-count-to-merge"] == "8"
    assert "surprise" not in spark.table(f"{cat}.db.t").columns
    assert {r.id: r.qty for r in spark.table(f"{cat}.db.t").collect()} == {i: i for i in range(6)}
    dead = sorted(spark.table(f"{cat}.db.t__dead_letters").collect(), key=lambda r: r.reason)
    assert dead[0].reason.startswith("column ts") and dead[1].reason == "required column ts is null or missing"
    assert [(r.source_file.rsplit("/", 1)[-1], r.source_offset) for r in dead] == [("a.json", 7), ("a.json", 8)]


def test_keyless_append_dead_letters_deletes_and_records_empty_batches(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    _write(tmp_path, "1.json", [{"op": "c", "after": {"v": 1, "tags": ["a"]}},
                                {"op": "u", "after": {"v": 2, "tags": ["b"]}},
                                {"op": "d", "before": {"v": 1}}])
    landing = _write(tmp_path, "2.json", ["null", "null"])
    settings = IngestSettings(landing=landing, target="db.log", auto_create=True, schema_evolution=True)
    files = pending_files(spark, cat, settings)
    results = [ingest_files(spark, cat, catalog, settings, [f]) for f in files]
    assert results[0].targets["db.log"].counts["appended"] == 2
    assert sorted(r.v for r in spark.table(f"{cat}.db.log").collect()) == [1, 2]
    dead = spark.table(f"{cat}.db.log__dead_letters").collect()
    assert [r.reason for r in dead] == ["delete on a table without identifier columns (append only)"]
    assert results[1].tombstones == 2 and results[1].targets["db.log"].counts["appended"] == 0
    assert pending_files(spark, cat, settings) == []
