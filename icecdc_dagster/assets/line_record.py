"""What each table's line was built on, kept for the next load to compare with the pipeline file.

The changelog step records the identifier columns its batches were keyed by; each sink step records
its sink (kind, target, asset key). A load compares the file with this record: changed identifier
columns are refused, naming the ``icecdc resync`` that rebuilds the line; a sink that is no longer in
the file is *left behind* (``icecdc status`` lists its target and last checkpoint), and a sink of the
same kind with another target is named as the replacement of the old one.

One JSON file, ``$DAGSTER_HOME/icecdc/lines.json`` (next to the table metadata cache), keyed by
``<catalog>.<namespace>.<table>`` (as ``dagster/table_name``), rewritten only
when a value changes (a batch that changes nothing writes nothing), under an OS file lock, atomically.
"""

import logging
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icecdc_dagster.assets import json_file
from icecdc_dagster.assets.metadata_cache import cache_path
from icecdc_dagster.errors import DefinitionChangedError, resync_command
from icecdc_dagster.steps.batches import identifier_columns_of

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icecdc_dagster.config import PipelineConfig, TableConfig

_LOG = logging.getLogger("icecdc")
FILE_NAME = "lines.json"
IDENTIFIER_COLUMNS = "identifier_columns"
SINKS = "sinks"


def record_path() -> Path:
    return cache_path().with_name(FILE_NAME)


def recorded(table_name: str) -> dict[str, Any]:
    """The table's record (empty when nothing was recorded yet); ``table_name``: with its catalog."""
    entry = json_file.read(record_path()).get(table_name)
    return entry if isinstance(entry, dict) else {}


def remember_identifier_columns(table_name: str, columns: tuple[str, ...]) -> bool:
    """Record the identifier columns the line's batches are keyed by; True when the file changed."""
    return _update(table_name, lambda entry: entry.__setitem__(IDENTIFIER_COLUMNS, list(columns)),
                   lambda entry: entry.get(IDENTIFIER_COLUMNS) == list(columns))


def remember_sink(table_name: str, name: str, kind: str, target: str, asset_key: str) -> bool:
    """Record that a sink follows the line; True when the file changed."""
    value = {"kind": kind, "target": target, "asset_key": asset_key}

    def is_current(entry: dict[str, Any]) -> bool:
        return (entry.get(SINKS) or {}).get(name) == value

    def write(entry: dict[str, Any]) -> None:
        entry.setdefault(SINKS, {})[name] = value

    return _update(table_name, write, is_current)


def forget_sink(table_name: str, name: str) -> bool:
    """Drop a left-behind sink from the record (its target was cleaned up)."""
    return _update(table_name, lambda entry: (entry.get(SINKS) or {}).pop(name, None),
                   lambda entry: name not in (entry.get(SINKS) or {}))


def _update(table_name: str, write: Callable[[dict[str, Any]], Any],
            is_current: Callable[[dict[str, Any]], bool]) -> bool:
    if is_current(recorded(table_name)):  # the common case: nothing changed, no lock, no write
        return False

    def change(entry: dict[str, Any]) -> bool:
        if is_current(entry):
            return False
        write(entry)
        return True

    return json_file.update(record_path(), table_name, change)


def check_pipeline(config: "PipelineConfig", sources: Mapping[str, "Table"], rebuilt: Collection[str] = ()) -> None:
    """Compare the pipeline file with what each line recorded, at load.

    Changed identifier columns are refused (a document id or replica key would change under the
    sinks): ``DefinitionChangedError`` names the old and new columns and the ``icecdc resync`` that
    rebuilds the line with them; ``rebuilt``: tables being resynced (that load is the recovery). A sink
    that replaces a recorded one of the same kind (another index or replica table) is logged: the new
    target takes its own export at the next batch, the old one stays as it is (``icecdc status``).
    """
    for table in config.tables:
        record = recorded(f"{config.catalog.name}.{table.table_name}")
        source = sources.get(table.table_name)
        before = record.get(IDENTIFIER_COLUMNS)
        if source is not None and before is not None and table.table_name not in rebuilt:
            now = list(identifier_columns_of(table.identifier_columns, source))
            if now != list(before):
                command = resync_command(table.table_name, config.source)
                raise DefinitionChangedError(
                    f"{config.source}: tables: {table.table_name!r}: identifier_columns changed from {before} to "
                    f"{now}; its sinks hold documents and rows keyed by {before}. Rebuild the line with the new "
                    f"key (a full export that replaces every sink's content): {command}")
        for old, new in replaced_sinks(table, record):
            _LOG.warning(f"{config.source}: {table.table_name}: sink {new} replaces {old}: {new} takes its own "
                         f"export at the next batch; {old} is left as it is (icecdc status --config {config.source} "
                         f"lists it; delete it once nobody reads it)")


def left_behind(catalog_name: str, table: "TableConfig") -> dict[str, dict[str, Any]]:
    """Sinks the line recorded that the pipeline file no longer has: name -> kind, target, asset key."""
    configured = {sink.name for sink in table.sinks}
    sinks = recorded(f"{catalog_name}.{table.table_name}").get(SINKS) or {}
    return {name: value for name, value in sinks.items() if name not in configured}


def replaced_sinks(table: "TableConfig", record: dict[str, Any]) -> list[tuple[str, str]]:
    """(old, new) sink names: a recorded sink gone from the file and a new one of the same kind."""
    recorded_sinks = record.get(SINKS) or {}
    configured = {sink.name: sink.kind for sink in table.sinks}
    gone = [(name, value.get("kind")) for name, value in recorded_sinks.items() if name not in configured]
    added = [(name, kind) for name, kind in configured.items() if name not in recorded_sinks]
    return [(old, new) for old, old_kind in gone for new, kind in added if kind == old_kind]
