import struct
import zipfile

import pytest

from icecdc_dagster.runtime import jars
from icecdc_dagster.runtime.jackson_relocation import (
    SOURCE_PREFIX, TARGET_PREFIX, ClassFileError, relocate_class)


def _class_file(*utf8: bytes) -> bytes:
    pool = b"".join(b"\x01" + struct.pack(">H", len(s)) + s for s in utf8)
    # a Long constant takes two pool slots
    pool += b"\x05" + struct.pack(">q", 7)
    count = len(utf8) + 3
    return b"\xca\xfe\xba\xbe\x00\x00\x00\x3d" + struct.pack(">H", count) + pool + b"TAIL"


def test_relocate_class_renames_slash_and_dot_forms_and_keeps_the_rest():
    name = SOURCE_PREFIX + b"/core/JsonFactory"
    dotted = SOURCE_PREFIX.replace(b"/", b".") + b".core.Foo"
    out = relocate_class(_class_file(b"L" + name + b";", dotted, b"java/lang/Object"))
    assert TARGET_PREFIX + b"/core/JsonFactory;" in out
    assert TARGET_PREFIX.replace(b"/", b".") + b".core.Foo" in out
    assert SOURCE_PREFIX not in out
    assert out.endswith(struct.pack(">q", 7) + b"TAIL")


def test_relocate_class_rejects_non_class_files():
    with pytest.raises(ClassFileError):
        relocate_class(b"PK\x03\x04")


def test_relocated_jar_is_built_once_and_holds_jackson(tmp_path, monkeypatch):
    monkeypatch.setenv("ICECDC_CACHE_DIR", str(tmp_path))
    runtime = jars.iceberg_runtime_jar()
    built = jars.relocated_jackson_jar(runtime)
    mtime = built.stat().st_mtime_ns
    assert jars.relocated_jackson_jar(runtime) == built and built.stat().st_mtime_ns == mtime
    with zipfile.ZipFile(built) as jar:
        names = set(jar.namelist())
    assert "org/apache/iceberg/shaded/com/fasterxml/jackson/core/JsonFactoryBuilder.class" in names
    assert "org/apache/iceberg/shaded/com/fasterxml/jackson/databind/ObjectMapper.class" in names


def test_table_write_works_with_relocated_jar(spark, catalog_settings, catalog):
    """Without the relocated Jackson the first Iceberg write fails with NoClassDefFoundError."""
    name = catalog_settings.name
    spark.sql(f"CREATE TABLE {name}.db.t (id BIGINT) USING iceberg TBLPROPERTIES ('format-version'='3')")
    spark.sql(f"INSERT INTO {name}.db.t VALUES (1)")
    assert spark.table(f"{name}.db.t").count() == 1
