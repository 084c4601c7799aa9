"""`./run` is quiet unless --verbose, so that the console's address is its last line:
Spark's own lines go to DATA_DIR/spark.log (tests/reports/test_spark_log.py), and
Celery's warning about a worker run as root is not said."""

from __future__ import annotations

import os
import subprocess
import sys

from launcher.__main__ import console_environment

ROOT_WARNING = """
import warnings
from celery.exceptions import SecurityWarning
from celery.platforms import ROOT_DISCOURAGED
warnings.warn(SecurityWarning(ROOT_DISCOURAGED.format(uid=0, euid=0, gid=0, egid=0)))
warnings.warn(SecurityWarning("another of Celery's warnings"))
"""
QUIET = ("SPARK_LOG_FILE", "PYTHONWARNINGS", "LOG_LEVEL")


def test_a_quiet_run_sends_sparks_lines_to_its_data_folder(tmp_path, monkeypatch):
    for name in QUIET:
        monkeypatch.delenv(name, raising=False)
    env = console_environment(tmp_path, verbose=False)
    assert env["SPARK_LOG_FILE"] == str(tmp_path / "spark.log")
    assert env["LOG_LEVEL"] == "WARNING"


def test_a_verbose_run_says_everything(tmp_path, monkeypatch):
    for name in QUIET:
        monkeypatch.delenv(name, raising=False)
    env = console_environment(tmp_path, verbose=True)
    assert not any(name in env for name in QUIET)


def test_what_the_environment_sets_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_LOG_FILE", "/var/log/sn/spark.log")
    monkeypatch.setenv("PYTHONWARNINGS", "default")
    env = console_environment(tmp_path, verbose=False)
    assert (env["SPARK_LOG_FILE"], env["PYTHONWARNINGS"]) == ("/var/log/sn/spark.log", "default")


def test_celerys_root_warning_is_not_said_and_its_other_warnings_are(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    env = console_environment(tmp_path, verbose=False)
    done = subprocess.run(
        [sys.executable, "-c", ROOT_WARNING], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert "superuser privileges" not in done.stderr
    assert "another of Celery's warnings" in done.stderr
    loud = subprocess.run(
        [sys.executable, "-c", ROOT_WARNING], env={**os.environ}, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert "superuser privileges" in loud.stderr
