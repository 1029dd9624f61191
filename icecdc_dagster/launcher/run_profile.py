"""Opt-in per-run measurements of the warm launcher's lanes (``$ICECDC_RUN_PROFILE``), for
``bench/freshness.py`` to split a run's cost."""

import json
import os
import sys
import threading
import time
from typing import Any

PROFILE_ENV = "ICECDC_RUN_PROFILE"


class RunProfile:
    """Opt-in (``$ICECDC_RUN_PROFILE`` = a file): one JSON line per run executed here - its wall
    time, the Python CPU time of its worker thread and the Spark jobs of its job group. What
    ``bench/freshness.py`` reads to split a run's cost; unset (default), nothing is measured."""

    _write = threading.Lock()

    def __init__(self, path: str, run_id: str) -> None:
        self.path, self.run_id = path, run_id
        self.wall, self.cpu = time.monotonic(), time.thread_time()

    @classmethod
    def start(cls, run_id: str) -> "RunProfile | None":
        path = os.environ.get(PROFILE_ENV)
        return cls(path, run_id) if path else None

    def finish(self) -> None:
        record: dict[str, Any] = {"run_id": self.run_id, "lane": threading.current_thread().name,
                                  "ended": time.time(), "wall_s": round(time.monotonic() - self.wall, 3),
                                  "thread_cpu_s": round(time.thread_time() - self.cpu, 3)}
        context = _spark_context_or_none()
        if context is not None:
            try:
                job_ids = sorted(context.statusTracker().getJobIdsForGroup(self.run_id))
                record["spark_jobs"] = len(job_ids)
                record["jobs"] = [_job_record(context, job_id) for job_id in job_ids]
            except Exception:  # noqa: BLE001 - a measurement only
                pass
        with self._write, open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


def _job_record(context: Any, job_id: int) -> list[Any]:
    """[what made the job (its call site: file:line, or Spark's own name), its wall seconds, when it was
    submitted (epoch s)]: Spark's own job record, for a split of a run's jobs by step and by the code that
    made them. (Lanes running at once can swap Python call sites: Spark keeps the last one set.)"""
    data = context._jsc.sc().statusStore().job(job_id)  # noqa: SLF001 - Spark's job records have no Python API
    name = str(data.name()).split(" at ")
    site = name[-1].rsplit("/", 1)[-1] if len(name) > 1 and ".py:" in name[-1] else name[0]
    submitted, completed = data.submissionTime(), data.completionTime()
    seconds = ((completed.get().getTime() - submitted.get().getTime()) / 1000
               if submitted.isDefined() and completed.isDefined() else None)
    return [site, seconds, submitted.get().getTime() / 1000 if submitted.isDefined() else None]


def _spark_context_or_none() -> Any:
    """The active SparkContext, without importing pyspark (a run that never started Spark has none)."""
    pyspark = sys.modules.get("pyspark")
    context = getattr(getattr(pyspark, "SparkContext", None), "_active_spark_context", None)
    return context if context is not None and context._jsc is not None else None
