"""Run start without ``logging.config.dictConfig``: two runs in one process (two lanes of the warm launcher, a
sync's run beside another run) deadlocked on it."""

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagster import DagsterInstance

_log = logging.getLogger(__name__)


def skip_logging_reconfiguration_per_run(instance: "DagsterInstance") -> None:
    """Keep run start from calling ``logging.config.dictConfig`` when no ``python_logs`` handlers are set.

    Dagster (1.13) builds every run's log manager through ``get_yaml_python_handlers``, which calls
    ``dictConfig`` whenever the instance has any settings, configured handlers or not. ``dictConfig``
    holds logging's module lock while it takes every handler's lock to close it; a run in another
    lane that is emitting an event holds its handler's lock and waits for the module lock (a logger
    cache miss after the reconfiguration): both lanes, and then every daemon thread, hang.
    Found by ``bench/freshness.py`` with 2 lanes, and again by a sync's run starting while a maintenance run
    in the same process logged (``tests/dagster_layer/test_maintenance.py``, a CI run hung). With no handlers
    configured the call returns no handlers anyway, so it is skipped; configured ``python_logs`` handlers
    keep Dagster's own path.
    """
    if instance.get_python_log_dagster_handler_config():
        if _log.isEnabledFor(logging.WARNING):
            _log.warning("icecdc: python_logs.dagster_handler_config reconfigures logging at every run start; "
                         "two runs in one process (warm launcher lanes, a sync) can deadlock on it (a Dagster issue)")
        return
    instance.get_yaml_python_handlers = list  # type: ignore[method-assign]  # what dictConfig yields here: none
