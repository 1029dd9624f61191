"""The definitions of a code origin, built once per process (and again when the pipeline file changes),
not once per run or step as Dagster's own one-entry cache does when lanes take turns."""

import os
import threading
from typing import TYPE_CHECKING, Any

from dagster._core.definitions import reconstruct
from dagster._core.definitions.reconstruct import ReconstructableJob, ReconstructableRepository
from dagster_shared.serdes import serialize_value

from icecdc_dagster.config.load import CONFIG_ENV, watched_files

if TYPE_CHECKING:
    from dagster import RepositoryDefinition

_DEFINITIONS: dict[tuple[Any, ...], tuple["RepositoryDefinition", tuple[Any, ...]]] = {}
_DEFINITIONS_LOCK = threading.Lock()


class _WarmRepository(ReconstructableRepository):
    """A code location whose definitions are built once per process (see :func:`_definitions`)."""

    def get_definition(self) -> "RepositoryDefinition":
        return _definitions(self)


def warm_recon_job(recon_job: ReconstructableJob) -> ReconstructableJob:
    """The run's job, reading its definitions from this process's cache.

    Dagster rebuilds the code location's definitions whenever its one-entry cache
    (``ReconstructableJob.get_definition``, ``lru_cache(maxsize=1)`` shared by every job) misses:
    at every step when two lanes alternate, and at least once per run. For icecdc that is the
    whole ``definitions.build_definitions`` - the pipeline file read and every source table loaded
    from the catalog (20 tables: 20 catalog loads) - several times per batch (py-spy:
    ~14 % of a lane's time with 2 lanes and 20 tables). Subsets and copies of the job keep the
    cached repository (``_replace`` keeps the class).
    """
    return recon_job._replace(repository=_WarmRepository._make(recon_job.repository))


def clear_definitions() -> None:
    """Forget every cached build (tests: count builds from a clean cache)."""
    with _DEFINITIONS_LOCK:
        _DEFINITIONS.clear()


def _config_stamp() -> tuple[Any, ...]:
    """The pipeline files the definitions were built from: ``$ICECDC_CONFIG``'s and every file a component
    or ``icecdc_definitions`` loaded in this process (a component's ``defs.yaml`` for an inline pipeline).
    A change of any rebuilds them."""
    paths = set(watched_files())
    if os.environ.get(CONFIG_ENV):
        paths.add(os.environ[CONFIG_ENV])
    return tuple(_stamp(path) for path in sorted(paths))


def _stamp(path: str) -> tuple[Any, ...]:
    try:
        stat = os.stat(path)
    except OSError:
        return (path,)
    return (path, stat.st_mtime_ns, stat.st_size)


def _definitions(repository: ReconstructableRepository) -> "RepositoryDefinition":
    """The repository definition of a code origin, built once per process (and again when a pipeline
    file it was built from changes). Code changes still need a daemon restart (docs/warm-launcher.md).
    The stamp is taken after the build, when the files it read are known."""
    load_data = repository.repository_load_data
    key = (repository.pointer, serialize_value(load_data) if load_data is not None else None)
    with _DEFINITIONS_LOCK:
        cached = _DEFINITIONS.get(key)
        if cached is None or cached[1] != _config_stamp():
            built = reconstruct.reconstruct_repository_def_from_pointer(repository.pointer, load_data)
            cached = _DEFINITIONS[key] = (built, _config_stamp())
        return cached[0]
