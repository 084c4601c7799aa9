"""Spark's JVM writes its own lines (its start-up, its log) to SPARK_LOG_FILE when it is
set, as `./run` sets it, so that the reports worker's output holds only its own."""

from __future__ import annotations


def test_sparks_own_lines_go_to_the_log_file_and_the_report_still_runs(
    spark_in_a_process, tmp_path
):
    log = tmp_path / "spark.log"

    done = spark_in_a_process(
        "from reports import spark\nprint('counted', spark.session().range(3).count())",
        SPARK_LOG_FILE=str(log),
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["counted 3"]
    assert "log4j" not in done.stderr and "WARN" not in done.stderr
    assert "log4j" in log.read_text()  # Spark says which logging profile it took
