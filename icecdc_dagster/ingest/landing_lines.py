"""Landing files -> one row per line, read by Spark's own text reader, each with an exact position in its file.

Why not byte offsets read in Python workers (the former reader): a line's position is needed for three
things only, and none of them needs a byte offset:

- the order of a file's events (the last image per key, snapshot-epoch markers): :func:`lines` gives each
  line a position key that orders the file's lines exactly, with no Python per line and no extra pass;
- a dead letter names its event: file + line number (``sed -n '<n>p' <file>`` shows it),
  :func:`line_numbers` turns the position keys of a batch's dead letters into line numbers (one counting
  pass over the text, paid only by a batch with dead letters);
- exactly once: the ledger records whole files (``<uri>#0-<size>``), never a position inside one, so a
  re-delivered or replayed file is skipped as before, whatever the positions are.

The position key: each file is its own scan (``file_index`` is a literal of it), so each of its splits is
alone in its partition (Spark packs splits into partitions by size; a full-size split fills one, and a
file has at most one smaller split), and the low bits of ``monotonically_increasing_id`` number a row
inside its partition: its index ``i`` inside its split. A split starting at byte ``s`` holds the lines
that start in ``(s, e]`` (``[0, e]`` for the first), at most ``e - s`` of them, so ``s + i`` (``s + i + 1``
past the first split) is strictly increasing through the file and below the file's size, as a byte offset
was (``ORDER_FILE_SHIFT`` still holds it).

Same lines as the byte-range reader: split on ``\\n`` only (a ``\\r`` stays in its line, as before), an
empty line is a line, the text after the last newline is a line. Bytes that are not UTF-8 are replaced
(U+FFFD) as Python's ``errors="replace"`` does, so both readings of a line see the same text.
"""

import itertools
import re
from collections.abc import Sequence
from functools import reduce
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from icecdc_dagster.errors import HiddenLandingFileError
from icecdc_dagster.ingest import landing

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_ROW_BITS = 33  # monotonically_increasing_id: the partition id above, the row's number in its partition below
_START = "_icecdc_split_start"
_ROW = "_icecdc_split_row"
_GLOB = re.compile(r"([\\{}\[\]*?])")  # Hadoop glob characters: a landing file's name is a path, not a pattern


def lines(spark: "SparkSession", files: Sequence[landing.LandingFile]) -> DataFrame:
    """(file_index, source_file, source_offset, raw) per line of ``files``: ``source_offset`` is the line's
    position key (module doc: orders the file's lines), ``file_index`` the file's index in ``files``.

    Raises:
        HiddenLandingFileError: a file's name starts with ``.`` or ``_`` (Spark's reader would skip it).
    """
    hidden = [f.uri for f in files if f.uri.rstrip("/").rsplit("/", 1)[-1].startswith((".", "_"))]
    if hidden:  # Spark's reader skips these names: none of their lines would be read, and nothing would say so
        raise HiddenLandingFileError(f"landing files named like writers in progress (. or _ first): {hidden}")
    if not files:
        return spark.createDataFrame([], "file_index bigint, source_file string, source_offset bigint, raw string")
    return reduce(DataFrame.unionByName, [_file_lines(spark, index, f).select(
        "file_index", "source_file", _position_key().alias("source_offset"), "raw") for index, f in enumerate(files)])


def line_numbers(spark: "SparkSession", files: Sequence[landing.LandingFile], rows: DataFrame) -> DataFrame:
    """``rows`` (a few: a batch's dead letters) with ``source_offset`` turned from :func:`lines`' position key
    into the line's number in its file (from 1), found by ``source_file``. One counting pass over the text of
    ``files`` (no JSON): the lines of each split, so a split's first line number."""
    counted = reduce(DataFrame.unionByName, [_file_lines(spark, index, f).select("file_index", _START)
                                             for index, f in enumerate(files)])
    splits: dict[int, list[tuple[int, int]]] = {}
    for index, start, n in sorted(tuple(map(int, r)) for r in counted.groupBy("file_index", _START).count().collect()):
        splits.setdefault(index, []).append((start, n))
    key = F.col("source_offset")
    number: Column = F.lit(None).cast("long")
    for index, f in enumerate(files):
        number = F.when(F.col("source_file") == F.lit(f.uri), _number_in_file(key, splits.get(index, []))
                        ).otherwise(number)
    return rows.withColumn("source_offset", F.when(key.isNotNull(), number))


def _number_in_file(key: Column, splits: Sequence[tuple[int, int]]) -> Column:
    """Line number of a position key, given the file's splits that hold lines ((start, lines), by start): a
    split's keys are at most the next split's start (module doc), so the first split not past the key holds it."""
    firsts = list(itertools.accumulate((n for _, n in splits), initial=1))
    number: Column = F.lit(None).cast("long")
    for k in reversed(range(len(splits))):
        start = splits[k][0]
        value = F.lit(firsts[k]) + key - F.lit(start + (1 if start > 0 else 0))
        number = value if k == len(splits) - 1 else F.when(key <= F.lit(splits[k + 1][0]), value).otherwise(number)
    return number


def _position_key() -> Column:
    row = F.col(_ROW)
    return F.col(_START) + row + F.when(F.col(_START) > 0, F.lit(1)).otherwise(F.lit(0))


def _file_lines(spark: "SparkSession", index: int, f: landing.LandingFile) -> DataFrame:
    text = spark.read.option("lineSep", "\n").text(_GLOB.sub(r"\\\1", f.uri))
    row = F.monotonically_increasing_id().bitwiseAND(F.lit((1 << _ROW_BITS) - 1))
    return text.select(F.lit(index).cast("long").alias("file_index"), F.lit(f.uri).alias("source_file"),
                       F.input_file_block_start().alias(_START), row.alias(_ROW),
                       F.decode(F.encode("value", "UTF-8"), "UTF-8").alias("raw"))
