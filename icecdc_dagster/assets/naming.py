"""Asset keys, groups and partition names derived from the config, in one place."""

import re

from dagster import AssetCheckKey, AssetKey, DynamicPartitionsDefinition

from icecdc_dagster.config import IngestConfig, SinkConfig, TableConfig


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def source_key(table: TableConfig) -> AssetKey:
    return AssetKey(["iceberg", *table.table_name.split(".")])


def changelog_key(table: TableConfig) -> AssetKey:
    return AssetKey(["changelog", *table.table_name.split(".")])


def sink_key(sink: SinkConfig) -> AssetKey:
    return AssetKey(list(sink.asset_path()))


def group_name(table: TableConfig) -> str:
    return _slug(table.table_name)


def partitions_name(table: TableConfig) -> str:
    return "snapshots__" + _slug(table.table_name)


def partitions_def(table: TableConfig) -> DynamicPartitionsDefinition:
    return DynamicPartitionsDefinition(name=partitions_name(table))


def sensor_name(table: TableConfig) -> str:
    return "snapshots__" + _slug(table.table_name)


def ingest_key(entry: IngestConfig) -> AssetKey:
    return AssetKey(["ingest", _slug(entry.name)])


def dead_letter_key(table_name: str) -> AssetKey:
    """The dead-letter table of an ingest entry's fixed target ``table_name``."""
    return AssetKey(["dead_letters", *table_name.split(".")])


def ingest_partitions_def(entry: IngestConfig) -> DynamicPartitionsDefinition:
    return DynamicPartitionsDefinition(name="landing__" + _slug(entry.name))


def ingest_sensor_name(entry: IngestConfig) -> str:
    return "landing__" + _slug(entry.name)


def ingest_group_name(entry: IngestConfig) -> str:
    return "ingest__" + _slug(entry.name)


def ingest_line_id(entry: IngestConfig) -> str:
    return f"ingest:{entry.name}"


# Checks. The line checks read metadata only and run with every batch; the consistency check
# counts and samples the source and the sink (a cost that grows with the table), so it runs with
# the table group's maintenance schedule and on demand, never on a batch's critical path.
STUCK_CHECK = "no_stuck_snapshots"
LINE_CHECK = "line_follows_table"
CONSISTENCY_CHECK = "matches_source_at_checkpoint"


def batch_check_keys(table: TableConfig) -> tuple[AssetCheckKey, ...]:
    return tuple(AssetCheckKey(changelog_key(table), name) for name in (STUCK_CHECK, LINE_CHECK))


def consistency_check_keys(table: TableConfig) -> tuple[AssetCheckKey, ...]:
    return tuple(AssetCheckKey(sink_key(sink), CONSISTENCY_CHECK) for sink in table.sinks)


TABLE_TAG = "icecdc/table"
FIRST_SNAPSHOT_TAG = "icecdc/first_snapshot"
LAST_SNAPSHOT_TAG = "icecdc/last_snapshot"
SOURCE_UUID_METADATA = "source_table_uuid"  # changelog metadata: the table uuid a batch was computed from
