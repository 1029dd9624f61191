"""Run launchers for the Dagster daemon: ``WarmRunLauncher`` (runs in warm lanes of the daemon's
process, one SparkSession) and ``MonitoredRunLauncher`` (a process per run, with a worker health check).

``dagster.yaml`` files name them by this module path (``module: icecdc_dagster.launcher``), so this
package only re-exports them. Operator's manual: docs/warm-launcher.md.
"""

from icecdc_dagster.launcher.monitored_launcher import MonitoredRunLauncher
from icecdc_dagster.launcher.run_profile import PROFILE_ENV
from icecdc_dagster.launcher.sqlite_tuning import SQLITE_SYNCHRONOUS, set_sqlite_synchronous
from icecdc_dagster.launcher.warm_launcher import DEFAULT_SWITCH_INTERVAL_MS, WarmRunLauncher

__all__ = ["DEFAULT_SWITCH_INTERVAL_MS", "PROFILE_ENV", "SQLITE_SYNCHRONOUS", "MonitoredRunLauncher", "WarmRunLauncher",
           "set_sqlite_synchronous"]
