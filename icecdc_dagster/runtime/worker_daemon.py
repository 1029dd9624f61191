"""A PySpark worker daemon whose Python tasks cost their work, not ~0.14 CPU-s of set-up each.

Sessions built by :func:`icecdc_dagster.runtime.spark.build_spark_session` use it unless their conf names
another ``spark.python.daemon.module``. Measured on an empty
``mapInArrow`` task (a reused worker, Spark 3.5, Python 3.11), the stock daemon spends per task:

- ~0.07 CPU-s in ``importlib.invalidate_caches()``, which PySpark's worker calls at the start of every
  task: each ``zipimporter`` re-reads its archive's whole directory, and a mapInArrow worker holds 13 of
  them on ``pyspark.zip`` (~800 entries each) plus spark-core's jar (~5,000 entries). Spark's own
  archives (those on ``sys.path`` when the daemon starts) never change while a worker lives, so their
  importers keep their directory; archives added later (``addPyFile``) are re-read as before.
- ~0.07 CPU-s in the full ``gc.collect()`` the daemon runs after every task, over every object of
  pyarrow, pyiceberg and pyspark. Objects that exist before the fork, and those a task leaves alive
  (imports, cached table metadata), are frozen (``gc.freeze``), so the collection after a task walks only
  what that task allocated since. A frozen object is still freed when its last reference goes.

Spark also kills a worker after a minute idle, and each new worker of the stock daemon imports
pyiceberg's Arrow reader again (~0.6 CPU-s) before it reads a group; workers forked from this daemon
inherit those imports. Only modules that start no thread at import are loaded here (a fork keeps none).
"""

import gc
import sys
import zipimport
from typing import Any

import pyiceberg.expressions  # noqa: F401
import pyiceberg.io.pyarrow  # noqa: F401
import pyiceberg.serializers  # noqa: F401
import pyiceberg.table  # noqa: F401
from pyspark import daemon

_STATIC_ARCHIVES = frozenset(p for p in sys.path if p.endswith((".zip", ".jar", ".egg")))
_invalidate = zipimport.zipimporter.invalidate_caches
_worker_main = getattr(daemon, "worker_main")  # noqa: B009 - not in pyspark's stubs


def _invalidate_unless_static(importer: zipimport.zipimporter) -> None:
    if importer.archive not in _STATIC_ARCHIVES:
        _invalidate(importer)


def _main_then_freeze(infile: Any, outfile: Any) -> Any:
    """One task, then its garbage collected and its survivors frozen: the daemon's own full collection
    after the task then walks nothing old."""
    try:
        return _worker_main(infile, outfile)
    finally:
        gc.collect()
        gc.freeze()


zipimport.zipimporter.invalidate_caches = _invalidate_unless_static  # type: ignore[method-assign,assignment]
setattr(daemon, "worker_main", _main_then_freeze)  # noqa: B010 - daemon.worker() calls it by this name



def run() -> None:
    """The daemon's main loop, with everything imported so far frozen for the garbage collector."""
    gc.collect()
    gc.freeze()
    daemon.manager()


if __name__ == "__main__":
    run()
