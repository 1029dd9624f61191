"""Asset keys, groups and partition names derived from the config, in one place.

The UI titles a graph node by the last component of its key, so within a table's group each last
component says what the node is: ``orders`` (the table), ``orders_changelog``, ``orders_maintenance``,
and each sink by its own target (``demo_replica_orders`` for the replica table ``demo_replica.orders``,
``orders_opensearch`` for the index ``orders``); dead letters by their table (``customers_dead_letters``).

Every key can be chosen by the user: ``asset_key`` of a table or a sink in the pipeline file, and any
asset's key through a Component's ``translation`` (recorded on the config object, by asset kind:
:class:`icecdc_dagster.fields.Keyed`). The defaults below apply when neither is given.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass

from dagster import AssetCheckKey, AssetKey, DynamicPartitionsDefinition

from icecdc_dagster.config import IngestConfig, PipelineConfig, SinkConfig, TableConfig
from icecdc_dagster.errors import ConfigError
from icecdc_dagster.fields import Keyed
from icecdc_dagster.lines.line import Line
from icecdc_dagster.steps.ingest_entry import fixed_target


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


# The asset kinds (a translation's ``{{ kind }}``).
SOURCE, CHANGELOG, MAINTENANCE, INGEST, DEAD_LETTERS = "source", "changelog", "maintenance", "ingest", "dead_letters"


def _chosen(keyed: Keyed, kind: str, given: tuple[str, ...] | None, default: AssetKey) -> AssetKey:
    translated = keyed.translated_key(kind)
    return AssetKey(list(translated or given or default.path))


def source_key(table: TableConfig) -> AssetKey:
    return _chosen(table, SOURCE, table.asset_key, AssetKey(["iceberg", *table.table_name.split(".")]))


def _titled(prefix: str, table_name: str, suffix: str) -> AssetKey:
    *namespace, name = table_name.split(".")
    return AssetKey([prefix, *namespace, f"{name}_{suffix}"])


def changelog_key(table: TableConfig) -> AssetKey:
    return _chosen(table, CHANGELOG, None, _titled("changelog", table.table_name, "changelog"))


def maintenance_key(table: TableConfig) -> AssetKey:
    return _chosen(table, MAINTENANCE, None, _titled("maintenance", table.table_name, "maintenance"))


def sink_key(sink: SinkConfig) -> AssetKey:
    """Default ``replica/<ns>/<ns>_<table>``, ``opensearch/<index>_opensearch``: never the source table's
    title (a replica often keeps the source's table name in another namespace)."""
    prefix, *name = sink.asset_path()
    last = "_".join(name) if len(name) > 1 else f"{name[0]}_{prefix}"
    return _chosen(sink, sink.asset_prefix, sink.asset_key, AssetKey([prefix, *name[:-1], last]))


def group_name(table: TableConfig) -> str:
    return _slug(table.table_name)


def partitions_name(table: TableConfig) -> str:
    return "snapshots__" + _slug(table.table_name)


def partitions_def(table: TableConfig) -> DynamicPartitionsDefinition:
    return DynamicPartitionsDefinition(name=partitions_name(table))


def sensor_name(table: TableConfig) -> str:
    return "snapshots__" + _slug(table.table_name)


def ingest_key(entry: IngestConfig) -> AssetKey:
    return _chosen(entry, INGEST, None, AssetKey(["ingest", _slug(entry.name)]))


def dead_letter_key(entry: IngestConfig, target: str) -> AssetKey:
    """The dead-letter table of an ingest entry's fixed target ``target`` (one asset for every entry
    writing that target: a translation gives each the same key)."""
    return _chosen(entry, DEAD_LETTERS, None, _titled("dead_letters", target, "dead_letters"))


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


@dataclass(frozen=True)
class NamedAsset:
    """One asset of the pipeline file: its kind (``source``, ``changelog``, ``replica``, ``opensearch``,
    ``maintenance``, ``ingest``, ``dead_letters``), its key, where the file declares it (named in errors)
    and the names a translation's ``{{ }}`` templates see."""

    kind: str
    key: AssetKey
    where: str
    keyed: Keyed
    names: Mapping[str, str]
    group: str


def named_assets(config: PipelineConfig) -> list[NamedAsset]:
    """Every asset the pipeline file declares, in file order (one per dead-letter table)."""
    found: list[NamedAsset] = []
    for i, table in enumerate(config.tables):
        where = f"tables[{i}] ({table.table_name})"
        names = {"table_name": table.table_name, "namespace": table.namespace, "table": table.name}
        group = group_name(table)
        found += [NamedAsset(SOURCE, source_key(table), where, table, names, group),
                  NamedAsset(CHANGELOG, changelog_key(table), f"{where} changelog", table, names, group)]
        found += [NamedAsset(sink.asset_prefix, sink_key(sink), f"{where}.sinks[{j}] ({sink.name})", sink,
                             {**names, "target": sink.target}, group) for j, sink in enumerate(table.sinks)]
        found.append(NamedAsset(MAINTENANCE, maintenance_key(table), f"{where} maintenance", table, names, group))
    dead: set[str] = set()
    for i, entry in enumerate(config.ingest):
        target = fixed_target(entry)
        names = {"ingest": entry.name, "target": target or entry.target}
        group = ingest_group_name(entry)
        found.append(NamedAsset(INGEST, ingest_key(entry), f"ingest[{i}] ({entry.name})", entry, names, group))
        if target is not None and target not in dead:
            dead.add(target)
            found.append(NamedAsset(DEAD_LETTERS, dead_letter_key(entry, target),
                                    f"ingest[{i}] ({entry.name}) dead letters", entry, names, group))
    return found


def check_unique_keys(config: PipelineConfig) -> None:
    """Two assets of the pipeline file with one key (chosen in the file or by a translation) fail at
    load, naming both; Dagster's own error would name neither declaration.

    Raises:
        ConfigError: a key is given twice.
    """
    seen: dict[AssetKey, NamedAsset] = {}
    for asset in named_assets(config):
        first = seen.setdefault(asset.key, asset)
        if first is not asset:
            raise ConfigError(f"{config.source}: asset key {asset.key.to_user_string()!r} is given to both "
                              f"{first.where} and {asset.where}")
