"""A pipeline resource usable outside a run: the one way to get one.

The definitions' resources hold their config as the pipeline file wrote it: a secret is an ``EnvVar``, a
``str`` whose text is the variable's NAME until Dagster initialises the resource (a run, a sensor tick
with resources). Code that uses a resource outside those (``icecdc sync``'s planning, ``status``,
``resync``, the progress planner, the snapshot sensors, the demo, the benches) gets it here: Dagster's own
initialisation (``process_config_and_initialize``: every ``EnvVar`` read from the environment now, an
unset one refused), once per resource object and process. Nothing else reads a raw resource
(``tests/test_layers.py``), and a raw catalog or OpenSearch resource refuses to connect
(:func:`icecdc_dagster.resources.secrets.require_resolved`).
"""

import re
import threading
from typing import Any, TypeVar

from dagster import ConfigurableResource, Definitions
from dagster._core.errors import DagsterInvalidConfigError

from icecdc_dagster.errors import ConfigError
from icecdc_dagster.resources.catalog_resource import catalog_resource_key

R = TypeVar("R", bound=ConfigurableResource[Any])

# Raw resource id -> (raw, initialised). The raw one is kept so its id is not reused while cached.
# Initialising costs ~0.4 s of Dagster config processing: once per resource object, not per call.
_INITIALIZED: dict[int, tuple[Any, Any]] = {}
_LOCK = threading.Lock()
_KEPT = 64  # resources of the definitions built in this process (a test session builds many)


def initialized(resource: R, key: str = "resource") -> R:
    """``resource`` as Dagster initialises it for a run: its ``EnvVar`` config read from the environment.

    Raises:
        ConfigError: an environment variable the resource's config names is not set (names the resource
            key and the variable, never a value).
    """
    with _LOCK:
        cached = _INITIALIZED.get(id(resource))
        if cached is not None:
            return cached[1]

    try:
        ready = resource.process_config_and_initialize()
    except DagsterInvalidConfigError as exc:
        raise ConfigError(f"resource {key!r}: {_unset_variable(exc)}") from None
    with _LOCK:
        _INITIALIZED[id(resource)] = (resource, ready)
        while len(_INITIALIZED) > _KEPT:  # oldest first (insertion order)
            del _INITIALIZED[next(iter(_INITIALIZED))]
    return ready


def resolved_resource(defs: Definitions, key: str) -> Any:
    """The resource ``key`` of ``defs`` (built by ``definitions.build_definitions``), initialised.

    Raises:
        KeyError: ``defs`` has no resource ``key``.
        ConfigError: see :func:`initialized`.
    """
    return initialized((defs.resources or {})[key], key)


def resolved_catalog(defs: Definitions, name: str | None = None) -> Any:
    """Catalog ``name`` of ``defs`` (None: the default), initialised: the one lookup of a catalog by name
    outside a run (a replica's or an ingest target's catalog, ``catalogs:``).

    Raises:
        KeyError: ``defs`` has no catalog ``name``.
        ConfigError: see :func:`initialized`.
    """
    return resolved_resource(defs, catalog_resource_key(name))


def _unset_variable(exc: Exception) -> str:
    """Dagster's message names the variable (``environment variable "X" which is not set``) and the
    config path; the first line of each error is enough."""
    found = re.findall(r'environment variable "([^"]+)" which is not set', str(exc))
    if found:
        return f"environment variable {', '.join(sorted(set(found)))} is not set"
    return str(exc).splitlines()[0]
