"""Asset keys, groups and partition names derived from the config, in one place.

The UI titles a graph node by the last component of its key, so within a table's group each last
component says what the node is: ``orders`` (the table), ``orders_changelog``, ``orders_maintenance``,
and each sink by its own target (``demo_replica_orders`` for the replica table ``demo_replica.orders``,
``orders_opensearch`` for the index ``orders``); dead letters by their table (``customers_dead_letters``).
"""

import re

from dagster import AssetCheckKey, AssetKey, DynamicPartitionsDefinition

from icecdc_dagster.config import IngestConfig, SinkConfig, TableConfig
from icecdc_dagster.lines.line import Line


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def source_key(table: TableConfig) -> AssetKey:
    return AssetKey(["iceberg", *table.table_name.split(".")])


def _titled(prefix: str, table_name: str, suffix: str) -> AssetKey:
    *namespace, name = table_name.split(".")
    return AssetKey([prefix, *namespace, f"{name}_{suffix}"])


def changelog_key(table: TableConfig) -> AssetKey:
    return _titled("changelog", table.table_name, "changelog")


def maintenance_key(table: TableConfig) -> AssetKey:
    return _titled("maintenance", table.table_name, "maintenance")


def sink_key(sink: SinkConfig) -> AssetKey:
    """``replica/<ns>/<ns>_<table>``, ``opensearch/<index>_opensearch``: never the source table's title
    (a replica often keeps the source's table name in another namespace)."""
    prefix, *name = sink.asset_path()
    last = "_".join(name) if len(name) > 1 else f"{name[0]}_{prefix}"
    return AssetKey([prefix, *name[:-1], last])


def group_name(table: TableConfig) -> str:
    return _slug(table.table_name)


def partitions_name(table: TableConfig) -> str:
    return "snapshots__" + _slug(table.table_name)


def partitions_def(table: TableConfig) -> DynamicPartitionsDefinition:
    return DynamicPartitionsDefinition(name=partitions_name(table))


def sensor_name(table: TableConfig) -> str:
    return "snapshots__" + _slug(table.table_name)


def line_checks_name(table: TableConfig) -> str:
    """The step that runs a table's two batch checks."""
    return "line_checks__" + _slug(table.table_name)


def ingest_key(entry: IngestConfig) -> AssetKey:
    return AssetKey(["ingest", _slug(entry.name)])


def dead_letter_key(table_name: str) -> AssetKey:
    """The dead-letter table of an ingest entry's fixed target ``table_name``."""
    return _titled("dead_letters", table_name, "dead_letters")


def ingest_partitions_def(entry: IngestConfig) -> DynamicPartitionsDefinition:
    return DynamicPartitionsDefinition(name="landing__" + _slug(entry.name))


def ingest_sensor_name(entry: IngestConfig) -> str:
    return "landing__" + _slug(entry.name)


def ingest_group_name(entry: IngestConfig) -> str:
    return "ingest__" + _slug(entry.name)


def ingest_line_id(entry: IngestConfig) -> str:
    return f"ingest:{entry.name}"


# Checks. The line checks read metadata only and run with every batch; so does each sink's counts
# check, which its own step evaluates from what it just counted (no read at all). The consistency check
# counts and samples the source and the sink (a cost that grows with the table), so it runs with
# the table group's maintenance schedule and on demand, never on a batch's critical path.
STUCK_CHECK = "no_stuck_snapshots"
LINE_CHECK = "line_follows_table"
COUNTS_CHECK = "sink_counts_agree"
CONSISTENCY_CHECK = "matches_source_at_checkpoint"


def batch_check_keys(table: TableConfig) -> tuple[AssetCheckKey, ...]:
    return (*(AssetCheckKey(changelog_key(table), name) for name in (STUCK_CHECK, LINE_CHECK)),
            *(counts_check_key(sink) for sink in table.sinks))


def counts_check_key(sink: SinkConfig) -> AssetCheckKey:
    return AssetCheckKey(sink_key(sink), COUNTS_CHECK)


def consistency_check_keys(table: TableConfig) -> tuple[AssetCheckKey, ...]:
    return tuple(AssetCheckKey(sink_key(sink), CONSISTENCY_CHECK) for sink in table.sinks)



def asset_keys(table: TableConfig) -> list[AssetKey]:
    """Every asset a run of the table's line materialises: the changelog first, then each sink."""
    return [changelog_key(table), *(sink_key(s) for s in table.sinks)]


def table_line(table: TableConfig) -> Line:
    """The line Dagster knows the table by: its partitions, assets, checks, limits."""
    return Line(line_id=table.table_name, partitions_def=partitions_def(table),
                asset_keys=tuple(asset_keys(table)), max_keys_per_run=table.max_snapshots_per_run,
                max_retries=table.max_retries, check_keys=batch_check_keys(table),
                joinable=tuple(sink_key(s) for s in table.sinks))
