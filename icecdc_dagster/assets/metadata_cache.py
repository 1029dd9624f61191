"""The table metadata a materialisation saw, kept for the next definitions load.

A code location reloads often (every ``dagster dev`` reload, every run worker); loading each
table it describes would cost one catalog round trip per asset each time. Instead each step that
writes a table records its name, location, schema id and column schema here, and rewrites the
file only when one of them changed (a schema evolution, a recreated table): a batch that changes
no schema writes nothing. The load reads the file once.

One JSON file, ``$DAGSTER_HOME/icecdc/table_metadata.json`` (or ``$ICECDC_CACHE_DIR`` without a
Dagster home), keyed by ``dagster/table_name`` (catalog.namespace.table). Updates are serialised
by an OS file lock and replace the file atomically; an unreadable file is treated as empty.
"""

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import TableSchema, deserialize_value, serialize_value
from dagster._core.definitions.metadata.metadata_set import TableMetadataSet, UriMetadataSet  # not in dagster's API

from icecdc_dagster.assets import json_file
from icecdc_dagster.assets.table_metadata import COLUMN_SCHEMA, TABLE_NAME, URI, table_metadata, uri_value
from icecdc_dagster.runtime.jars import cache_dir

if TYPE_CHECKING:
    from pyiceberg.table import Table

FILE_NAME = "table_metadata.json"


def cache_path() -> Path:
    home = os.environ.get("DAGSTER_HOME")
    if home:
        return Path(home, "icecdc", FILE_NAME)
    return cache_dir() / FILE_NAME


def load() -> dict[str, dict[str, Any]]:
    """Every remembered table: ``dagster/table_name`` -> its definition metadata."""
    remembered = {}
    for name, entry in json_file.read(cache_path()).items():
        try:
            remembered[name] = _metadata(name, entry)
        except (KeyError, TypeError, ValueError):  # an entry of another version: the next batch rewrites it
            continue
    return remembered


def remember(metadata: Mapping[str, Any]) -> bool:
    """Record a table's metadata (from :func:`table_metadata`); True when the file changed."""
    name = str(TableMetadataSet.extract({TABLE_NAME: metadata[TABLE_NAME]}).table_name)
    entry = {"uri": UriMetadataSet.extract({URI: metadata[URI]}).uri, "schema_id": metadata.get("schema_id"),
             "column_schema": serialize_value(metadata[COLUMN_SCHEMA])}
    path = cache_path()
    if json_file.read(path).get(name) == entry:  # the common case: nothing changed, no lock, no write
        return False

    def change(current: dict[str, Any]) -> bool:
        if current == entry:
            return False
        current.clear()
        current.update(entry)
        return True

    return json_file.update(path, name, change)




def _metadata(name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {TABLE_NAME: name, URI: uri_value(entry["uri"]),
                                COLUMN_SCHEMA: deserialize_value(entry["column_schema"], TableSchema)}
    if entry.get("schema_id") is not None:
        metadata["schema_id"] = entry["schema_id"]
    return metadata


def described_table(catalog_name: str, table: "Table", identifier_columns: Sequence[str] = (),
                    docs: Mapping[str, str] | None = None, fallback: str | None = None) -> dict[str, Any]:
    """:func:`table_metadata` of a table a step wrote, remembered for the next definitions load."""
    metadata = table_metadata(catalog_name, table, identifier_columns, docs, fallback)
    try:
        remember(metadata)
    except OSError as exc:  # a read-only home costs the next load its metadata, never the batch
        logging.getLogger(__name__).warning("table metadata not remembered in %s: %s",
                                            cache_path(), exc)
    return metadata
