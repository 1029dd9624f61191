"""The CLI end to end: ``icecdc demo`` builds and syncs the demo lake; ``icecdc status`` shows
where the sink stands; after a new commit ``icecdc sync`` applies it and status catches up."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from icecdc_dagster.cli import main
from icecdc_dagster.demo import workload
from icecdc_dagster.demo.opensearch import INDEX, config_header, demo_cluster
from tests.helpers import CAPTION, live_frames, run_on_terminal


def _status(capsys, config, home) -> str:
    capsys.readouterr()
    assert main(["status", "--config", str(config), "--dagster-home", str(home)]) == 0
    return capsys.readouterr().out


@pytest.mark.long
def test_demo_then_status_then_sync(spark, tmp_path, monkeypatch, capsys, opensearch_url):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    directory = tmp_path / "demo"
    (directory / "dagster_home").mkdir(parents=True)
    (directory / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # an older demo's
    # The index in a cluster that outlives the demo (its own server would stop with it: see below).
    assert main(["demo", "--dir", str(directory), "--opensearch-url", opensearch_url]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert f"OpenSearch index {INDEX}: 1100 documents, source rows: 1100, index matches source: True" in out
    # Quiet by default: Dagster's console log at INFO (our one line per step), no DEBUG events.
    assert " - DEBUG - " not in captured.err and " - INFO - " in captured.err
    hint = out.strip().splitlines()[-1].split()   # the closing hint runs as printed
    assert hint[-3:] == ["dev", "-m", "icecdc_dagster.definitions"] and Path(hint[-4]).name == "dagster"
    assert Path(hint[-4]).exists()
    assert "replica matches source: True" in out
    assert "source rows: 1100, replica rows: 1100" in out
    # demo.orders: one export line plus one line per committed change (the compaction is an empty
    # "replace" batch); then the ingested customers table: one export.
    orders_part = out.split(f"\n{workload.SOURCE_TABLE}\n", 1)[1].split(f"\n{workload.CUSTOMERS_TABLE}\n", 1)[0]
    batch_lines = [line for line in orders_part.splitlines()
                   if re.match(r"\s*\d{6,}\s+(append|overwrite|delete|replace)", line)]
    assert len(batch_lines) == 1 + len(workload.CHANGES)
    assert "export" in batch_lines[0] and "replace" in batch_lines[-1]
    # The Debezium stream: 50 snapshot rows, 10 upgraded to gold with a new email column, 5 deleted,
    # one event with a bad key in the dead-letter table.
    ingested = next(line for line in out.splitlines() if line.startswith("ingested customers:"))
    assert ingested.startswith("ingested customers: 45 rows (10 gold, columns ")
    assert ingested.endswith("dead letters: 1")
    assert {"id", "name", "tier", "email"} == set(re.search(r"columns ([^)]*)\)", ingested).group(1).split(", "))

    config, home = directory / "icecdc.yaml", directory / "dagster_home"
    _assert_production_instance(home)
    status = _status(capsys, config, home)
    current = re.search(r"demo.orders: current snapshot (\d+)", status).group(1)
    assert f"checkpoint {current}, 0 snapshots pending" in status
    document = json.loads(_status_without_spark(tmp_path, config, home))  # the same, for scripts
    (orders,) = [t for t in document["tables"] if t["table_name"] == "demo.orders"]
    assert orders["current_snapshot_id"] == current and orders["unapplied_partitions"] == 0
    assert {s["checkpoint_snapshot_id"] for s in orders["sinks"]} == {current}   # strings: ids exceed 2^53
    assert [(s["target"], s["lag_s"]) for s in orders["sinks"]] == [(workload.REPLICA_TABLE, 0.0),
                                                                     (f"index {INDEX} -> {INDEX}_v1", 0.0)]
    assert [i["name"] for i in document["ingest"]] == ["customers_cdc"]
    assert "ingest customers_cdc" in status and "2 landing files, 0 not yet ingested" in status
    monkeypatch.delenv("DAGSTER_HOME")                                 # the pipeline file names the instance
    assert main(["status", "--config", str(config)]) == 0
    assert capsys.readouterr().out == status and not (directory / ".dagster_home").exists()

    spark.sql(f"DELETE FROM demo.{workload.SOURCE_TABLE} WHERE order_id <= 5")
    status = _status(capsys, config, home)
    assert "1 snapshot pending, lag " in status and "1 not yet applied" in status

    called = time.monotonic()
    assert main(["sync", "--config", str(config), "--dagster-home", str(home), "-v"]) == 0
    call_s = time.monotonic() - called
    captured = capsys.readouterr()
    assert "demo.orders: 1/1 runs succeeded; ok" in captured.out
    # one line per batch; the total counts from this command's call, not from the test process's start
    assert re.search(r"^demo.orders: batch \d+ applied in \d+\.\ds, 5 change events; batches 1 done / 0 pending$",
                     captured.out, re.M), captured.out                   # the DELETE of orders 1-5
    total = float(re.search(r"^sync finished in (\d+\.\d)s", captured.out, re.M).group(1))
    assert total <= call_s + 0.05
    assert " - DEBUG - " in captured.err and "STEP_START" in captured.err   # -v: Dagster's events too
    status = _status(capsys, config, home)
    newest = re.search(r"demo.orders: current snapshot (\d+)", status).group(1)
    assert newest != current and f"checkpoint {newest}, 0 snapshots pending" in status
    replica = spark.table(f"demo.{workload.REPLICA_TABLE}")
    assert replica.count() == 1095 and replica.where("order_id <= 5").count() == 0


def test_the_demo_starts_its_own_opensearch_and_says_what_becomes_of_the_index():
    """Without --opensearch-url the demo's index lives in a server the demo starts and stops: reachable while
    the demo runs, gone after it, and the demo (and its pipeline file) say so."""
    import urllib.request

    with demo_cluster(None) as cluster:
        assert cluster.url and "it stopped with the demo, and the index with it" in cluster.fate
        with urllib.request.urlopen(cluster.url, timeout=10) as answer:     # an OpenSearch-compatible cluster
            assert "version" in json.loads(answer.read())
        assert config_header(cluster).startswith("# Written by `icecdc demo`: the OpenSearch index demo-orders")
    with pytest.raises(OSError):
        urllib.request.urlopen(cluster.url, timeout=5)
    with demo_cluster("http://search:9200") as named:
        assert named.url == "http://search:9200" and "stays in http://search:9200" in named.fate


def _status_without_spark(tmp_path, config, home) -> str:
    """``icecdc status --json`` as a user runs it, with a JAVA_HOME whose java only leaves a mark: the status
    comes from metadata and the instance, and no SparkSession (no JVM) is started for it."""
    java = tmp_path / "no_jvm" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\ntouch {tmp_path / 'jvm_started'}\nexit 1\n")
    java.chmod(0o755)
    env = {**os.environ, "JAVA_HOME": str(java.parent.parent), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "icecdc_dagster.cli", "status", "--config", str(config),
                           "--dagster-home", str(home), "--json"], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and not (tmp_path / "jvm_started").exists(), done.stderr[-3000:]
    return done.stdout


def _assert_production_instance(home):
    """The demo's instance runs with production's crash-safety settings, also over an older demo's file."""
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.run_launcher).__name__ == "MonitoredRunLauncher"
        assert instance.run_monitoring_enabled and instance.run_monitoring_max_resume_run_attempts == 0
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
        assert limits == [{"key": key, "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
                          for key in ("icecdc/table", ".dagster/icecdc/line")]
    assert "enabled: false" in (home / "dagster.yaml").read_text()      # telemetry still off


def test_status_without_an_instance_refuses_and_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    config = tmp_path / "p.yaml"
    config.write_text("tables: []\n")
    assert main(["status", "--config", str(config)]) == 2
    error = capsys.readouterr().err
    assert "InstanceNotFoundError: no Dagster instance at" in error and "Set DAGSTER_HOME" in error
    assert "dagster_home: <directory>" in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]     # no .dagster_home, nothing else
    empty = tmp_path / "elsewhere"
    assert main(["status", "--config", str(config), "--dagster-home", str(empty)]) == 2
    assert "--dagster-home" in capsys.readouterr().err and not empty.exists()


def test_help_is_plain_text_and_config_may_come_from_the_environment(tmp_path, monkeypatch, capsys):
    import pytest

    monkeypatch.delenv("ICECDC_CONFIG", raising=False)
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "``" not in top and "icecdc: run the demo" in top
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    usage = capsys.readouterr().out
    assert "[--config CONFIG]" in usage                                # optional: $ICECDC_CONFIG works too
    with pytest.raises(SystemExit) as exited:
        main(["status"])
    assert exited.value.code == 2 and "pass --config FILE or set ICECDC_CONFIG" in capsys.readouterr().err
    config = tmp_path / "p.yaml"
    config.write_text("tables: []\n")
    monkeypatch.setenv("ICECDC_CONFIG", str(config))
    assert main(["validate"]) == 0 and "ok (0 tables" in capsys.readouterr().out


HOLD_LINE = """
import sys, time
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.line_lock import LineLock
assert LineLock(sys.argv[1], sys.argv[2]).try_acquire(Holder.current(role="another writer"))
print("locked", flush=True)
time.sleep(600)
"""


def test_sync_exits_75_naming_the_holder_of_a_busy_line(spark, catalog_settings, catalog, tmp_path, monkeypatch,
                                                       capsys):
    import signal
    import socket
    import subprocess
    import sys

    from tests.helpers import write_pipeline

    spark.sql(f"CREATE TABLE {catalog_settings.name}.db.items (id BIGINT NOT NULL, v STRING) USING iceberg")
    spark.sql(f"INSERT INTO {catalog_settings.name}.db.items VALUES (1, 'a'), (2, 'b')")
    config = write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.items", "identifier_columns": ["id"], "sinks": [{"iceberg": {"table_name": "db.copy"}}]}])
    home = tmp_path / "home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LINE, str(home), "db.items"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["sync", "--config", str(config)]) == 75
        out = capsys.readouterr().out
        assert (f"db.items: 0/0 runs succeeded; BUSY: db.items is being written by another writer on "
                f"{socket.gethostname()} pid {holder.pid}, holding it since ") in out
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert "run_monitoring:" in (home / "dagster.yaml").read_text()   # written for a new DAGSTER_HOME
    assert main(["sync", "--config", str(config)]) == 0                # the dead holder left no lock
    assert "db.items: 1/1 runs succeeded; ok" in capsys.readouterr().out


SYNC = "import sys; from icecdc_dagster.cli import main; sys.exit(main(sys.argv[1:]))"


def _sync_process_env(home):
    import os

    return {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(Path(__file__).parent.parent),
            "TERM": "xterm-256color", "COLUMNS": "160"}


@pytest.mark.long
def test_sync_shows_every_line_from_the_start_with_batches_records_and_elapsed(spark, catalog_settings, catalog,
                                                                                tmp_path):
    """Elsewhere than a terminal (a pipe, a CI log): plain lines, every configured line's plan before any
    batch, each batch's records from the snapshot summaries, each line's elapsed time, and a total that
    counts from the process start. On a terminal: rich's live table, one row per line, the same counts."""
    import subprocess
    import sys

    from tests.helpers import write_pipeline

    for name, values in (("items", "(1, 'a'), (2, 'b')"), ("other", "(1, 'x')")):
        spark.sql(f"CREATE TABLE {catalog_settings.name}.db.{name} (id BIGINT NOT NULL, v STRING) USING iceberg")
        spark.sql(f"INSERT INTO {catalog_settings.name}.db.{name} VALUES {values}")
    config = write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.items", "identifier_columns": ["id"], "max_snapshots_per_run": 1,
         "sinks": [{"iceberg": {"table_name": "db.copy"}}]},
        {"table_name": "db.other", "identifier_columns": ["id"], "sinks": [{"iceberg": {"table_name": "db.copy2"}}]}])
    home = tmp_path / "home"
    argv = [sys.executable, "-c", SYNC, "sync", "--config", str(config)]

    done = subprocess.run(argv, env=_sync_process_env(home), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "\x1b[" not in out and " - DEBUG - " not in out + done.stderr
    first_batch = out.index("db.items: export")
    for line in ("db.items", "db.other"):          # both lines, before any batch runs, with their export
        assert out.index(f"{line}: waiting, batches 0 done / 1 pending, 0 change events, elapsed 0.0s") < first_batch
    assert re.search(r"^db\.items: export, batches 0 done / 1 pending, 0 change events, elapsed \d+\.\ds$", out, re.M)
    assert re.search(r"^db\.other: export, batches 0 done / 1 pending, 0 change events, elapsed \d+\.\ds$", out, re.M)
    assert re.search(r"^db\.items: batch \d+ applied in \d+\.\ds, 2 change events; batches 1 done / 0 pending$",
                     out, re.M)
    assert re.search(r"^db\.other: done; 1 batch, 1 change events applied, \d+\.\ds$", out, re.M)
    ended = dict(re.findall(r"^(db\.\w+): done, batches 1 done / 0 pending, \d+ change events, elapsed (\d+\.\d)s$",
                            out, re.M))
    assert set(ended) == {"db.items", "db.other"}
    total = float(re.search(r"^sync finished in (\d+\.\d)s", out, re.M).group(1))
    # The total counts from the process start: it covers both lines (one after the other) and more;
    # each figure is rounded to 0.1 s.
    assert total + 0.05 * (len(ended) + 1) >= sum(float(s) for s in ended.values())
    assert total > sum(float(s) for s in ended.values()) - 0.15
    assert spark.table(f"{catalog_settings.name}.db.copy").count() == 2

    # On a terminal: the live table (cursor hidden while it runs, shown again at the end), a frame per
    # event: db.other shows, waiting with nothing pending, before db.items' first batch; db.items counts
    # its two snapshots (one per batch) down; the last frame has both lines done.
    spark.sql(f"INSERT INTO {catalog_settings.name}.db.items VALUES (3, 'c')")
    spark.sql(f"DELETE FROM {catalog_settings.name}.db.items WHERE id = 1")
    code, shown, _ = run_on_terminal(argv, _sync_process_env(home))
    (tmp_path / "terminal.txt").write_text(shown)  # to read when an assertion below fails
    assert code == 0, shown
    assert "\x1b[?25l" in shown and "\x1b[?25h" in shown                 # the live display ran
    frames, outside = live_frames(shown)   # each frame erased whole before the next; nothing written inside one
    batches = [i for i, frame in enumerate(frames) if re.search(r"db\.items\s+applying snapshot", frame)]
    first = re.search(r"db\.items\s+applying snapshot (\d+)\s+0\s+2\s+0\s+\d+\.\ds", frames[batches[0]])
    assert first, frames[batches[0]]
    assert re.search(r"db\.other\s+waiting\s+0\s+0\s+0\s+0\.0s", frames[batches[0]]), frames[batches[0]]
    # the second batch: one done, one pending, the first batch's change event (its INSERT) counted
    second = next(re.search(r"db\.items\s+applying snapshot (\d+)\s+1\s+1\s+1\s+\d+\.\ds", frames[i])
                  for i in batches if " 1 " in frames[i] and first.group(1) not in frames[i])
    assert second and second.group(1) != first.group(1), frames[batches[-1]]
    assert re.search(r"db\.items\s+done\s+2\s+0\s+2\s+\d+\.\ds", frames[-1]), frames[-1]   # INSERT + DELETE
    assert re.search(r"db\.other\s+done\s+0\s+0\s+0\s+\d+\.\ds", frames[-1]), frames[-1]
    # While the batches keep the process busy, frames keep coming (4 a second of the caption's clock).
    captions = [float(CAPTION.search(frames[i]).group(1)) for i in batches]
    assert len(captions) >= 2 * (captions[-1] - captions[0]), captions
    # Dagster's log lines went above the table (never into it: live_frames), the report and the counts after.
    assert any(" - INFO - " in line for line in outside), outside[:20]
    assert "db.items: 2/2 runs succeeded; ok" in outside and any(t.startswith("sync finished in") for t in outside)
    assert any(line.startswith("db.items: done; 2 batches, 2 change events applied") for line in outside), outside
    assert not any(re.match(r"db\.items: batch \d+ applied", line) for line in outside)  # the table, not lines
    assert " - DEBUG - " not in shown
    assert spark.table(f"{catalog_settings.name}.db.copy").count() == 2


@pytest.mark.slow
def test_demo_takes_its_customers_from_nats_with_the_same_result(spark, tmp_path, monkeypatch, capsys):
    """``icecdc demo --input nats``: the customers events from a JetStream subject, the same table as from files."""
    import asyncio
    import uuid

    import nats

    stream = f"ICECDC_DEMO_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("ICECDC_DEMO_NATS_STREAM", stream)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    try:
        assert main(["demo", "--dir", str(tmp_path / "demo"), "--input", "nats"]) == 0
        out = capsys.readouterr().out
        assert f"published 67 Debezium events to JetStream {stream}" in out
        ingested = next(line for line in out.splitlines() if line.startswith("ingested customers:"))
        assert ingested.startswith("ingested customers: 45 rows (10 gold, columns ")
        assert ingested.endswith("dead letters: 1")
    finally:
        async def delete() -> None:
            nc = await nats.connect("nats://127.0.0.1:4222")
            await nc.jetstream().delete_stream(stream)
            await nc.close()

        asyncio.run(delete())
