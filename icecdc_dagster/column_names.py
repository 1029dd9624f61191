"""Column references by exact name: a name may hold dots, spaces or backticks (``the.id``, ``the id``).

``F.col("the.id")`` would read field ``id`` of a struct ``the``; a quoted reference never does.
"""

from pyspark.sql import Column
from pyspark.sql import functions as F


def quote(name: str) -> str:
    """The name as a Spark SQL identifier: in backticks, inner backticks doubled."""
    return "`" + name.replace("`", "``") + "`"


def column(name: str) -> Column:
    """The top-level column called exactly ``name``."""
    return F.col(quote(name))
