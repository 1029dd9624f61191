"""Python tasks run in workers of our daemon (runtime/worker_daemon.py): Spark's archives are not re-read
per task, what a task leaves alive is frozen for the collector, and a zip added to the session between
two tasks is still imported by the second (the reason PySpark invalidates import caches per task)."""

import zipfile

import pyarrow as pa


def _probe(batches):
    import gc
    import zipimport

    for batch in batches:
        yield pa.RecordBatch.from_pydict({
            "id": batch.column(0),
            "patched": [zipimport.zipimporter.invalidate_caches.__name__ == "_invalidate_unless_static"]
            * batch.num_rows,
            "frozen": [gc.get_freeze_count()] * batch.num_rows})


def _imported(batches):
    import icecdc_worker_daemon_probe

    for batch in batches:
        yield pa.RecordBatch.from_pydict({"id": batch.column(0),
                                          "value": [icecdc_worker_daemon_probe.VALUE] * batch.num_rows})


def test_python_tasks_run_in_our_daemon_and_see_zips_added_later(spark, tmp_path):
    rows = spark.range(0, 8, 1, 4).mapInArrow(_probe, "id long, patched boolean, frozen long").collect()
    assert sorted(r.id for r in rows) == list(range(8))
    assert all(r.patched for r in rows)
    assert all(r.frozen > 0 for r in rows)
    archive = tmp_path / "icecdc_worker_daemon_probe.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("icecdc_worker_daemon_probe.py", "VALUE = 42\n")
    spark.sparkContext.addPyFile(str(archive))
    rows = spark.range(0, 4, 1, 2).mapInArrow(_imported, "id long, value long").collect()
    assert sorted((r.id, r.value) for r in rows) == [(i, 42) for i in range(4)]
