"""Landing files as an input plugin (``input: {landing: {...}}``): the same contract as the broker inputs (read a
bounded batch, commit, acknowledge), the entry-level spelling still valid and equal to it."""

import json

import pytest

from icecdc_dagster.config import IngestConfig
from icecdc_dagster.inputs.registry import open_input
from icecdc_dagster.steps.ingest_entry import ingest_settings, ingest_stream_batch


def test_both_spellings_are_one_landing_input():
    from pydantic import ValidationError

    old = IngestConfig.model_validate({"name": "c", "target": "db.c", "landing": "/l", "files_per_batch": 2,
                                       "max_file_age": "P1D", "take_expired_files": True})
    new = IngestConfig.model_validate({"name": "c", "target": "db.c", "input": {"landing": {
        "path": "/l", "files_per_batch": 2, "max_file_age": "P1D", "take_expired_files": True}}})
    assert ingest_settings(old) == ingest_settings(new)
    assert old.input is None and new.input is None                 # no broker: the landing asset's partitions
    assert old.landing_input == new.landing_input and new.any_input.describe() == "landing files in /l"
    assert new.source == old.source == "/l" and new.landing_path == "/l"
    with pytest.raises(ValidationError, match="with input.landing, set files_per_batch under input.landing"):
        IngestConfig.model_validate({"name": "c", "target": "db.c", "files_per_batch": 2,
                                     "input": {"landing": {"path": "/l"}}})
    with pytest.raises(ValidationError, match="exactly one of 'landing'"):
        IngestConfig.model_validate({"name": "c", "target": "db.c", "landing": "/l",
                                     "input": {"landing": {"path": "/l"}}})


def test_landing_input_reads_commits_and_acknowledges_bounded_batches(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    landing.mkdir()
    for i in range(3):
        (landing / f"{i:03d}.json").write_text(json.dumps({"payload": {
            "op": "c", "after": {"id": i, "v": f"v{i}"}, "source": {"table": "t"}}}) + "\n")
    entry = IngestConfig.model_validate({"name": "l", "target": "db.landed", "identifier_columns": ["id"],
                                         "auto_create": True,
                                         "input": {"landing": {"path": str(landing), "files_per_batch": 2}}})
    with open_input(entry.any_input) as reader:
        assert reader.lag().waiting == 3 and reader.next_position() == "000.json"
        first = ingest_stream_batch(spark, cat, entry, reader)
        assert [m.position.rsplit("/", 1)[-1] for m in first.batch.messages] == ["000.json", "001.json"]
        assert first.result.batch_id == first.batch.batch_id and first.lag_after.waiting == 1
        second = ingest_stream_batch(spark, cat, entry, reader)
        assert second.result.targets["db.landed"].counts["inserted"] == 1 and second.lag_after.waiting == 0
        idle = ingest_stream_batch(spark, cat, entry, reader)
        assert idle.result is None and reader.next_position() is None
    assert {r.id: r.v for r in spark.table(f"{cat}.db.landed").collect()} == {0: "v0", 1: "v1", 2: "v2"}
