"""Control-plane benchmark: one evaluation of a table's line (what every sensor tick and every
``icecdc sync`` step does) with 1,000 vs 100,000 already-synced snapshot partitions.

A real Dagster instance (SQLite storage, as ``dagster dev`` uses) holds N synced keys, each
materialised by the line's two assets (changelog + one sink); a real Iceberg table (pyiceberg, SQL
catalog, no Spark) has 5 snapshots: the last 2 synced keys are its first snapshots (older ones were
expired, as in production) and its 3 newest are new. We time ``sensors.snapshots.evaluate_window``
(ours: the ancestry after the line's latest materialisations) and, as the peer, the previous
planning that asked Dagster for the status of every known partition (``legacy_plan`` below,
measured at 1k and 10k only: at 100k it takes minutes). Landing-file lines use
``sensors.line.pending_keys`` (walks the known keys back to the frontier): timed as ``walk_*``.

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

import pyarrow as pa
from dagster import AssetKey, AssetMaterialization, DagsterInstance, DynamicPartitionsDefinition
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry
from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID

from pyiceberg.catalog.sql import SqlCatalog

from icecdc_dagster.pipeline.ordering import KeyStatus, NextRun, plan_next_run
from icecdc_dagster.sensors import line as lines
from icecdc_dagster.sensors.snapshots import evaluate_window

ASSETS = (AssetKey(["changelog", "db", "orders"]), AssetKey(["replica", "db", "orders_copy"]))
NEW_KEYS = 3


def materialization(asset: AssetKey, key: str) -> EventLogEntry:
    event = DagsterEvent(event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value, job_name=RUNLESS_JOB_NAME,
                         event_specific_data=StepMaterializationData(AssetMaterialization(asset, partition=key)))
    return EventLogEntry(error_info=None, level="debug", user_message="", run_id=RUNLESS_RUN_ID,
                         timestamp=time.time(), dagster_event=event)


def source_table(root: str):  # noqa: ANN201 - pyiceberg Table
    catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
    catalog.create_namespace("db")
    table = catalog.create_table("db.orders", schema=pa.schema([pa.field("id", pa.int64())]))
    for i in range(2 + NEW_KEYS):
        table.append(pa.table({"id": [i]}))
    return table


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


def measure(synced: int, legacy: bool, repeat: int) -> tuple[float, float, float | None]:
    """(tick, walk, legacy) seconds (fastest of the repeats) with ``synced`` synced keys."""
    with tempfile.TemporaryDirectory() as home:
        os.makedirs(os.path.join(home, "dagster"))
        instance = DagsterInstance.local_temp(os.path.join(home, "dagster"))
        table = source_table(home)
        line = lines.Line("db.orders", DynamicPartitionsDefinition(name="snapshots__db_orders"), ASSETS,
                          max_keys_per_run=10, max_retries=3)
        started = time.perf_counter()
        new_keys = seed(instance, line, synced, [str(s.snapshot_id) for s in table.snapshots()])
        print(f"  seeded {synced:,} synced keys x {len(ASSETS)} assets in {time.perf_counter() - started:.1f} s")
        discovered, planned = evaluate_window(instance, line, table)
        assert discovered == new_keys and isinstance(planned, NextRun) and list(planned.keys) == new_keys, planned
        assert lines.plan(instance, line, new_keys) == planned       # the walk agrees
        tick = timed(lambda: evaluate_window(instance, line, table), repeat)
        walk = timed(lambda: lines.plan(instance, line, new_keys), repeat)
        peer = None
        if legacy:
            assert legacy_plan(instance, line, new_keys) == planned
            peer = timed(lambda: legacy_plan(instance, line, new_keys), 3)
        instance.dispose()
        return tick, walk, peer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    tick_1k, walk_1k, legacy_1k = measure(1_000, legacy=True, repeat=args.repeat)
    print(f"1k synced:   tick {tick_1k:.3f} s, walk {walk_1k:.3f} s (previous planning {legacy_1k:.3f} s)")
    tick_10k, walk_10k, legacy_10k = measure(10_000, legacy=True, repeat=args.repeat)
    print(f"10k synced:  tick {tick_10k:.3f} s, walk {walk_10k:.3f} s (previous planning {legacy_10k:.3f} s)")
    tick_big, walk_big, _ = measure(args.big, legacy=False, repeat=args.repeat)
    print(f"{args.big // 1000}k synced: tick {tick_big:.3f} s, walk {walk_big:.3f} s")
    big = f"{args.big // 1000}k"
    print(f"RESULT tick_1k_s={tick_1k:.3f} tick_{big}_s={tick_big:.3f} tick_ratio={tick_big / tick_1k:.2f} "
          f"walk_1k_s={walk_1k:.3f} walk_{big}_s={walk_big:.3f} walk_ratio={walk_big / walk_1k:.2f} "
          f"legacy_1k_s={legacy_1k:.3f} legacy_10k_s={legacy_10k:.3f} ratio_10k={tick_10k / legacy_10k:.3f}")


if __name__ == "__main__":
    main()
