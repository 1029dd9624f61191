"""A local session writes files through our Hadoop local file system (runtime/LocalFileSystem.java): the same
files, checksums and permissions as Hadoop's own, without a ``chmod`` process per file."""

import os
import stat
from pathlib import Path

from icecdc_dagster.runtime import local_fs
from icecdc_dagster.runtime.spark import SparkSettings, spark_builder_conf


def test_a_local_session_uses_it_and_a_cluster_does_not():
    local = spark_builder_conf(SparkSettings(master="local[2]"), [])
    assert local["spark.hadoop.fs.file.impl"] == local_fs.CLASS_NAME
    assert Path(local["spark.driver.extraClassPath"]).is_file()
    cluster = spark_builder_conf(SparkSettings(master="spark://somewhere:7077"), [])
    assert "spark.hadoop.fs.file.impl" not in cluster and "spark.driver.extraClassPath" not in cluster


def test_a_users_class_path_comes_after_ours_and_their_file_system_wins():
    ours = spark_builder_conf(SparkSettings(), [])["spark.driver.extraClassPath"]
    theirs = {"spark.driver.extraClassPath": "/opt/their.jar",
              "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem"}
    conf = spark_builder_conf(SparkSettings(conf=theirs), [])
    assert conf["spark.driver.extraClassPath"] == f"{ours}{os.pathsep}/opt/their.jar"
    assert conf["spark.hadoop.fs.file.impl"] == "org.apache.hadoop.fs.LocalFileSystem"


def test_iceberg_files_are_written_with_hadoops_permissions_and_checksums(spark, catalog, catalog_settings):
    jvm = spark._jvm  # noqa: SLF001
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), spark._jsc.hadoopConfiguration())  # noqa: SLF001
    assert fs.getClass().getName() == local_fs.CLASS_NAME
    spark.sql(f"CREATE TABLE {catalog_settings.name}.db.t (id bigint, region string) USING iceberg "
              "PARTITIONED BY (region)")
    spark.sql(f"INSERT INTO {catalog_settings.name}.db.t VALUES (1, 'eu'), (2, 'us')")
    expected = 0o666 & ~0o022  # Hadoop's default file permission under its default umask (fs.permissions.umask-mode)
    warehouse = Path(str(catalog_settings.warehouse).removeprefix("file://"))
    files = [p for p in warehouse.rglob("*") if p.is_file()]
    data = [p for p in files if p.suffix == ".parquet"]
    assert len(data) == 2 and all(p.with_name(f".{p.name}.crc").is_file() for p in data)  # checksums kept
    metadata = [p for p in files if p.name.endswith(".metadata.json")]
    assert metadata
    assert {stat.S_IMODE(p.stat().st_mode) for p in data + metadata} == {expected}
