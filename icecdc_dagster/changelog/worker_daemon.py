"""The worker daemon under its first name (kept for ``spark.python.daemon.module`` settings that name it):
:mod:`icecdc_dagster.runtime.worker_daemon`."""

from icecdc_dagster.runtime.worker_daemon import run

if __name__ == "__main__":
    run()
