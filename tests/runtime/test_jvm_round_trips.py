"""The session's JVM view resolves each class or package name with one py4j round trip per process."""

import pytest
from pyspark.sql import functions as F

from icecdc_dagster.runtime.java import java_map, jvm


@pytest.fixture
def round_trips(spark):
    """The commands sent through the session's real py4j client, except py4j's own memory management
    (releases of Java objects whose Python proxies were collected, sent whenever that happens)."""
    client = jvm(spark)._gateway_client  # noqa: SLF001
    sent: list[str] = []
    original = client.send_command

    def counting(command, *args, **kwargs):  # noqa: ANN001, ANN202
        if not command.startswith("m\n"):
            sent.append(command)
        return original(command, *args, **kwargs)

    client.send_command = counting
    yield sent
    del client.send_command  # the instance attribute shadowed the class's method


def test_a_resolved_class_is_kept_and_a_miss_is_not(spark, round_trips):
    view = jvm(spark)
    fresh = "org.apache.spark.sql.catalyst.util.DateTimeConstants"
    first = view.org.apache.spark.sql.catalyst.util.DateTimeConstants
    asked = len(round_trips)
    again = view.org.apache.spark.sql.catalyst.util.DateTimeConstants
    assert again is first and len(round_trips) == asked, "the second lookup must not reach the JVM"
    assert first._fqn == fresh  # noqa: SLF001
    assert int(again.MICROS_PER_SECOND) == 1_000_000  # still a live class: members are asked each time
    for _ in range(2):  # py4j calls any name that is not a class a package: that answer is not kept
        before = len(round_trips)
        missing = view.org.apache.spark.NoSuchClassAnywhere
        assert len(round_trips) == before + 1, "the packages on the way were kept, the miss is asked again"
        with pytest.raises(TypeError):  # py4j: a package cannot be called
            missing()


def test_functions_reach_the_jvm_without_class_lookups_after_the_first(spark, round_trips):
    frame = spark.range(3).select((F.col("id") + F.lit(1)).alias("n"))
    assert [r.n for r in frame.collect()] == [1, 2, 3]
    lookups = [c for c in round_trips if c.startswith("r\nu\n")]  # py4j: reflection, get unknown member
    before = len(lookups)
    spark.range(2).select(F.col("id"), F.lit(7), F.when(F.col("id") > 0, F.lit("x")))
    lookups = [c for c in round_trips if c.startswith("r\nu\n")]
    assert len(lookups) == before, lookups[before:]


def test_a_static_method_is_kept_and_a_static_field_is_asked_each_time(spark, round_trips):
    functions = jvm(spark).org.apache.spark.sql.functions
    functions.col  # noqa: B018
    before = len(round_trips)
    assert functions.col is functions.col and len(round_trips) == before
    system = jvm(spark).java.lang.System
    system.out  # noqa: B018  # a field: its value, read again each time
    before = len(round_trips)
    system.out  # noqa: B018
    assert len(round_trips) == before + 1


def test_java_map_reads_any_size_in_three_round_trips_and_keeps_every_value(spark, round_trips):
    entries = {f"key {i}": f"v={i}, \"quoted\" ü\n{'x' * i}" for i in range(40)}
    jmap = jvm(spark).java.util.HashMap()
    for key, value in entries.items():
        jmap.put(key, value)
    jmap.put("a number", jvm(spark).java.lang.Long.valueOf(2**62))
    before = len(round_trips)
    got = java_map(jmap)
    assert len(round_trips) - before <= 3
    assert got == {**entries, "a number": 2**62}
