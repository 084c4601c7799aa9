"""How the reports' SparkSession is configured (no Spark is started here)."""

import os

import pytest

from reports import spark


def test_shuffle_partitions_are_one_per_core_on_one_machine_and_sparks_own_on_a_cluster(
    settings,
):
    settings.SPARK_SHUFFLE_PARTITIONS = 0
    settings.SPARK_MASTER = "local[*]"
    assert spark._shuffle_partitions() == os.cpu_count()
    settings.SPARK_MASTER = "local[3]"
    assert spark._shuffle_partitions() == 3
    settings.SPARK_MASTER = "spark://spark-master.internal:7077"
    assert spark._shuffle_partitions() == 200


def test_shuffle_partitions_set_for_the_cluster_are_kept(settings):
    settings.SPARK_MASTER = "spark://spark-master.internal:7077"
    settings.SPARK_SHUFFLE_PARTITIONS = 24
    assert spark._shuffle_partitions() == 24


def test_adaptive_execution_is_for_clusters(settings):
    settings.SPARK_MASTER = "local[2]"
    assert spark._is_local()
    settings.SPARK_MASTER = "spark://spark-master.internal:7077"
    assert not spark._is_local()


def test_a_derived_frame_named_as_a_table_is_refused(tmp_path):
    data = spark.Dataset(None, tmp_path, keep=True)
    with pytest.raises(ValueError, match="'clients'"):
        data.derived("clients", ("clients",), lambda: None)
