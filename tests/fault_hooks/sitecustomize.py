"""Test-only fault injection for subprocesses (the product has no kill switch).

A test puts this directory first on a subprocess's ``PYTHONPATH`` (``tests.helpers.fault_env``); Python imports
``sitecustomize`` at start-up, and this one patches the product function at which the process must die, once
that module is imported (so a process that never imports it, such as a Spark Python worker, pays nothing).
``ICECDC_TEST_FAULT`` names the moment:

- ``kill-after-commit-before-ack``: a stream batch committed to Iceberg, not yet acknowledged to the broker;
- ``kill-after-write-before-commit``: an ingest batch's files written and staged, ``main`` not yet moved
  (only for tables whose name ends with ``ICECDC_TEST_FAULT_TABLE``).
"""

import importlib.abc
import importlib.util
import os
import signal
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

FAULT_ENV = "ICECDC_TEST_FAULT"
FAULT_TABLE_ENV = "ICECDC_TEST_FAULT_TABLE"


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_after_commit(module: ModuleType) -> None:
    """Wrap ``ingest_stream_batch`` so that the reader's commit, once it returned, kills the process."""
    real = module.ingest_stream_batch

    def ingest_stream_batch(spark: Any, catalog_name: str, entry: Any, reader: Any) -> Any:
        commit = reader.commit

        def commit_then_die(*args: Any, **kwargs: Any) -> Any:
            commit(*args, **kwargs)
            _die()

        reader.commit = commit_then_die
        return real(spark, catalog_name, entry, reader)

    module.ingest_stream_batch = ingest_stream_batch


def _kill_before_publish(module: ModuleType) -> None:
    """Wrap ``publish`` (staged snapshot -> ``main``) so that it kills the process before moving ``main``."""
    real = module.publish
    suffix = os.environ.get(FAULT_TABLE_ENV, "")

    def publish(jtable: Any, properties: Any, ledger: bool, table: str = "", *args: Any, **kwargs: Any) -> Any:
        if table.endswith(suffix):
            _die()
        return real(jtable, properties, ledger, table, *args, **kwargs)

    module.publish = publish


FAULTS: dict[str, tuple[str, Callable[[ModuleType], None]]] = {
    "kill-after-commit-before-ack": ("icecdc_dagster.steps.ingest_entry", _kill_after_commit),
    "kill-after-write-before-commit": ("icecdc_dagster.writer.exactly_once", _kill_before_publish),
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds one module through the other finders and patches it right after it executed."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)   # once: the real finders locate the module
        spec = importlib.util.find_spec(name)
        loader = spec.loader if spec is not None else None
        if loader is None:
            return spec
        exec_module = loader.exec_module

        def exec_then_patch(module: ModuleType) -> None:
            exec_module(module)
            self.patch(module)

        loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


if os.environ.get(FAULT_ENV) in FAULTS:
    sys.meta_path.insert(0, _PatchAfterImport(*FAULTS[os.environ[FAULT_ENV]]))
