"""Landing lines into a Spark frame: byte ranges of the files read by executors, one Arrow batch at a time."""

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from icecdc_dagster.ingest import landing

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LINE_SCHEMA = T.StructType([T.StructField("file_index", T.LongType()), T.StructField("source_file", T.StringType()),
                            T.StructField("source_offset", T.LongType()), T.StructField("raw", T.StringType())])
_LINE_ARROW = pa.schema([pa.field("file_index", pa.int64()), pa.field("source_file", pa.string()),
                         pa.field("source_offset", pa.int64()), pa.field("raw", pa.string())])
_RANGE_SCHEMA = T.StructType([T.StructField("file_index", T.LongType()), T.StructField("uri", T.StringType()),
                              T.StructField("start", T.LongType()), T.StructField("end", T.LongType())])
_ARROW_BATCH = 65536
_MIN_CHUNK = 1 << 20


def lines_frame(spark: "SparkSession", files: Sequence[landing.LandingFile]) -> DataFrame:
    """(file_index, source_file, source_offset, raw) per line, read in byte ranges by executors (Arrow batches)."""
    # Enough ranges to keep every core busy (two per core), each at most CHUNK_BYTES and at least 1 MB.
    cores = max(int(spark.sparkContext.defaultParallelism), 1)
    total = sum(f.size for f in files)
    chunk = min(landing.CHUNK_BYTES, max(_MIN_CHUNK, -(-total // (2 * cores))))
    ranges = landing.chunks(files, chunk)
    frame = spark.createDataFrame(spark.sparkContext.parallelize(ranges, max(len(ranges), 1)), _RANGE_SCHEMA)
    return frame.mapInArrow(_read_ranges, LINE_SCHEMA)


def _read_ranges(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for file_index, uri, start, end in zip(*(batch.column(i).to_pylist() for i in range(4)), strict=True):
            offsets: list[int] = []
            raws: list[bytes] = []
            for offset, raw in landing.read_line_bytes(uri, start, end):
                offsets.append(offset)
                raws.append(raw)
                if len(raws) >= _ARROW_BATCH:
                    yield _line_batch(file_index, uri, offsets, raws)
                    offsets, raws = [], []
            if raws:
                yield _line_batch(file_index, uri, offsets, raws)


def _line_batch(file_index: int, uri: str, offsets: list[int], raws: list[bytes]) -> pa.RecordBatch:
    try:
        text = pa.array(raws, pa.binary()).cast(pa.string())  # validates UTF-8
    except pa.ArrowInvalid:
        text = pa.array([r.decode("utf-8", errors="replace") for r in raws], pa.string())
    n = len(raws)
    return pa.RecordBatch.from_arrays([pa.array([file_index] * n, pa.int64()), pa.array([uri] * n, pa.string()),
                                       pa.array(offsets, pa.int64()), text], schema=_LINE_ARROW)

