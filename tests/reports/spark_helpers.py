"""What the reports' tests ask of Spark itself."""

from __future__ import annotations


def compiled_classes(spark) -> int:
    """How many classes Spark's code generator has compiled in this process so far."""
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
    return metrics.METRIC_COMPILATION_TIME().getCount()
