"""The data as a DataFrame with an exact, contiguous row index: the row numbers errors name.

The index is the row's position in the order the single-process route would read the same
data, so ``row 1234`` means the same row on both routes:

- a Parquet path: files in path order (as ``pandas.read_parquet`` lists them), rows in file
  order. Spark itself packs files into partitions by size, largest first, so its own order is
  not the files' order; the index is built from each row's file and position in it
  (``_metadata.file_path``, ``_metadata.row_index``);
- a DataFrame: the order ``collect()`` returns, partition by partition. The index is each
  row's position in its partition (``monotonically_increasing_id``, whose low 33 bits count
  the rows of a partition) plus the rows of the partitions before it (one count job, on the
  JVM). Every pass re-reads the DataFrame, so its order must be deterministic: a DataFrame read
  from files, or sorted, is; one straight out of a shuffle (``repartition``, a join without a
  sort) is not: sort it, or write it out and pass the path.

Both give the index as a JVM column, so no row goes through Python to be numbered.
"""

from __future__ import annotations

import os
from urllib.parse import unquote

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

__all__ = ["ROW", "read_indexed", "spread"]

#: the index column while the data is processed (a name no user column is expected to have)
ROW = "_rag_eval_row"
#: monotonically_increasing_id: the partition index above these bits, the position below
_POSITION_BITS = 33


def _offsets(counts: list[int]) -> Column:
    """Per group number g (0-based), the rows of the groups before it, as a literal array."""
    offsets, total = [], 0
    for n in counts:
        offsets.append(total)
        total += n
    return F.array(*[F.lit(o).cast("long") for o in offsets])


def _index_dataframe(df: DataFrame) -> tuple[DataFrame, int]:
    n_partitions = df.rdd.getNumPartitions()
    counts_by_partition = dict(
        df.select(F.spark_partition_id().alias("p")).groupBy("p").count().collect()
    )
    counts = [counts_by_partition.get(p, 0) for p in range(n_partitions)]
    position = F.monotonically_increasing_id().bitwiseAND((1 << _POSITION_BITS) - 1)
    row = F.element_at(_offsets(counts), F.spark_partition_id() + 1) + position
    return df.withColumn(ROW, row), sum(counts)


def _index_parquet(spark: SparkSession, path: str) -> tuple[DataFrame, int]:
    df = spark.read.parquet(path)
    file_path = F.col("_metadata.file_path")
    counts = df.select(file_path.alias("f")).groupBy("f").count().collect()
    # pandas (pyarrow) lists a folder's files sorted by path; Spark names them by URI
    files = sorted(counts, key=lambda fc: unquote(fc[0]))
    if not files:
        return df, 0
    number = F.create_map(*[x for i, (f, _) in enumerate(files) for x in (F.lit(f), F.lit(i))])
    row = F.element_at(_offsets([n for _, n in files]), number[file_path] + 1) + F.col("_metadata.row_index")
    return df.withColumn(ROW, row), sum(n for _, n in files)


def read_indexed(data: DataFrame | str | os.PathLike) -> tuple[DataFrame, int]:
    """``data`` with the :data:`ROW` column, and its number of rows.

    Raises:
        ValueError: ``data`` has a column named :data:`ROW`, or no rows.
        RuntimeError: a path is given and no SparkSession is active.
    """
    if isinstance(data, DataFrame):
        df, n = _index_dataframe(_checked(data))
    elif isinstance(data, (str, os.PathLike)):
        spark = SparkSession.getActiveSession()
        if spark is None:
            raise RuntimeError("no active SparkSession: start one (SparkSession.builder...getOrCreate()) "
                               "before evaluating a Parquet path")
        df, n = _index_parquet(spark, os.fspath(data))
        _checked(df.drop(ROW))
    else:
        raise TypeError(f"data must be a pyspark DataFrame or a Parquet path, got {type(data).__name__}")
    if n == 0:
        raise ValueError("the data has no rows")
    return df, n


def _checked(df: DataFrame) -> DataFrame:
    if ROW in df.columns:
        raise ValueError(f"the data has a column named {ROW!r}, which the Spark route uses for the row index")
    return df


def spread(df: DataFrame, n_rows: int, *, whole_blocks: bool) -> DataFrame:
    """``df`` with its rows in index order within each partition, on at least as many
    partitions as the session has cores (when it has enough blocks of the engine's
    ``BATCH_SIZE`` rows), each block in one partition when ``whole_blocks``.

    - Order: Spark packs small files into a partition largest first, so a partition's rows are
      not in index order by themselves; the validation relies on it (a batch's first bad cell
      is its lowest row, and a partition stops at its first) and so does the grouping of rows
      into blocks.
    - Cores: a small file is one partition, which one core would score alone.
    - Whole blocks: a judge's results may depend on which rows share a block (the embedding
      model embeds a block's texts in one call, and float32 results differ in their last
      digits with the batch), so with a judge each block is scored as the single-process
      engine scores it. Without a judge (retrieval metrics) no value depends on it, and no
      shuffle is paid for it.
    """
    from mlflow_rag_eval.evaluation.engine import BATCH_SIZE

    cores = df.sparkSession.sparkContext.defaultParallelism
    blocks = -(-n_rows // BATCH_SIZE)
    partitions = df.rdd.getNumPartitions()
    if blocks >= 2 and (partitions < cores or whole_blocks):
        block = F.floor(F.col(ROW) / BATCH_SIZE)
        df = df.repartitionByRange(min(blocks, max(cores, partitions)), block)
    return df.sortWithinPartitions(ROW)
