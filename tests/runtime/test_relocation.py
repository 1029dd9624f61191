import struct
import zipfile

import pytest

from icecdc_dagster.runtime import jars
from icecdc_dagster.runtime.relocation import HTTP_CLIENT, JACKSON, ClassFileError, empty_interface, relocate_class

SOURCE_PREFIX, TARGET_PREFIX = JACKSON.source, JACKSON.target


def _class_file(*utf8: bytes) -> bytes:
    pool = b"".join(b"\x01" + struct.pack(">H", len(s)) + s for s in utf8)
    # a Long constant takes two pool slots
    pool += b"\x05" + struct.pack(">q", 7)
    count = len(utf8) + 3
    return b"\xca\xfe\xba\xbe\x00\x00\x00\x3d" + struct.pack(">H", count) + pool + b"TAIL"


def test_relocate_class_renames_slash_and_dot_forms_and_keeps_the_rest():
    name = SOURCE_PREFIX + b"/core/JsonFactory"
    dotted = SOURCE_PREFIX.replace(b"/", b".") + b".core.Foo"
    out = relocate_class(_class_file(b"L" + name + b";", dotted, b"java/lang/Object"), JACKSON)
    assert TARGET_PREFIX + b"/core/JsonFactory;" in out
    assert TARGET_PREFIX.replace(b"/", b".") + b".core.Foo" in out
    assert SOURCE_PREFIX not in out
    assert out.endswith(struct.pack(">q", 7) + b"TAIL")


def test_relocate_class_rejects_non_class_files():
    with pytest.raises(ClassFileError):
        relocate_class(b"PK\x03\x04", JACKSON)


def test_http_client_relocation_moves_only_the_hc_packages():
    out = relocate_class(_class_file(b"org/apache/hc/core5/http/Method", b"org.apache.hc.client5.Foo",
                                     b"org/apache/hcx/Other", b"org/slf4j/Logger"), HTTP_CLIENT)
    assert b"org/apache/iceberg/shaded/org/apache/hc/core5/http/Method" in out
    assert b"org.apache.iceberg.shaded.org.apache.hc.client5.Foo" in out
    assert b"\x00\x14org/apache/hcx/Other" in out and b"org/slf4j/Logger" in out
    assert HTTP_CLIENT.moves("org/apache/hc/core5/version.properties") and not HTTP_CLIENT.moves("org/apache/hc/")


def test_empty_interface_is_a_well_formed_class_file():
    data = empty_interface("a/b/Iface")
    assert data[:4] == b"\xca\xfe\xba\xbe" and b"a/b/Iface" in data and b"java/lang/Object" in data
    assert relocate_class(data, HTTP_CLIENT) == data  # its constant pool parses


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
