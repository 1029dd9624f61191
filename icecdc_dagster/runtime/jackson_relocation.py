"""Build the relocated-Jackson jar the PyPI Iceberg runtime jar lacks.

The Iceberg 1.10.2 Spark runtime shipped in ``snowpark-connect-deps-iceberg``
references ``org.apache.iceberg.shaded.com.fasterxml.jackson`` but does not
contain it. It does contain Parquet's private copy of the same Jackson
(2.19.2) under another prefix. We copy those classes into the package Iceberg
expects by renaming the package prefix in every class file's constant pool
(what jarjar does), once, and cache the result next to the other jars.
"""

import io
import os
import struct
import tempfile
import zipfile
from pathlib import Path
from icecdc_dagster.errors import RuntimeSetupError

SOURCE_PREFIX = b"org/apache/iceberg/shaded/org/apache/parquet/shaded/com/fasterxml/jackson"
TARGET_PREFIX = b"org/apache/iceberg/shaded/com/fasterxml/jackson"
_RENAMES = (
    (SOURCE_PREFIX, TARGET_PREFIX),
    (SOURCE_PREFIX.replace(b"/", b"."), TARGET_PREFIX.replace(b"/", b".")),
)
# Byte length of each constant-pool entry after its tag byte (Utf8 is variable).
_FIXED_CP_SIZES = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 9: 4, 10: 4, 11: 4, 12: 4,
                   15: 3, 16: 2, 17: 4, 18: 4, 19: 2, 20: 2}
_FORMAT_VERSION = "1"


class ClassFileError(RuntimeSetupError, ValueError):
    """A class file could not be parsed for relocation."""


def _rename(data: bytes) -> bytes:
    for old, new in _RENAMES:
        data = data.replace(old, new)
    return data


def relocate_class(data: bytes) -> bytes:
    """Return ``data`` with the Jackson package prefix renamed in its constant pool."""
    if data[:4] != b"\xca\xfe\xba\xbe":
        raise ClassFileError("not a class file")
    (count,) = struct.unpack_from(">H", data, 8)
    out = io.BytesIO()
    out.write(data[:10])
    pos, index = 10, 1
    while index < count:
        tag = data[pos]
        if tag == 1:
            (length,) = struct.unpack_from(">H", data, pos + 1)
            text = _rename(data[pos + 3 : pos + 3 + length])
            out.write(b"\x01" + struct.pack(">H", len(text)) + text)
            pos += 3 + length
        elif tag in _FIXED_CP_SIZES:
            size = _FIXED_CP_SIZES[tag]
            out.write(data[pos : pos + 1 + size])
            pos += 1 + size
            if tag in (5, 6):  # long and double take two slots
                index += 1
        else:
            raise ClassFileError(f"unknown constant pool tag {tag} at byte {pos}")
        index += 1
    out.write(data[pos:])
    return out.getvalue()


def build_relocated_jackson_jar(runtime_jar: Path, output: Path) -> Path:
    """Write ``output``: Parquet's shaded Jackson, relocated to Iceberg's prefix."""
    source_dir = SOURCE_PREFIX.decode()
    dotted = SOURCE_PREFIX.replace(b"/", b".").decode()
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=output.parent, suffix=".jar.tmp")
    os.close(fd)
    written = 0
    try:
        with zipfile.ZipFile(runtime_jar) as src, zipfile.ZipFile(tmp_name, "w", zipfile.ZIP_DEFLATED) as dst:
            dst.writestr("META-INF/MANIFEST.MF",
                         "Manifest-Version: 1.0\r\nMulti-Release: true\r\n"
                         f"Created-By: icecdc_dagster jackson relocation {_FORMAT_VERSION}\r\n\r\n")
            for info in src.infolist():
                name = info.filename
                if source_dir in name and not name.endswith("/"):
                    data = src.read(name)
                    if name.endswith(".class"):
                        data = relocate_class(data)
                    dst.writestr(_rename(name.encode()).decode(), data)
                    written += 1
                elif name.startswith("META-INF/services/") and dotted in name:
                    dst.writestr(_rename(name.encode()).decode(), _rename(src.read(name)))
                    written += 1
        if written == 0:
            raise ClassFileError(f"{runtime_jar} holds no classes under {source_dir}")
        os.replace(tmp_name, output)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return output
