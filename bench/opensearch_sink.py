"""OpenSearchSink against raw opensearch-py bulk, and the driver's peak memory at two sizes.

Three measurements in one run, each in its own child process (so one run's heap, documents or
server never count in another's figures), each child with its own fresh osmem server:

1. Throughput at ``--docs`` (default 1M): ours = ``OpenSearchSink.apply`` of one batch of N changed
   rows, everything a batch costs (checkpoint read, index creation, Spark JSON rendering,
   executor-side bulk writes with external versions, refresh, checkpoint write); the events come
   from ``spark.range`` (not cached: a cache would sit in the driver JVM). raw = opensearch-py
   ``helpers.parallel_bulk`` (4 threads = our 2 Spark tasks x ``parallelism`` 2, chunks of 500)
   of the same documents (same ids, external versions and JSON, rendered by Spark and collected
   BEFORE its clock starts), into an index with the same mappings. Order: raw(base), ours(base),
   ours(N), raw(N), so each size's pair runs back to back. ``ratio`` = ours docs/s / raw docs/s at N.
   A third side at N, ``spark_job``: the job a user writes by hand without our sink, timed like ours
   (rendering inside the clock, JVM warm): the same documents rendered by Spark, then
   ``foreachPartition`` with ``parallel_bulk`` (2 threads per task, chunks of 500), refresh.
   ``spark_job_ratio`` = ours docs/s / its docs/s. ``cpu_s``, ``raw_cpu_s``, ``spark_job_cpu_s``: CPU
   seconds of every process of each side at N (driver, JVM, Python workers, osmem server).
2. ``rss_ratio``: the driver's peak RSS of ours at N / at ``--base-docs`` (default N/10).
3. ``export_rss_ratio``: the same for a line's initial export of a ``--export-rows``-row Iceberg
   table against one of ``--export-base-rows`` (default 1/10): ``compute_batch`` (export with the key
   check) -> ``ChangelogStore.write`` -> ``read_events`` -> the sink asset's per-change-type count ->
   ``OpenSearchSink.apply``, as the changelog and sink assets run it (without Dagster). The tables are
   written by a separate child first. ``--export-sink none`` stops after the count (osmem cannot hold
   10M documents, see below).

Driver = this child's Python process AND its JVM (in local mode the JVM also runs the executors'
JVM side). Peak RSS = ``VmHWM`` from ``/proc/<pid>/status`` of each, read at the end of the child
(the kernel's high-water mark: no sampling gaps); the JVM's pid comes from
``ProcessHandle.current()``. ``rss_*`` keys are their sum. Not driver, reported apart: the Python
workers (executors; sampled every second) and the osmem server (its own process, ``VmHWM``).

osmem indexes every mapped field slowly and in memory (~11 KB and ~0.8 ms per document with the
schema's mappings, so 1M documents = ~11 GB and ~15 min per side); ``--mapping stored`` (default)
creates both indexes with ``{"dynamic": false}``: documents are stored and versioned, no field is
indexed (~2.8 KB per document, ~10k docs/s), so the server is no longer the bottleneck and the
ratio measures the clients. ``--mapping schema`` uses the sink's derived mappings on both sides.

Run: PYTHONPATH=. .venv/bin/python bench/opensearch_sink.py [--docs N] [--base-docs N]
     [--export-rows N] [--export-base-rows N] [--export-sink opensearch|none] [--mapping stored|schema]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from proc_cpu import cpu_s, descendants

TABLE = "db.products"
CAT = "bench_os"
DRIVER_MEMORY_ENV = "ICECDC_BENCH_DRIVER_MEMORY"  # --driver-memory, read by every child
SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": os.environ.get(DRIVER_MEMORY_ENV, "2g")}
STORED_MAPPING = {"dynamic": False, "properties": {}}
WARM_UP_DOCS = 10_000
RAW_THREADS = 4  # = 2 Spark tasks x OpenSearchSinkSettings.parallelism (2)
CHUNK = 500


def schema():
    from pyiceberg import types as it
    from pyiceberg.schema import Schema

    return Schema(
        it.NestedField(1, "id", it.LongType(), required=True),
        it.NestedField(2, "name", it.StringType(), required=False),
        it.NestedField(3, "category", it.StringType(), required=False),
        it.NestedField(4, "price", it.DecimalType(10, 2), required=False),
        it.NestedField(5, "qty", it.IntegerType(), required=False),
        it.NestedField(6, "updated_at", it.TimestamptzType(), required=False),
        identifier_field_ids=[1])


def row_columns():
    """The source columns of the bench's rows, from a ``spark.range`` id."""
    from pyspark.sql import functions as F

    return [F.col("id"),
            F.concat(F.lit("product "), F.col("id").cast("string")).alias("name"),
            F.concat(F.lit("cat-"), (F.col("id") % 37).cast("string")).alias("category"),
            (F.col("id") % 10_000 / 100).cast("decimal(10,2)").alias("price"),
            (F.col("id") % 500).cast("int").alias("qty"),
            F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id")).alias("updated_at")]


def events(spark, start: int, end: int, snapshot_id: int, sequence_number: int):
    """CDC events of one snapshot: INSERTs and UPDATE_AFTERs (all INDEX actions), one per key."""
    from pyspark.sql import functions as F

    from icecdc_dagster import batch as b

    return (spark.range(start, end, numPartitions=2)
            .select(*row_columns(),
                    F.when(F.col("id") % 3 == 0, F.lit(b.UPDATE_AFTER)).otherwise(F.lit(b.INSERT)).alias(b.CHANGE_TYPE),
                    F.lit(snapshot_id).cast("long").alias(b.COMMIT_SNAPSHOT_ID),
                    F.lit(sequence_number).cast("long").alias(b.COMMIT_SEQUENCE_NUMBER),
                    F.lit(0).alias(b.CHANGE_ORDINAL),
                    F.lit("overwrite").alias(b.ICEBERG_OPERATION),
                    F.lit(TABLE).alias(b.ICEBERG_TABLE_NAME),
                    F.lit(snapshot_id).cast("long").alias(b.ICEBERG_SNAPSHOT_ID),
                    F.col("id").cast("string").alias(b.DOCUMENT_ID),
                    F.lit(b.INDEX_ACTION).alias(b.BULK_ACTION)))


def batch(snapshot_id: int, sequence_number: int, parent: int | None):
    from icecdc_dagster.batch import BatchInfo

    return BatchInfo(TABLE, snapshot_id, sequence_number, snapshot_id, () if parent is None else (parent,),
                     "overwrite", 0, is_export=parent is None, identifier_columns=("id",),
                     snapshot_ids=(snapshot_id,))


# --- memory of processes -------------------------------------------------------------------------

def status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class WorkerPeak:
    """Peak summed RSS of the JVM's child processes (PySpark's daemon and workers: the executors)."""

    def __init__(self, jvm_pid: int) -> None:
        self.jvm_pid, self.peak_kb, self._stop = jvm_pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.peak_kb = max(self.peak_kb, sum(status_kb(p, "VmRSS") for p in descendants(self.jvm_pid)))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_kb / 1024


def cpu_split(jvm: int | None, server_pid: int | None) -> dict[str, float]:
    """CPU seconds so far: this process, the driver JVM, the processes under the JVM (Python workers),
    the osmem server."""
    return {"cpu_driver": cpu_s(os.getpid()), "cpu_jvm": cpu_s(jvm) if jvm else 0.0,
            "cpu_workers": sum(cpu_s(p) for p in descendants(jvm)) if jvm else 0.0,
            "cpu_osmem": cpu_s(server_pid) if server_pid else 0.0}


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


def jvm_pid(spark) -> int:
    return int(spark._jvm.java.lang.ProcessHandle.current().pid())


def jvm_heap(spark) -> dict[str, float]:
    """The driver JVM's heap as committed at the end (what G1 grew it to), non-heap committed
    (metaspace, code cache), and the live heap after a full GC (what it retains)."""
    bean = spark._jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
    committed = bean.getHeapMemoryUsage().getCommitted() / 2**20
    non_heap = bean.getNonHeapMemoryUsage().getCommitted() / 2**20
    spark._jvm.java.lang.System.gc()
    return {"heap_committed_mb": committed, "non_heap_committed_mb": non_heap,
            "heap_after_gc_mb": bean.getHeapMemoryUsage().getUsed() / 2**20}


def driver_memory(spark, workers: WorkerPeak, server_pid: int | None) -> dict[str, float]:
    pid = jvm_pid(spark)
    return {"py_hwm_mb": status_kb(os.getpid(), "VmHWM") / 1024, "jvm_hwm_mb": status_kb(pid, "VmHWM") / 1024,
            **jvm_heap(spark), "workers_peak_mb": workers.stop(),
            "osmem_hwm_mb": status_kb(server_pid, "VmHWM") / 1024 if server_pid else 0.0}


def spark_session(catalog=None):
    from icecdc_dagster.runtime.spark import SparkSettings, attach_catalog, build_spark_session

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = build_spark_session(SparkSettings(master="local[2]", app_name="bench-opensearch-sink", conf=SPARK_CONF))
    if catalog is not None:
        attach_catalog(spark, catalog)
    return spark


def mappings(kind: str) -> dict[str, Any]:
    from icecdc_dagster.sinks.opensearch import iceberg_schema_to_mapping

    return STORED_MAPPING if kind == "stored" else iceberg_schema_to_mapping(schema())


def sink_settings(url: str, index: str, kind: str):
    from icecdc_dagster.sinks.opensearch import OpenSearchSinkSettings

    # evolve_mapping off with the stored mapping: it would map every column the mapping leaves out.
    return OpenSearchSinkSettings(hosts=(url,), index=index, mapping=mappings(kind) if kind == "stored" else None,
                                  evolve_mapping=kind != "stored")


def start_server():
    from osmem_server import OsmemServer

    return OsmemServer.start(japanese=False)


def warm_up_server(url: str, kind: str) -> None:
    """Untimed: a fresh server's first bulk requests are slower; both sides get the same warm-up."""
    from opensearchpy import OpenSearch, helpers

    client = OpenSearch(hosts=[url], timeout=120)
    client.indices.create(index="warm-up", body={"mappings": mappings(kind)})
    docs = ({"_index": "warm-up", "_id": str(i), "_source": {"id": i, "name": f"product {i}"}}
            for i in range(WARM_UP_DOCS))
    helpers.bulk(client, docs, chunk_size=CHUNK)
    client.close()


# --- children ------------------------------------------------------------------------------------

def child_ours(n: int, kind: str) -> dict[str, Any]:
    from opensearchpy import OpenSearch

    from icecdc_dagster.sinks.opensearch import OpenSearchSink

    spark = spark_session()
    workers = WorkerPeak(jvm_pid(spark))
    server = start_server()
    try:
        warm_up_server(server.url, kind)
        warm = OpenSearchSink(sink_settings(server.url, "bench-warm", kind), schema())
        warm.apply(batch(5, 1, None), events(spark, 0, WARM_UP_DOCS, 5, 1))  # JVM and workers warm too
        warm.close()
        sink = OpenSearchSink(sink_settings(server.url, "bench-ours", kind), schema())
        cpu = cpu_split(jvm_pid(spark), server.pid)
        started = time.perf_counter()
        result = sink.apply(batch(7, 3, None), events(spark, 0, n, 7, 3))
        seconds = time.perf_counter() - started
        cpu = cpu_delta(cpu, cpu_split(jvm_pid(spark), server.pid))
        sink.close()
        assert result.counts["failed"] == 0 and result.counts["indexed"] == result.counts["actions"] == n, \
            result.counts
        count = OpenSearch(hosts=[server.url], timeout=120).count(index="bench-ours")["count"]
        assert count == n, (count, n)
        memory = driver_memory(spark, workers, server.pid)
        return {"n": n, "seconds": seconds, "dps": n / seconds, "partitions": result.details["partitions"], **memory,
                **cpu}
    finally:
        server.close()
        spark.stop()


def child_raw(n: int, kind: str) -> dict[str, Any]:
    from opensearchpy import OpenSearch, helpers

    from icecdc_dagster.sinks.opensearch.documents import ID, SOURCE, VERSION, bulk_rows

    spark = spark_session()
    documents = [(r[0], r[1], r[2]) for r in bulk_rows(events(spark, 0, n, 7, 3)).select(ID, VERSION, SOURCE)
                 .toLocalIterator()]
    spark.stop()
    server = start_server()
    try:
        warm_up_server(server.url, kind)
        client = OpenSearch(hosts=[server.url], timeout=120, pool_maxsize=RAW_THREADS + 1)
        client.indices.create(index="bench-raw", body={"mappings": mappings(kind)})
        actions = ({"_index": "bench-raw", "_id": doc_id, "_version": version, "_version_type": "external",
                    "_source": source} for doc_id, version, source in documents)
        cpu = cpu_split(None, server.pid)
        started = time.perf_counter()
        ok = sum(1 for success, _ in helpers.parallel_bulk(client, actions, thread_count=RAW_THREADS,
                                                           chunk_size=CHUNK) if success)
        client.indices.refresh(index="bench-raw")
        seconds = time.perf_counter() - started
        cpu = cpu_delta(cpu, cpu_split(None, server.pid))
        assert ok == n, (ok, n)
        count = client.count(index="bench-raw")["count"]
        assert count == n, (count, n)
        client.close()
        return {"n": n, "seconds": seconds, "dps": n / seconds,
                "osmem_hwm_mb": status_kb(server.pid, "VmHWM") / 1024, **cpu}
    finally:
        server.close()


def _bulk_partition(url: str, index: str, rows) -> None:
    """The hand-written job's foreachPartition body: the partition's rows straight into parallel_bulk."""
    from opensearchpy import OpenSearch, helpers

    client = OpenSearch(hosts=[url], timeout=120, pool_maxsize=RAW_THREADS // 2 + 1)
    actions = ({"_index": index, "_id": r[0], "_version": r[1], "_version_type": "external", "_source": r[2]}
               for r in rows)
    failed = [info for ok, info in helpers.parallel_bulk(client, actions, thread_count=RAW_THREADS // 2,
                                                         chunk_size=CHUNK) if not ok]
    client.close()
    if failed:
        raise RuntimeError(f"{len(failed)} bulk items failed, first: {failed[0]}")


def spark_job(spark, url: str, index: str, n: int) -> None:
    """The job a user writes by hand without our sink: render the same documents in Spark, then
    ``foreachPartition`` with ``parallel_bulk`` (2 threads per task = 4 in flight, as ours), refresh."""
    from functools import partial

    from opensearchpy import OpenSearch

    from icecdc_dagster.sinks.opensearch.documents import ID, SOURCE, VERSION, bulk_rows

    bulk_rows(events(spark, 0, n, 7, 3)).select(ID, VERSION, SOURCE).foreachPartition(partial(_bulk_partition, url,
                                                                                                index))
    client = OpenSearch(hosts=[url], timeout=120)
    client.indices.refresh(index=index)
    client.close()


def child_spark_job(n: int, kind: str) -> dict[str, Any]:
    """:func:`spark_job` timed like ours: rendering and sending inside the clock, JVM and workers warm."""
    from opensearchpy import OpenSearch

    spark = spark_session()
    server = start_server()
    try:
        warm_up_server(server.url, kind)
        client = OpenSearch(hosts=[server.url], timeout=120)
        for index in ("bench-job-warm", "bench-job"):
            client.indices.create(index=index, body={"mappings": mappings(kind)})
        spark_job(spark, server.url, "bench-job-warm", WARM_UP_DOCS)
        cpu = cpu_split(jvm_pid(spark), server.pid)
        started = time.perf_counter()
        spark_job(spark, server.url, "bench-job", n)
        seconds = time.perf_counter() - started
        cpu = cpu_delta(cpu, cpu_split(jvm_pid(spark), server.pid))
        count = client.count(index="bench-job")["count"]
        assert count == n, (count, n)
        client.close()
        return {"n": n, "seconds": seconds, "dps": n / seconds, **cpu}
    finally:
        server.close()
        spark.stop()


def catalog_settings(work: str):
    from icecdc_dagster.runtime.catalog import CatalogSettings

    return CatalogSettings(name=CAT, uri=f"sqlite:///{work}/catalog.db", warehouse=f"file://{work}/wh")


def source_name(rows: int) -> str:
    return f"db.src_{rows}"


def child_prepare(sizes: list[int], work: str) -> dict[str, Any]:
    """The source tables of the export runs (files of ~500k rows), written before any is measured."""

    settings = catalog_settings(work)
    catalog = settings.load_pyiceberg()
    catalog.create_namespace("db")
    spark = spark_session(settings)
    try:
        for rows in sizes:
            catalog.create_table(source_name(rows), schema(), properties={"format-version": "2"})
            (spark.range(0, rows, numPartitions=max(2, rows // 500_000)).select(*row_columns())
             .writeTo(f"{CAT}.{source_name(rows)}").append())
        return {"sizes": sizes}
    finally:
        spark.stop()


def child_export(rows: int, work: str, sink_kind: str, kind: str) -> dict[str, Any]:
    """A line's first batch, as the changelog asset then the sink asset run it."""
    from icecdc_dagster import changelog
    from icecdc_dagster.batch import CHANGE_TYPE
    from icecdc_dagster.sinks.opensearch import OpenSearchSink
    from icecdc_dagster.steps.batches import BatchRequest, compute_batch
    from icecdc_dagster.steps.changelog_store import ChangelogStore

    settings = catalog_settings(work)
    spark = spark_session(settings)
    workers = WorkerPeak(jvm_pid(spark))
    server = start_server() if sink_kind == "opensearch" else None
    try:
        if server is not None:
            warm_up_server(server.url, kind)
        name = source_name(rows)
        source = settings.load_pyiceberg().load_table(name)
        sid = source.metadata.current_snapshot().snapshot_id
        request = BatchRequest(name, (sid,), sid, identifier_columns=("id",))
        steps: dict[str, float] = {}
        started = time.perf_counter()
        store = ChangelogStore(spark, CAT, name)
        with changelog.staged_scans(spark):
            computed = compute_batch(spark, CAT, source, request)
            stored = store.write(computed.info, computed.rows, source.schema())
        steps["changelog_s"] = time.perf_counter() - started
        assert stored.rows == rows, stored.counts
        events = store.read_events(computed.info, use_row_id=False)
        if server is not None:
            sink = OpenSearchSink(sink_settings(server.url, "bench-export", kind), source.schema())
            result = sink.apply(computed.info, events)
            sink.close()
            assert result.counts["indexed"] == rows, result.counts
        steps["sink_s"] = time.perf_counter() - started - steps["changelog_s"]
        applied = {r[CHANGE_TYPE]: r["count"] for r in events.groupBy(CHANGE_TYPE).count().collect()}
        assert sum(applied.values()) == rows, applied
        seconds = time.perf_counter() - started
        return {"n": rows, "seconds": seconds, **steps, **driver_memory(spark, workers, server and server.pid)}
    finally:
        if server is not None:
            server.close()
        spark.stop()


# --- parent --------------------------------------------------------------------------------------

def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run_child(*args: str) -> dict[str, Any]:
    """One measurement in a fresh process; its last stdout line is ``CHILD <json>``."""
    load = load_average()
    command = [sys.executable, os.path.abspath(__file__), "--child", *args]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("CHILD ")]
    if done.returncode != 0 or not lines:
        sys.stdout.write(done.stdout)
        raise SystemExit(f"child {args} failed with exit code {done.returncode}")
    figures = json.loads(lines[-1][len("CHILD "):])
    figures["load_before"], figures["load_after"] = load, load_average()
    return figures


def rss(figures: dict[str, Any]) -> float:
    return figures["py_hwm_mb"] + figures["jvm_hwm_mb"]


def describe(label: str, f: dict[str, Any]) -> str:
    text = f"{label}: {f['n']:,} in {f['seconds']:.1f} s = {f['n'] / f['seconds']:,.0f}/s"
    if "py_hwm_mb" in f:
        text += (f"; driver peak RSS {rss(f):,.0f} MB (Python {f['py_hwm_mb']:,.0f} + JVM {f['jvm_hwm_mb']:,.0f}),"
                 f" JVM heap committed {f['heap_committed_mb']:,.0f} MB, after GC {f['heap_after_gc_mb']:,.0f} MB,"
                 f" non-heap {f['non_heap_committed_mb']:,.0f} MB; not driver: Python workers peak "
                 f"{f['workers_peak_mb']:,.0f} MB")
    if f.get("osmem_hwm_mb"):
        text += f", osmem {f['osmem_hwm_mb']:,.0f} MB"
    if "cpu_driver" in f:
        text += "; CPU-s " + ", ".join(f"{k[4:]} {f[k]:.1f}" for k in f if k.startswith("cpu_") and f[k])
    if "changelog_s" in f:
        text += f"; changelog step {f['changelog_s']:.1f} s, sink {f['sink_s']:.1f} s"
    return text + f" (load {f['load_before']} -> {f['load_after']})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--base-docs", type=int, default=None, help="default: --docs / 10")
    parser.add_argument("--export-rows", type=int, default=None, help="default: --docs; 0 skips the export")
    parser.add_argument("--export-base-rows", type=int, default=None, help="default: --export-rows / 10")
    parser.add_argument("--export-sink", choices=("opensearch", "none"), default="opensearch")
    parser.add_argument("--mapping", choices=("stored", "schema"), default="stored")
    parser.add_argument("--skip-sink", action="store_true", help="only the export runs")
    parser.add_argument("--driver-memory", default=None,
                        help="the driver JVM's heap (spark.driver.memory, default 2g): peak RSS follows the heap the "
                             "JVM is allowed, so a smaller one shows what a size really needs")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver_memory:
        os.environ[DRIVER_MEMORY_ENV] = SPARK_CONF["spark.driver.memory"] = args.driver_memory
    if args.child:
        role, *rest = args.child
        runners = {"ours": lambda: child_ours(int(rest[0]), rest[1]),
                   "raw": lambda: child_raw(int(rest[0]), rest[1]),
                   "spark_job": lambda: child_spark_job(int(rest[0]), rest[1]),
                   "prepare": lambda: child_prepare([int(s) for s in rest[1:]], rest[0]),
                   "export": lambda: child_export(int(rest[0]), rest[1], rest[2], rest[3])}
        print("CHILD " + json.dumps(runners[role]()), flush=True)
        return
    n, kind = args.docs, args.mapping
    base = args.base_docs or n // 10
    result: dict[str, str] = {}
    print(f"mapping={kind}, Spark {SPARK_CONF}, load {load_average()}", flush=True)
    if not args.skip_sink:
        raw_base = run_child("raw", str(base), kind)
        print(describe("raw parallel_bulk", raw_base), flush=True)
        ours_base = run_child("ours", str(base), kind)
        print(describe("ours", ours_base), flush=True)
        ours_n = run_child("ours", str(n), kind)
        print(describe("ours", ours_n), flush=True)
        raw_n = run_child("raw", str(n), kind)
        print(describe("raw parallel_bulk", raw_n), flush=True)
        job_n = run_child("spark_job", str(n), kind)
        print(describe("hand-written Spark job (foreachPartition + parallel_bulk)", job_n), flush=True)
        result |= {"ours_dps": f"{ours_n['dps']:.0f}", "raw_dps": f"{raw_n['dps']:.0f}",
                   "ratio": f"{ours_n['dps'] / raw_n['dps']:.3f}",
                   "ratio_base": f"{ours_base['dps'] / raw_base['dps']:.3f}",
                   "spark_job_dps": f"{job_n['dps']:.0f}", "spark_job_ratio": f"{ours_n['dps'] / job_n['dps']:.3f}",
                   "cpu_s": f"{sum(v for k, v in ours_n.items() if k.startswith('cpu_')):.1f}",
                   "raw_cpu_s": f"{sum(v for k, v in raw_n.items() if k.startswith('cpu_')):.1f}",
                   "spark_job_cpu_s": f"{sum(v for k, v in job_n.items() if k.startswith('cpu_')):.1f}",
                   f"rss_{base // 1000}k_mb": f"{rss(ours_base):.0f}", f"rss_{n // 1000}k_mb": f"{rss(ours_n):.0f}",
                   "rss_ratio": f"{rss(ours_n) / rss(ours_base):.3f}",
                   "py_rss_ratio": f"{ours_n['py_hwm_mb'] / ours_base['py_hwm_mb']:.3f}",
                   "jvm_rss_ratio": f"{ours_n['jvm_hwm_mb'] / ours_base['jvm_hwm_mb']:.3f}",
                   "heap_after_gc_mb": f"{ours_base['heap_after_gc_mb']:.0f}/{ours_n['heap_after_gc_mb']:.0f}"}
    export_rows = n if args.export_rows is None else args.export_rows
    if export_rows:
        export_base = args.export_base_rows or export_rows // 10
        work = tempfile.mkdtemp(prefix="bench-os-export-")
        try:
            started = time.perf_counter()
            run_child("prepare", work, str(export_base), str(export_rows))
            print(f"export tables written in {time.perf_counter() - started:.0f} s", flush=True)
            small = run_child("export", str(export_base), work, args.export_sink, kind)
            print(describe(f"export -> {args.export_sink}", small), flush=True)
            big = run_child("export", str(export_rows), work, args.export_sink, kind)
            print(describe(f"export -> {args.export_sink}", big), flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        result |= {f"export_rss_{export_base // 1000}k_mb": f"{rss(small):.0f}",
                   f"export_rss_{export_rows // 1000}k_mb": f"{rss(big):.0f}",
                   "export_rss_ratio": f"{rss(big) / rss(small):.3f}",
                   "export_py_rss_ratio": f"{big['py_hwm_mb'] / small['py_hwm_mb']:.3f}",
                   "export_jvm_rss_ratio": f"{big['jvm_hwm_mb'] / small['jvm_hwm_mb']:.3f}",
                   "export_sink": args.export_sink}
    result["load"] = load_average().replace(" ", "/")
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
