"""The ingest ledger is bounded by Spark's file-source rule (``max_file_age``), through real Spark and Iceberg:
entries of landing files older than the horizon are dropped; a file past the horizon that was never ingested
is counted, not ingested (and ingested with ``take_expired_files``); a re-delivered recent file is still
skipped, and a file taken past the horizon is not taken twice."""

import json
import os
import time

import pytest

from icecdc_dagster.ingest import IngestSettings, expired_files, ingest_files, pending_files
from icecdc_dagster.ingest.horizon import FILE_TIME_PROPERTY
from icecdc_dagster.ingest.ledger import expired_files_in_metadata
from icecdc_dagster.inputs.registry import open_input
from icecdc_dagster.writer import exactly_once
from icecdc_dagster.writer.exactly_once import java_table, ledger_dropped_upto, ledger_entries, table_properties

DAY = 86400
NOW = time.time()


def _land(landing, name, rows, age_days):
    """A landing file of upserts ``{id: name}``, modified ``age_days`` before NOW."""
    path = landing / name
    path.write_text("".join(json.dumps({"payload": {"op": "c", "before": None, "after": {"id": k, "name": v},
                                                    "source": {"table": "t"}}}) + "\n" for k, v in rows.items()))
    os.utime(path, (NOW - age_days * DAY, NOW - age_days * DAY))
    return str(path)


def _settings(landing, **extra):
    return IngestSettings(landing=str(landing), target="db.horizon", identifier_columns=("id",), auto_create=True,
                          **{"max_file_age_s": 3 * DAY, **extra})


def _ledger(spark, cat):
    return ledger_entries(table_properties(java_table(spark, f"{cat}.db.horizon")))


def _rows(spark, cat):
    return {r.id: r.name for r in spark.table(f"{cat}.db.horizon").collect()}


def test_the_ledger_stays_bounded_and_a_redelivered_recent_file_is_skipped(spark, catalog, catalog_settings,
                                                                            tmp_path, monkeypatch):
    """Seven daily files, a 2-day horizon, chunks of 2 entries: the ledger never holds more than the files
    within the horizon plus one sealed chunk, sealed chunks past the horizon are removed, and every file is
    still ingested exactly once."""
    monkeypatch.setattr(exactly_once, "LEDGER_CHUNK_ENTRIES", 2)
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    landing.mkdir()
    settings = _settings(landing, max_file_age_s=2 * DAY)
    sizes = []
    for day in range(7):
        _land(landing, f"{day:03d}.json", {day: f"v{day}"}, age_days=7 - day)
        assert [os.path.basename(f) for f in pending_files(spark, cat, settings)] == [f"{day:03d}.json"]
        result = ingest_files(spark, cat, catalog, settings, pending_files(spark, cat, settings))
        assert not result.skipped and not result.expired
        entries = _ledger(spark, cat)
        stamps = sorted(int(e[FILE_TIME_PROPERTY]) for e in entries)
        horizon = int((NOW - (7 - day) * DAY) * 1000) - 2 * DAY * 1000
        assert sum(s < horizon for s in stamps) <= 2        # at most one sealed chunk past the horizon
        sizes.append(len(entries))
    assert max(sizes) <= 5 and sizes[-1] < 7
    props = table_properties(java_table(spark, f"{cat}.db.horizon"))
    assert ledger_dropped_upto(props) is not None
    assert _rows(spark, cat) == {d: f"v{d}" for d in range(7)}
    # The newest file delivered again (same name, same bytes): recorded, so skipped; nothing is pending.
    redelivered = ingest_files(spark, cat, catalog, settings, [str(landing / "006.json")])
    assert redelivered.skipped and not redelivered.expired
    assert pending_files(spark, cat, settings) == [] and expired_files(spark, cat, settings) == []


def test_an_old_file_never_ingested_is_counted_and_taken_with_the_setting(spark, catalog, catalog_settings,
                                                                           tmp_path):
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    landing.mkdir()
    settings = _settings(landing)
    for f in [_land(landing, "010.json", {1: "a"}, 1), _land(landing, "011.json", {2: "b"}, 0)]:
        ingest_files(spark, cat, catalog, settings, [f])
    old = _land(landing, "001.json", {3: "late", 1: "stale"}, 10)   # lands late, modified 10 days ago
    assert pending_files(spark, cat, settings) == [] and expired_files(spark, cat, settings) == [old]
    assert expired_files_in_metadata(catalog, settings) == [old]      # icecdc status: the same, without Spark
    aside = ingest_files(spark, cat, catalog, settings, [old])        # its partition runs: counted, not written
    assert aside.skipped and aside.expired == (old,) and aside.totals()["expired_files"] == 1
    assert _rows(spark, cat) == {1: "a", 2: "b"}

    taking = _settings(landing, take_expired_files=True)
    assert pending_files(spark, cat, taking) == [old] and expired_files(spark, cat, taking) == []
    taken = ingest_files(spark, cat, catalog, taking, [old])
    assert not taken.skipped and taken.targets["db.horizon"].counts["inserted"] == 1
    assert _rows(spark, cat) == {1: "stale", 2: "b", 3: "late"}
    # The next batch drops its entry (past the horizon): the ledger no longer vouches for it, so the setting
    # does not take it a second time, and status does not count it as never ingested.
    ingest_files(spark, cat, catalog, taking, [_land(landing, "012.json", {4: "d"}, 0)])
    assert old not in [p for e in _ledger(spark, cat) for p in e["icecdc.batch-id"].split("#")]
    again = ingest_files(spark, cat, catalog, taking, [old])
    assert again.skipped and again.expired == (old,)
    assert pending_files(spark, cat, taking) == [] and expired_files(spark, cat, taking) == []
    assert expired_files_in_metadata(catalog, settings) == []         # past what the ledger dropped: not counted
    assert _rows(spark, cat) == {1: "stale", 2: "b", 3: "late", 4: "d"}


@pytest.mark.parametrize("age", ["P7D", "PT12H"])
def test_max_file_age_is_a_duration_per_ingest_entry(age):
    from icecdc_dagster.config.model import IngestConfig
    from icecdc_dagster.steps.ingest_entry import ingest_settings

    entry = IngestConfig(name="n", landing="/x", target="db.t", max_file_age=age)
    assert ingest_settings(entry).max_file_age_s == {"P7D": 7 * DAY, "PT12H": 12 * 3600}[age]
    assert IngestConfig(name="n", landing="/x", target="db.t").max_file_age_s == 7 * DAY


def test_stream_ledger_entries_carry_their_commit_time_and_are_pruned_by_the_horizon(spark, catalog,
                                                                                     catalog_settings, monkeypatch):
    """A stream batch has no file: its entries are stamped with the commit time and dropped, like a landing
    file's, once older than ``max_file_age`` before the newest; the newest position still skips re-deliveries."""
    from icecdc_dagster.config import IngestConfig
    from icecdc_dagster.ingest import horizon as horizon_module
    from icecdc_dagster.steps.ingest_entry import ingest_stream_batch
    from tests.ingest.brokers import REDIS_URL, publish_redis, redis_stream

    cat = catalog_settings.name
    day0 = 1_700_000_000_000
    with redis_stream() as key:
        entry = IngestConfig.model_validate({
            "name": "h", "target": "db.horizon", "identifier_columns": ["id"], "auto_create": True,
            "max_file_age": "P2D", "input": {"redis_stream": {"url": REDIS_URL, "key": key, "block": "PT0.1S"}}})
        stamps = []
        for day in (0, 1, 5):
            now = day0 + day * DAY * 1000
            monkeypatch.setattr(horizon_module, "now_ms", lambda now=now: now)
            publish_redis(key, [json.dumps({"payload": {"op": "c", "after": {"id": day, "name": f"d{day}"},
                                                        "source": {"table": "t"}}}).encode()])
            with open_input(entry.input) as reader:
                run = ingest_stream_batch(spark, cat, entry, reader)
            assert run.result is not None and not run.result.skipped
            stamps.append(now)
            entries = _ledger(spark, cat)
            assert [int(e[FILE_TIME_PROPERTY]) for e in entries] == [s for s in stamps if s >= now - 2 * DAY * 1000]
        props = table_properties(java_table(spark, f"{cat}.db.horizon"))
        assert ledger_dropped_upto(props) == day0 + DAY * 1000
        assert [e["icecdc.batch-id"] for e in _ledger(spark, cat)] == [run.result.batch_id]
        with open_input(entry.input) as reader:                      # nothing waits; the ledger still answers
            idle = ingest_stream_batch(spark, cat, entry, reader)
        assert idle.result is None and idle.lag_after.waiting == 0
        assert _rows(spark, cat) == {0: "d0", 1: "d1", 5: "d5"}
