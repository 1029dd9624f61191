"""The Spark resource is dagster-pyspark's ``LazyPySparkResource``: a Dagster user's ``spark_config``
(flat or nested, from the pipeline file or from their own resource) reaches the session, which is still the
process's one warm session, attached to the catalog and shared by every caller."""

import json
import subprocess
import sys

import yaml
from dagster_pyspark import LazyPySparkResource, PySparkResource

from icecdc_dagster.resources import SparkResource
from tests.helpers import TEST_SPARK_CONF, write_pipeline

PROBE = """
import json, sys
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_resources
from icecdc_dagster.resources.keys import CATALOG_KEY, SPARK_KEY
resources = build_resources(load_config(sys.argv[1]))
spark, catalog = resources[SPARK_KEY], resources[CATALOG_KEY]
session = spark.session(catalog)
conf = session.sparkContext.getConf()
print(json.dumps({"same": session is spark.spark_session and spark.spark_context is session.sparkContext,
                  "memory": conf.get("spark.executor.memory"), "nested": conf.get("spark.icecdc.probe"),
                  "partitions": session.conf.get("spark.sql.shuffle.partitions"),
                  "tables": [r.namespace for r in session.sql("SHOW NAMESPACES IN " + catalog.name).collect()]}))
"""


def test_a_users_spark_config_reaches_the_session(spark, catalog_settings, catalog, tmp_path):
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog_settings.name}.db")
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [])
    config = yaml.safe_load(path.read_text())
    config["spark"]["spark_config"] = {"spark.executor.memory": "1g", "spark": {"icecdc": {"probe": "nested-key"}}}
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"same": True, "memory": "1g", "nested": "nested-key",
                    "partitions": TEST_SPARK_CONF["spark.sql.shuffle.partitions"], "tables": ["db"]}


def test_a_users_pyspark_resource_is_taken_unchanged():
    for theirs in (LazyPySparkResource(spark_config={"spark.executor.memory": "3g", "spark.master": "local[1]"}),
                   PySparkResource(spark_config={"spark": {"driver": {"memory": "1g"}}})):
        ours = SparkResource.from_pyspark(theirs, conf={"spark.sql.shuffle.partitions": "3"})
        assert isinstance(ours, LazyPySparkResource)
        settings = ours.settings()
        assert {k: settings.conf[k] for k in ("spark.sql.shuffle.partitions",)} == {"spark.sql.shuffle.partitions": "3"}
        expected = {"spark.executor.memory": "3g"} if "spark.master" in theirs.spark_config else {
            "spark.driver.memory": "1g"}
        assert expected.items() <= settings.conf.items()
    assert SparkResource.from_pyspark(LazyPySparkResource(spark_config={"spark.master": "local[1]"})).settings(
    ).master == "local[1]"


def test_a_users_java_options_come_after_ours_never_instead():
    """A user's GC or JIT flags must not drop our log4j configuration or SQLite's native-library path."""
    from icecdc_dagster.runtime.spark import SparkSettings, spark_builder_conf

    theirs = "-XX:+UseG1GC -XX:TieredStopAtLevel=1"
    plain = spark_builder_conf(SparkSettings(), [])
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        conf = spark_builder_conf(SparkSettings(conf={key: theirs}), [])
        assert conf[key] == f"{plain[key]} {theirs}" and "-Dlog4j.configurationFile=file:" in conf[key]


def test_a_local_session_has_one_shuffle_partition_per_slot_and_a_cluster_keeps_sparks_default():
    import os

    from icecdc_dagster.runtime.spark import SparkSettings, local_cores, spark_builder_conf

    cores = os.cpu_count() or 1
    assert [local_cores(m) for m in ("local", "local[3]", "local[*]", "local[4,2]", "local-cluster[2, 3, 1024]")] \
        == [1, 3, cores, 4, 6]
    assert local_cores("spark://host:7077") is None and local_cores("yarn") is None and local_cores("local[x]") is None
    assert spark_builder_conf(SparkSettings(master="local[3]"), [])["spark.sql.shuffle.partitions"] == "3"
    assert "spark.sql.shuffle.partitions" not in spark_builder_conf(SparkSettings(master="spark://h:7077"), [])
    ours = spark_builder_conf(SparkSettings(master="local[3]", conf={"spark.sql.shuffle.partitions": "16"}), [])
    assert ours["spark.sql.shuffle.partitions"] == "16"     # the pipeline file's setting wins


def test_a_local_driver_compiles_with_c2_only_what_is_hot_and_a_users_jit_flags_win():
    """A local session's JVM raises C2's thresholds (small batches' new classes stay in C1); a cluster keeps
    the JVM's defaults; a user's flags come after ours, so the JVM takes theirs."""
    from icecdc_dagster.runtime.spark import LOCAL_JIT_OPTIONS, SparkSettings, spark_builder_conf

    local = spark_builder_conf(SparkSettings(master="local[2]"), [])["spark.driver.extraJavaOptions"].split()
    assert all(option in local for option in LOCAL_JIT_OPTIONS)
    cluster = spark_builder_conf(SparkSettings(master="spark://h:7077"), [])["spark.driver.extraJavaOptions"]
    assert "Tier4" not in cluster
    theirs = spark_builder_conf(SparkSettings(master="local[2]", conf={
        "spark.driver.extraJavaOptions": "-XX:Tier4InvocationThreshold=5000"}), [])["spark.driver.extraJavaOptions"]
    assert theirs.split()[-1] == "-XX:Tier4InvocationThreshold=5000"
