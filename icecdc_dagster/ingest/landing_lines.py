"""Landing files -> one row per line, read by Spark's own text reader, each named by its exact line number.

Why not byte offsets read in Python workers (the former reader): a line's position is needed for three
things only, and a line number gives each of them exactly, with no Python per line:

- the order of a file's events (the last image per key, snapshot-epoch markers): line order is file order;
- a dead letter names its event: file + line number (``sed -n '<n>p' <file>`` shows it);
- exactly once: the ledger records whole files (``<uri>#0-<size>``), never a position inside one, so a
  re-delivered or replayed file is skipped as before, whatever the positions are.

How the number is exact: each file is its own scan (``file_index`` is a literal of it), so each of its
splits is alone in its partition (Spark packs splits into partitions by size; a full-size split fills one,
and a file has at most one smaller split), and the low bits of ``monotonically_increasing_id`` count a
row inside its partition: the row's number inside its split. A split's first line number is the count of
lines in the file's earlier splits, from one counting pass over the text (no JSON), skipped for a file
read as one split; a split the counting pass did not see fails the read rather than misnumber a line.

Same lines as the byte-range reader: split on ``\\n`` only (a ``\\r`` stays in its line, as before), an
empty line is a line, the text after the last newline is a line. Bytes that are not UTF-8 are replaced
(U+FFFD) as Python's ``errors="replace"`` does, so both readings of a line see the same text.
"""

import re
from collections.abc import Sequence
from functools import reduce
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from icecdc_dagster.ingest import landing

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_ROW_BITS = 33  # monotonically_increasing_id: the partition id above, the row's number in its partition below
_START = "_icecdc_split_start"
_ROW = "_icecdc_split_row"
_GLOB = re.compile(r"([\\{}\[\]*?])")  # Hadoop glob characters: a landing file's name is a path, not a pattern


def lines(spark: "SparkSession", files: Sequence[landing.LandingFile]) -> DataFrame:
    """(file_index, source_file, source_offset, raw) per line of ``files``: ``source_offset`` is the line's
    number in its file (from 1), ``file_index`` the file's index in ``files`` (so both order the batch)."""
    frames = [_file_lines(spark, index, f) for index, f in enumerate(files)]
    if not frames:
        return spark.createDataFrame([], "file_index bigint, source_file string, source_offset bigint, raw string")
    split = [index for index, frame in enumerate(frames) if frame.rdd.getNumPartitions() > 1]
    firsts = _first_lines(frames, split)
    numbered = [frame.select("file_index", "source_file", _line_number(index, firsts).alias("source_offset"), "raw")
                for index, frame in enumerate(frames)]
    return reduce(DataFrame.unionByName, numbered)


def _file_lines(spark: "SparkSession", index: int, f: landing.LandingFile) -> DataFrame:
    text = spark.read.option("lineSep", "\n").text(_GLOB.sub(r"\\\1", f.uri))
    row = F.monotonically_increasing_id().bitwiseAND(F.lit((1 << _ROW_BITS) - 1))
    return text.select(F.lit(index).cast("long").alias("file_index"), F.lit(f.uri).alias("source_file"),
                       F.input_file_block_start().alias(_START), row.alias(_ROW),
                       F.decode(F.encode("value", "UTF-8"), "UTF-8").alias("raw"))


def _first_lines(frames: Sequence[DataFrame], split: Sequence[int]) -> dict[tuple[int, int], int]:
    """(file index, split start) -> the split's first line number minus one, for the files read as several splits."""
    if not split:
        return {}
    counted = reduce(DataFrame.unionByName, [frames[i].select("file_index", _START) for i in split])
    counts = sorted((int(r[0]), int(r[1]), int(r[2])) for r in counted.groupBy("file_index", _START).count().collect())
    firsts: dict[tuple[int, int], int] = {}
    before: dict[int, int] = {}
    for index, start, n in counts:
        firsts[(index, start)] = before.get(index, 0)
        before[index] = before.get(index, 0) + n
    return firsts


def _line_number(index: int, firsts: dict[tuple[int, int], int]) -> Column:
    row = F.col(_ROW) + F.lit(1)
    starts = {start: first for (i, start), first in firsts.items() if i == index}
    if not starts:
        return row  # one split: its rows are the file's lines
    first = F.create_map(*[F.lit(x) for start, n in sorted(starts.items()) for x in (start, n)])[F.col(_START)]
    return F.when(first.isNull(), F.raise_error(F.lit(f"landing file {index}: a split the line count did not see"))
                  ).otherwise(first + row)
