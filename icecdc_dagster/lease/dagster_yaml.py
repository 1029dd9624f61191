"""The instance settings that make daemon mode crash safe, written into a new ``DAGSTER_HOME``.

``icecdc`` writes this file only where none exists and never changes an existing one (merge the
keys into yours by hand). What each key buys:

- ``run_launcher``: Dagster's default launcher (a process per run) plus a worker health check
  read from the run's holder tags, so run monitoring can tell that a run's process died.
- ``run_monitoring``: the daemon fails a run whose worker died (health check) or that never
  started (``start_timeout_seconds``), without a person; the sensor then retries the batch.
  ``max_resume_run_attempts: 0``: a batch is re-executed from its start, never resumed mid-way.
- ``run_queue.tag_concurrency_limits``: at most one run per line (``icecdc/table``) leaves the
  queue at a time, whoever launched it (sensor, UI, backfill).
"""

import os
from pathlib import Path

RECOMMENDED_DAGSTER_YAML = """\
# Written by icecdc for crash safety (run monitoring, one run per line). icecdc never overwrites
# this file; see the README, "Operations: crashes". For the warm launcher, see "Freshness".
run_launcher:
  module: icecdc_dagster.launcher
  class: MonitoredRunLauncher
run_queue:
  tag_concurrency_limits:
    - key: icecdc/table
      value:
        applyLimitPerUniqueValue: true
      limit: 1
run_monitoring:
  enabled: true
  start_timeout_seconds: 180
  cancel_timeout_seconds: 180
  max_resume_run_attempts: 0
  poll_interval_seconds: 15
"""


def ensure_dagster_yaml(home: str | Path) -> bool:
    """Write the recommended ``dagster.yaml`` into ``home`` if it has none; True if written."""
    path = Path(home) / "dagster.yaml"
    if path.exists():
        return False
    staged = path.with_name(f".dagster.yaml.{os.getpid()}")
    staged.write_text(RECOMMENDED_DAGSTER_YAML)
    os.replace(staged, path)  # atomic: a concurrent reader sees no file or the whole file
    return True
