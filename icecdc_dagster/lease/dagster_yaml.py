"""The instance settings that make daemon mode crash safe, written into a new ``DAGSTER_HOME``.

``icecdc`` writes this file only where none exists and never changes an existing one (merge the
keys into yours by hand). What each key buys:

- ``run_launcher``: Dagster's default launcher (a process per run) plus a worker health check
  read from the run's holder tags, so run monitoring can tell that a run's process died.
- ``run_monitoring``: the daemon fails a run whose worker died (health check) or that never
  started (``start_timeout_seconds``), without a person; the sensor then retries the batch.
  ``max_resume_run_attempts: 0``: a batch is re-executed from its start, never resumed mid-way.
- ``run_queue.tag_concurrency_limits``: at most one run per line (``icecdc/table``; an ingest line's
  hidden ``.dagster/icecdc/line``) leaves the queue at a time, whoever launched it (sensor, UI, backfill).
- ``storage`` (only with ``instance: {storage: postgres}`` in the pipeline file): runs, events and
  schedules in PostgreSQL, the URL read from an environment variable when the instance is opened, so
  the daemon, ``dagster dev`` and every ``icecdc`` command that share ``DAGSTER_HOME`` share it.
"""

import os
from pathlib import Path

from icecdc_dagster.errors import ConfigError

RECOMMENDED_DAGSTER_YAML = """\
# Written by icecdc for crash safety (run monitoring, one run per line). icecdc never overwrites
# this file; see docs/operations.md ("Operations: crashes"; the warm launcher: its first section).
run_launcher:
  module: icecdc_dagster.launcher
  class: MonitoredRunLauncher
run_queue:
  tag_concurrency_limits:
    - key: icecdc/table
      value:
        applyLimitPerUniqueValue: true
      limit: 1
    - key: .dagster/icecdc/line
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


def postgres_storage(url_env: str) -> str:
    """The ``dagster.yaml`` block that puts the instance on PostgreSQL (URL from ``url_env``)."""
    return f"storage:\n  postgres:\n    postgres_url:\n      env: {url_env}\n"


def ensure_dagster_yaml(home: str | Path, postgres_url_env: str | None = None) -> bool:
    """Write the recommended ``dagster.yaml`` into ``home`` if it has none; True if written.

    ``postgres_url_env``: the instance is on PostgreSQL (the storage block is added). An existing file
    that does not put the instance on PostgreSQL is an error naming the block to merge in (never edited)."""
    path = Path(home) / "dagster.yaml"
    if path.exists():
        if postgres_url_env and "postgres" not in path.read_text():
            raise ConfigError(f"{path}: the pipeline file puts the Dagster instance on PostgreSQL but this "
                              f"dagster.yaml does not; merge this block into it:\n{postgres_storage(postgres_url_env)}")
        return False
    staged = path.with_name(f".dagster.yaml.{os.getpid()}")
    text = RECOMMENDED_DAGSTER_YAML + (postgres_storage(postgres_url_env) if postgres_url_env else "")
    staged.write_text(text)
    os.replace(staged, path)  # atomic: a concurrent reader sees no file or the whole file
    return True
