"""The window's filter: what it takes and leaves, and the code Spark compiles for it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pyspark.sql import functions as F

from reports.jobs.frames import at_or_after, before, in_window, sql_text
from reports.results import Params
from reports.spark import small_frame
from tests.reports.spark_helpers import compiled_classes

START = datetime(2026, 3, 1, 23, 59, 30, tzinfo=UTC)  # the window crosses midnight
END = START + timedelta(minutes=1)
MICRO = timedelta(microseconds=1)


def times(spark, *moments):
    return small_frame(spark, [(n, at) for n, at in enumerate(moments)], "n int, at timestamp")


def kept(frame, condition) -> list[int]:
    return sorted(row.n for row in frame.where(condition).collect())


def test_the_window_takes_its_start_and_leaves_its_end_and_times_unknown(spark):
    frame = times(
        spark, START - MICRO, START, START + timedelta(seconds=31), END - MICRO, END, None
    )
    assert kept(frame, in_window("at", Params(START, END))) == [1, 2, 3]


def test_before_and_from_are_false_for_a_time_unknown(spark):
    frame = times(spark, START - MICRO, START, None)
    assert kept(frame, before("at", START)) == [0]
    assert kept(frame, at_or_after("at", START)) == [1]


def test_another_window_within_the_same_days_compiles_no_code_again(spark):
    # Not a frame of rows held in the plan: Spark filters those as it plans the query.
    seconds = F.lit(int(START.timestamp())) + F.col("id") * 5
    frame = spark.range(12).select(F.col("id").alias("n"), F.timestamp_seconds(seconds).alias("at"))

    def counted(params: Params) -> int:
        return frame.where(in_window("at", params)).count()

    assert counted(Params(START, END)) == 12
    before_second = compiled_classes(spark)
    assert counted(Params(START + timedelta(seconds=20), END - timedelta(seconds=10))) == 6
    assert compiled_classes(spark) == before_second


def test_text_written_into_a_query_reads_back_as_it_was(spark):
    odd = ["", "it's", 'a "quote"', "back\\slash", "new\nline\ttab", "ünïcödé ✓", "wave 🌊 🏳️‍🌈"]
    written = ", ".join(f"{sql_text(value)} AS v{n}" for n, value in enumerate(odd))
    assert list(spark.sql(f"SELECT {written}").first()) == odd
