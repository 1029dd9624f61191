"""The CLI end to end: ``icecdc demo`` builds and syncs the demo lake; ``icecdc status`` shows
where the sink stands; after a new commit ``icecdc sync`` applies it and status catches up."""

import re

from icecdc_dagster.cli import main
from icecdc_dagster.demo import workload


def _status(capsys, config, home) -> str:
    capsys.readouterr()
    assert main(["status", "--config", str(config), "--dagster-home", str(home)]) == 0
    return capsys.readouterr().out


def test_demo_then_status_then_sync(spark, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    directory = tmp_path / "demo"
    assert main(["demo", "--dir", str(directory)]) == 0
    out = capsys.readouterr().out
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
    assert ingested.startswith("ingested customers: 45 rows (10 gold, columns ") and ingested.endswith("dead letters: 1")
    assert {"id", "name", "tier", "email"} == set(re.search(r"columns ([^)]*)\)", ingested).group(1).split(", "))

    config, home = directory / "icecdc.yaml", directory / "dagster_home"
    status = _status(capsys, config, home)
    current = re.search(r"demo.orders: current snapshot (\d+)", status).group(1)
    assert f"checkpoint {current}, 0 snapshots pending" in status
    assert "ingest customers_cdc" in status and "2 landing files, 0 not yet ingested" in status

    spark.sql(f"DELETE FROM demo.{workload.SOURCE_TABLE} WHERE order_id <= 5")
    status = _status(capsys, config, home)
    assert "1 snapshots pending" in status and "1 not yet applied" in status

    assert main(["sync", "--config", str(config), "--dagster-home", str(home)]) == 0
    assert "demo.orders: 1/1 runs succeeded; ok" in capsys.readouterr().out
    status = _status(capsys, config, home)
    newest = re.search(r"demo.orders: current snapshot (\d+)", status).group(1)
    assert newest != current and f"checkpoint {newest}, 0 snapshots pending" in status
    replica = spark.table(f"demo.{workload.REPLICA_TABLE}")
    assert replica.count() == 1095 and replica.where("order_id <= 5").count() == 0
