"""Control-plane benchmark: one evaluation of a table's line (what every sensor tick and every
``icecdc sync`` step does) with 1,000 vs 100,000 already-synced snapshot partitions.

A real Dagster instance (SQLite storage, as ``dagster dev`` uses) holds N synced keys, each
materialised by the line's two assets (changelog + one sink); a real Iceberg table (pyiceberg, SQL
catalog, no Spark) has 5 snapshots: the last 2 synced keys are its first snapshots (older ones were
expired, as in production) and its 3 newest are new. We time ``sensors.snapshots.plan_window``
of ``lines.window.table_window`` (ours: the ancestry after the line's latest materialisations) and,
as the peer, the previous
planning that asked Dagster for the status of every known partition (``legacy_plan`` below,
measured at 1k and 10k only: at 100k it takes minutes). Landing-file lines use
``lines.line.pending_keys`` (walks the known keys back to the frontier): timed as ``walk_*``.
``icecdc status`` of the table (``status.table_status``: the table, its window, an aggregate count of
its partitions, its one sink's checkpoint - at the last synced snapshot - read from an osmem
OpenSearch clone) is timed as ``status_*``.

``icecdc status`` on the demo (``--demo DIR``, an ``icecdc demo --dir DIR``; without it the demo is built in
a temporary directory first, minutes of Spark): the whole command in this process once its imports are
warm (``status_demo_s``: definitions, instance, catalog and ledger metadata - no SparkSession), and as a
user runs it, a fresh interpreter (``status_demo_command_s`` wall, ``status_demo_command_cpu_s``).

Seeding 200k materialisations through ``report_runless_asset_event`` costs ~40 ms each here, so
the events are written in batches with the event log storage's own insert statement (the same
event rows that call writes, minus the copy in the run shard that cross-run asset queries never
read), then one real ``report_runless_asset_event`` per asset updates its asset row. A check
asserts the seeded keys count as done, for our planning and for the previous one.

Run: .venv/bin/python bench/control_plane.py [--big 100000]
"""

import argparse
import os
import tempfile
import time
import warnings

import pyarrow as pa
import yaml
from dagster import AssetKey, AssetMaterialization, DagsterInstance
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry
from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID
from osmem_server import OsmemServer
from pyiceberg.catalog.sql import SqlCatalog

from icecdc_dagster.assets.naming import table_line
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.lines import line as lines
from icecdc_dagster.lines.window import TableWindow, table_window
from icecdc_dagster.sensors.snapshots import plan_window
from icecdc_dagster.status import table_status
from icecdc_dagster.steps.ordering import KeyStatus, NextRun, plan_next_run

NEW_KEYS = 3


def materialization(asset: AssetKey, key: str) -> EventLogEntry:
    event = DagsterEvent(event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value, job_name=RUNLESS_JOB_NAME,
                         event_specific_data=StepMaterializationData(AssetMaterialization(asset, partition=key)))
    return EventLogEntry(error_info=None, level="debug", user_message="", run_id=RUNLESS_RUN_ID,
                         timestamp=time.time(), dagster_event=event)


def source_table(root: str):  # noqa: ANN201 - pyiceberg Table
    catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
    catalog.create_namespace("db")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    table = catalog.create_table("db.orders", schema=schema)
    for i in range(2 + NEW_KEYS):
        table.append(pa.table({"id": [i]}, schema=schema))
    return table


def pipeline(root: str, opensearch_url: str):  # noqa: ANN201 - (TableConfig, Definitions)
    """The table's pipeline: its changelog and one OpenSearch sink (two assets per partition)."""
    path = os.path.join(root, "pipeline.yaml")
    with open(path, "w") as out:
        yaml.safe_dump({"catalog": {"name": "bench", "uri": f"sqlite:///{root}/catalog.db",
                                    "warehouse": f"file://{root}/warehouse"},
                        "tables": [{"table_name": "db.orders", "identifier_columns": ["id"],
                                    "sinks": [{"opensearch": {"hosts": [opensearch_url], "index": "orders"}}]}]},
                       out)
    config = load_config(path)
    return config.tables[0], build_definitions(config)


def checkpoint_sink(opensearch_url: str, sink_name: str, snapshot_id: str) -> None:
    """The sink's checkpoint at the last synced snapshot, where its last batch leaves it (in the
    index's ``_meta``: ``sinks/opensearch/checkpoint.py``)."""
    from opensearchpy import OpenSearch

    client = OpenSearch(hosts=[opensearch_url])
    if not client.indices.exists(index="orders"):
        client.indices.create(index="orders")
    client.indices.put_mapping(index="orders", body={"_meta": {"icecdc": {"checkpoints": {sink_name: {
        "snapshot_id": snapshot_id, "sequence_number": "2", "table": "db.orders"}}}}})
    client.close()


def seed(instance: DagsterInstance, line: lines.Line, synced: int, real_ids: list[str] | None = None) -> list[str]:
    """``synced`` keys done in every asset of the line, the last ones ``real_ids[:-NEW_KEYS]``;
    returns ``NEW_KEYS`` new keys (not added)."""
    real_ids = real_ids or []
    synthetic = [str(7_000_000_000_000_000_000 + i * 7919) for i in range(synced + NEW_KEYS - len(real_ids))]
    keys = synthetic + real_ids
    instance.add_dynamic_partitions(line.partitions_def.name, keys[:synced])
    storage = instance.event_log_storage
    for asset in line.asset_keys:
        for start in range(0, synced, 500):
            with storage.index_transaction() as conn:
                conn.execute(storage.prepare_insert_event_batch(
                    [materialization(asset, key) for key in keys[start:min(start + 500, synced)]]))
        # The asset's own row (last materialisation), as store_event leaves it.
        instance.report_runless_asset_event(AssetMaterialization(asset, partition=keys[synced - 1]))
    return keys[synced:]


def legacy_plan(instance: DagsterInstance, line: lines.Line, new_keys: list[str]) -> NextRun | None:
    """The planning this project did before: every known key's status over every asset."""
    known = list(instance.get_dynamic_partitions(line.partitions_def.name))
    keys = known + new_keys
    per_asset = [instance.get_status_by_partition(a, keys, line.partitions_def) or {} for a in line.asset_keys]
    status = {k: KeyStatus.DONE for k in keys if all(getattr(s.get(k), "name", "") == "MATERIALIZED"
                                                      for s in per_asset)}
    return plan_next_run(keys, status, {}, max_keys_per_run=10, max_retries=3)


def timed(fn, repeat: int) -> float:  # noqa: ANN001
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return min(samples)  # the least disturbed run: the machine is shared, the cost is not


def _window(instance: DagsterInstance, line: lines.Line, table) -> TableWindow:  # noqa: ANN001 - pyiceberg Table
    window = table_window(instance, line, table)
    assert window is not None, "the seeded line follows its table"
    return window


def measure(synced: int, legacy: bool, repeat: int, opensearch_url: str) -> tuple[float, float, float | None, float]:
    """(tick, walk, legacy, status) seconds (fastest of the repeats) with ``synced`` synced keys."""
    with tempfile.TemporaryDirectory() as home:
        os.makedirs(os.path.join(home, "dagster"))
        instance = DagsterInstance.local_temp(os.path.join(home, "dagster"))
        table = source_table(home)
        config, defs = pipeline(home, opensearch_url)
        line = table_line(config)
        started = time.perf_counter()
        new_keys = seed(instance, line, synced, [str(s.snapshot_id) for s in table.snapshots()])
        print(f"  seeded {synced:,} synced keys x {len(line.asset_keys)} assets "
              f"in {time.perf_counter() - started:.1f} s")
        discovered, planned = plan_window(instance, line, _window(instance, line, table))
        assert discovered == new_keys and isinstance(planned, NextRun) and list(planned.keys) == new_keys, planned
        assert lines.plan(instance, line, new_keys) == planned       # the walk agrees
        tick = timed(lambda: plan_window(instance, line, _window(instance, line, table)), repeat)
        walk = timed(lambda: lines.plan(instance, line, new_keys), repeat)
        peer = None
        if legacy:
            assert legacy_plan(instance, line, new_keys) == planned
            peer = timed(lambda: legacy_plan(instance, line, new_keys), 3)
        checkpoint_sink(opensearch_url, config.sinks[0].name, str(table.snapshots()[-NEW_KEYS - 1].snapshot_id))
        status = table_status(defs, instance, config)
        (sink,) = status.sinks
        assert (status.known_partitions, status.unapplied_partitions) == (synced, NEW_KEYS), status
        assert (sink.pending_snapshots, sink.error) == (NEW_KEYS, None), status
        shown = timed(lambda: table_status(defs, instance, config), repeat)
        # The one part of status that grows with the history: the database counts the line's keys.
        counted = timed(lambda: lines.key_count(instance, line), repeat)
        print(f"  status {shown:.3f} s, of which the aggregate partition count {counted:.4f} s")
        instance.dispose()
        return tick, walk, peer, shown


def status_on_demo(directory: str | None, repeat: int) -> tuple[float, float, float]:
    """(in process, command wall, command CPU) seconds of ``icecdc status`` on the demo (fastest of the repeats)."""
    import contextlib
    import io
    import resource
    import subprocess
    import sys

    from icecdc_dagster.cli import main as icecdc

    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory())
            assert subprocess.run([sys.executable, "-m", "icecdc_dagster.cli", "demo", "--dir", directory],
                                  stdout=subprocess.DEVNULL).returncode == 0
        argv = ["status", "--config", os.path.join(directory, "icecdc.yaml")]
        with contextlib.redirect_stdout(io.StringIO()) as shown:
            assert icecdc(argv) == 0                                              # warm: imports done
        # The demo's own OpenSearch-compatible server stopped with the demo: its index cannot be read (status
        # says so on that sink's line); everything else must read without an error.
        readable = [x for x in shown.getvalue().splitlines() if not x.startswith("  opensearch/")]
        assert "0 not yet applied" in shown.getvalue() and not any("error" in x for x in readable), shown.getvalue()

        def quiet() -> None:
            with contextlib.redirect_stdout(io.StringIO()):
                icecdc(argv)
        in_process = timed(quiet, repeat)
        walls, cpus = [], []
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "icecdc_dagster.cli", *argv], stdout=subprocess.DEVNULL, check=True)
            walls.append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    print(f"icecdc status on the demo: {in_process:.3f} s in process, {min(walls):.2f} s as a command "
          f"({min(cpus):.2f} CPU-s; imports included)")
    return in_process, min(walls), min(cpus)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--demo", default=None, help="an `icecdc demo --dir` directory (default: build one)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*is currently in (beta|preview).*")  # as the CLI does
    demo_s, demo_command_s, demo_cpu_s = status_on_demo(args.demo, min(args.repeat, 5))
    server = OsmemServer.start()
    try:
        with server.clone() as clone:
            tick_1k, walk_1k, legacy_1k, status_1k = measure(1_000, legacy=True, repeat=args.repeat,
                                                             opensearch_url=clone.url)
            print(f"1k synced:   tick {tick_1k:.3f} s, walk {walk_1k:.3f} s, status {status_1k:.3f} s "
                  f"(previous planning {legacy_1k:.3f} s)")
            tick_10k, walk_10k, legacy_10k, status_10k = measure(10_000, legacy=True, repeat=args.repeat,
                                                                 opensearch_url=clone.url)
            print(f"10k synced:  tick {tick_10k:.3f} s, walk {walk_10k:.3f} s, status {status_10k:.3f} s "
                  f"(previous planning {legacy_10k:.3f} s)")
            tick_big, walk_big, _, status_big = measure(args.big, legacy=False, repeat=args.repeat,
                                                        opensearch_url=clone.url)
            print(f"{args.big // 1000}k synced: tick {tick_big:.3f} s, walk {walk_big:.3f} s, "
                  f"status {status_big:.3f} s")
    finally:
        server.close()
    big = f"{args.big // 1000}k"
    print(f"RESULT tick_1k_s={tick_1k:.3f} tick_{big}_s={tick_big:.3f} tick_ratio={tick_big / tick_1k:.2f} "
          f"walk_1k_s={walk_1k:.3f} walk_{big}_s={walk_big:.3f} walk_ratio={walk_big / walk_1k:.2f} "
          f"legacy_1k_s={legacy_1k:.3f} legacy_10k_s={legacy_10k:.3f} ratio_10k={tick_10k / legacy_10k:.3f} "
          f"status_1k_s={status_1k:.3f} status_{big}_s={status_big:.3f} status_ratio={status_big / status_1k:.2f} "
          f"status_demo_s={demo_s:.3f} status_demo_command_s={demo_command_s:.2f} "
          f"status_demo_command_cpu_s={demo_cpu_s:.2f}")


if __name__ == "__main__":
    main()
