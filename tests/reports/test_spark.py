"""How the reports' SparkSession is configured (no Spark is started here)."""

from reports import spark


def test_shuffle_partitions_are_few_on_one_machine_and_sparks_own_on_a_cluster(settings):
    settings.SPARK_SHUFFLE_PARTITIONS = 0
    settings.SPARK_MASTER = "local[*]"
    assert spark._shuffle_partitions() == 8
    settings.SPARK_MASTER = "spark://spark-master.internal:7077"
    assert spark._shuffle_partitions() == 200


def test_shuffle_partitions_set_for_the_cluster_are_kept(settings):
    settings.SPARK_MASTER = "spark://spark-master.internal:7077"
    settings.SPARK_SHUFFLE_PARTITIONS = 24
    assert spark._shuffle_partitions() == 24
