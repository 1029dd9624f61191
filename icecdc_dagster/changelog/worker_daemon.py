"""A PySpark worker daemon that imports the changelog's Arrow reader before it forks workers.

Spark kills a Python worker after a minute idle; every new worker of the stock daemon imports pyiceberg's
Arrow reader again (~0.6 CPU-s) before it reads a group. With this daemon
(``spark.python.daemon.module=icecdc_dagster.changelog.worker_daemon``) the forked workers inherit the
imports. Only modules that start no thread at import are loaded here (a fork keeps no thread).
"""

import pyiceberg.expressions  # noqa: F401
import pyiceberg.io.pyarrow  # noqa: F401
import pyiceberg.serializers  # noqa: F401
import pyiceberg.table  # noqa: F401
from pyspark import daemon

if __name__ == "__main__":
    daemon.manager()
