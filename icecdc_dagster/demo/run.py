"""Run the demo: create, sync (export), change, sync again (CDC per snapshot), verify, summarise. The
orders go to an Iceberg replica and an OpenSearch index (in a server the demo starts, unless named)."""

import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from dagster import AssetRecordsFilter, DagsterInstance

from icecdc_dagster.assets import naming
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.demo import workload
from icecdc_dagster.demo.opensearch import INDEX, DemoCluster, config_header, demo_cluster, document_count
from icecdc_dagster.lease.dagster_yaml import RECOMMENDED_DAGSTER_YAML
from icecdc_dagster.lease.holder import set_process_role
from icecdc_dagster.lines.batch_metadata import BatchMetadata
from icecdc_dagster.resources.keys import CATALOG_KEY, SPARK_KEY
from icecdc_dagster.resources.resolved import resolved_resource
from icecdc_dagster.sync import sync_all

if TYPE_CHECKING:
    from dagster import AssetKey

    from icecdc_dagster.config import PipelineConfig
    from icecdc_dagster.sync import TableSyncReport


def _nats() -> tuple[str, str, str]:
    """(url, stream, subject) of ``--input nats`` ($ICECDC_DEMO_NATS_URL, $ICECDC_DEMO_NATS_STREAM)."""
    stream = os.environ.get("ICECDC_DEMO_NATS_STREAM", "ICECDC_DEMO")
    return (os.environ.get("ICECDC_DEMO_NATS_URL", "nats://127.0.0.1:4222"), stream,
            f"{stream.lower()}.inventory.customers")


def _customers_input(input_kind: str) -> dict[str, Any]:
    """Where the demo's customers events come from: landing files, or a JetStream subject (``--input nats``)."""
    if input_kind == "nats":
        url, stream, subject = _nats()
        return {"input": {"nats_jetstream": {"url": url, "stream": stream, "subject": subject,
                                             "durable": "icecdc_demo_customers"}}}
    return {"landing": "landing/customers"}


def write_config(directory: Path, opensearch_url: str | None, input_kind: str = "files", header: str = "") -> Path:
    """The demo's pipeline file; ``header``: comment lines at its top (where its OpenSearch sink points)."""
    sinks: list[dict[str, Any]] = [{"iceberg": {"table_name": workload.REPLICA_TABLE}}]
    if opensearch_url:
        sinks.append({"opensearch": {"hosts": [opensearch_url], "index": INDEX, "verify_certs": False}})
    config = {
        "dagster_home": "dagster_home",  # so `icecdc status --config <this file>` finds the demo's instance
        "catalog": {"name": "demo", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false"}},
        "tables": [{"table_name": workload.SOURCE_TABLE, "identifier_columns": ["order_id"],
                    "polling_interval": "PT5S", "max_snapshots_per_run": 1, "sinks": sinks},
                   # Written by the ingest entry below: the chain landing -> Iceberg -> changelog.
                   {"table_name": workload.CUSTOMERS_TABLE, "polling_interval": "PT5S"}],
        "ingest": [{"name": "customers_cdc", **_customers_input(input_kind), "target": workload.CUSTOMERS_TABLE,
                    "identifier_columns": ["id"], "auto_create": True, "schema_evolution": True,
                    "polling_interval": "PT5S"}],
    }
    path = directory / "icecdc.yaml"
    path.write_text(header + yaml.safe_dump(config, sort_keys=False))
    return path


DEMO_DAGSTER_YAML_HEADER = "# Written by `icecdc demo` on every run: the demo's instance has production's settings.\n"


def write_dagster_yaml(home: Path) -> bool:
    """The demo instance's ``dagster.yaml``: production's crash-safety settings (run monitoring, one
    run per line, the monitored launcher; see :mod:`icecdc_dagster.lease.dagster_yaml`), telemetry
    off. The demo owns this file: one from an older demo is brought up to date. True when written."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "dagster.yaml"
    wanted = DEMO_DAGSTER_YAML_HEADER + RECOMMENDED_DAGSTER_YAML + "telemetry:\n  enabled: false\n"
    if path.exists() and path.read_text() == wanted:
        return False
    path.write_text(wanted)
    return True


def run_demo(directory: Path, opensearch_url: str | None = None, input_kind: str = "files") -> int:
    """The demo end to end; its OpenSearch index in ``opensearch_url``, else in a server it starts
    (:mod:`icecdc_dagster.demo.opensearch`). 0 when the replica and the index match the source."""
    with demo_cluster(opensearch_url) as cluster:
        return _run_demo(directory, cluster, input_kind)


def _run_demo(directory: Path, cluster: DemoCluster, input_kind: str) -> int:
    set_process_role("icecdc demo")  # its runs say so (icecdc/launched_by), as icecdc sync's do
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(directory / "dagster_home")
    home = Path(os.environ["DAGSTER_HOME"])
    write_dagster_yaml(home)
    config_path = write_config(directory, cluster.url, input_kind, config_header(cluster))
    config = load_config(config_path)
    # The demo creates its source table below, with the session these definitions build.
    defs = build_definitions(config, check_tables=False)
    instance = DagsterInstance.get()
    catalog = resolved_resource(defs, CATALOG_KEY)
    started = time.monotonic()
    spark = resolved_resource(defs, SPARK_KEY).session(catalog)
    name = config.catalog.name
    print(f"demo: warehouse and catalog in {directory}")
    fresh = not spark.catalog.tableExists(f"{name}.{workload.SOURCE_TABLE}")
    if fresh:
        workload.create_source(spark, name)
        workload.initial_load(spark, name)
        print("demo: created demo.orders with 1000 orders")
    if input_kind == "nats":
        url, stream, subject = _nats()
        published = workload.publish_customer_stream(url, stream, subject)
        print(f"demo: published {published} Debezium events to JetStream {stream} subject {subject} "
              f"for {workload.CUSTOMERS_TABLE}")
    else:
        landed = workload.land_customer_stream(directory / "landing" / "customers")
        print(f"demo: landed Debezium files {', '.join(landed)} for {workload.CUSTOMERS_TABLE}")
    reports = sync_all(config, defs, instance)
    print(f"demo: first sync (export): {_runs(reports)}")
    for description in workload.apply_changes(spark, name):
        print(f"demo: committed {description}")
    reports = sync_all(config, defs, instance)
    print(f"demo: second sync (CDC, one run per snapshot): {_runs(reports)}")
    print()
    _print_batches(instance, config)
    source = spark.table(f"{name}.{workload.SOURCE_TABLE}")
    replica = spark.table(f"{name}.{workload.REPLICA_TABLE}")
    missing = source.exceptAll(replica).count()
    extra = replica.exceptAll(source).count()
    matches = missing == 0 and extra == 0
    rows = source.count()
    print(f"\nsource rows: {rows}, replica rows: {replica.count()}, replica matches source: {matches}")
    if cluster.url is not None:  # the headline sink: every row a document, by its key
        documents = document_count(cluster.url)
        matches = matches and documents == rows
        print(f"OpenSearch index {INDEX}: {documents} documents, source rows: {rows}, "
              f"index matches source: {documents == rows}")
    customers = spark.table(f"{name}.{workload.CUSTOMERS_TABLE}")
    dead = spark.table(f"{name}.{workload.CUSTOMERS_TABLE}__dead_letters")
    gold = customers.where(customers.tier == "gold").count()
    print(f"ingested customers: {customers.count()} rows ({gold} gold, columns {', '.join(customers.columns)}); "
          f"dead letters: {dead.count()}")
    # The dagster command of this interpreter's environment (e.g. .venv/bin/dagster): runnable as printed.
    dagster_cli = Path(sys.executable).parent / "dagster"
    print(f"demo: {cluster.fate}")
    print(f"demo finished in {time.monotonic() - started:.1f}s. Explore it in the UI:\n"
          f"  DAGSTER_HOME={shlex.quote(os.environ['DAGSTER_HOME'])} ICECDC_CONFIG={shlex.quote(str(config_path))} "
          f"{shlex.quote(str(dagster_cli))} dev -m icecdc_dagster.definitions")
    return 0 if matches and all(r.ok for r in reports) else 1


def _runs(reports: "list[TableSyncReport]") -> str:
    return "; ".join(f"{r.table_name}: {sum(1 for *_, ok in r.runs if ok)} runs ok"
                     + (f", blocked: {r.blocked}" if r.blocked else "") for r in reports)


def _print_batches(instance: "DagsterInstance", config: "PipelineConfig") -> None:
    for table in config.tables:
        key = naming.changelog_key(table)
        print(f"\n{table.table_name}")
        print(f"{'snapshot':>20}  {'operation':<10} {'kind':<7} {'INS':>5} {'DEL':>5} {'UPD':>5}")
        for partition in instance.get_dynamic_partitions(naming.partitions_name(table)):
            meta = _latest_metadata(instance, key, partition)
            if meta is None:
                continue
            print(f"{partition:>20}  {meta.operation or '?':<10} {meta.batch_kind or '?':<7} "
                  f"{meta.count_insert or 0:>5} {meta.count_delete or 0:>5} {meta.count_update_after or 0:>5}")


def _latest_metadata(instance: "DagsterInstance", asset_key: "AssetKey", partition: str) -> BatchMetadata | None:
    result = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition]), limit=1)
    if not result.records or result.records[0].asset_materialization is None:
        return None
    return BatchMetadata.read(result.records[0].asset_materialization)
