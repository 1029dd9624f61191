"""The row every ingest reading produces per line or message: ``(file_index, source_file, source_offset, raw)``.

Landing files are read by Spark's text reader (:mod:`icecdc_dagster.ingest.landing_lines`, whose
``source_offset`` is a position key ordering the file's lines), stream messages by their input plugin.
"""

from pyspark.sql import types as T

LINE_SCHEMA = T.StructType([T.StructField("file_index", T.LongType()), T.StructField("source_file", T.StringType()),
                            T.StructField("source_offset", T.LongType()), T.StructField("raw", T.StringType())])
