"""An ``ingest:`` entry as the engine sees it (no Dagster): settings, and landing files as keys.

A partition key is a landing file's name; a run of consecutive keys is one batch (at most
``files_per_batch`` files), so the batch id the engine records is the same on every retry.
"""

from collections.abc import Sequence

from icecdc_dagster.config import IngestConfig
from icecdc_dagster.errors import IngestError
from icecdc_dagster.ingest import landing, routing
from icecdc_dagster.ingest.pipeline import IngestSettings


def ingest_settings(entry: IngestConfig) -> IngestSettings:
    return IngestSettings(landing=entry.landing, target=entry.target,
                          identifier_columns=tuple(entry.identifier_columns), auto_create=entry.auto_create,
                          schema=entry.schema, schema_evolution=entry.schema_evolution,
                          files_per_batch=entry.files_per_batch)


def fixed_target(entry: IngestConfig) -> str | None:
    """The one table an entry writes, or None for a routing template."""
    return None if routing.is_template(entry.target) else entry.target


def landing_keys(entry: IngestConfig) -> list[str]:
    """Names of the landing files, in name order (writers' hidden/``_`` files excluded)."""
    return [_name(f.uri) for f in landing.list_files(entry.landing)]


def files_of(entry: IngestConfig, keys: Sequence[str]) -> list[str]:
    """Landing file URIs of partition keys (file names), in key order."""
    by_name = {_name(f.uri): f.uri for f in landing.list_files(entry.landing)}
    missing = [k for k in keys if k not in by_name]
    if missing:
        raise IngestError(f"ingest {entry.name}: landing file(s) {missing} are no longer in {entry.landing}")
    return [by_name[k] for k in keys]


def _name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]
