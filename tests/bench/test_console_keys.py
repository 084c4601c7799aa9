"""bench.console loads the scenario into a database of its own: the keys of that load
are kept beside it, and the demo's keys file (var/demo/keys.json) is never touched."""

import io
import json
from contextlib import redirect_stdout

import pytest

from bench.console import forget_keys_of_a_dropped_database, load_scenario_keeping_keys

pytestmark = pytest.mark.django_db(databases=["default", "audit"])


def test_the_console_bench_keeps_its_keys_beside_its_database_not_the_demos(tmp_path, monkeypatch):
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "keys.json").write_text('{"the demo": "its keys"}')
    monkeypatch.setenv("DATA_DIR", str(demo))  # where load_scenario keeps keys by default
    bench = tmp_path / "bench-console"

    with redirect_stdout(io.StringIO()):
        load_scenario_keeping_keys(2, bench)

    assert (demo / "keys.json").read_text() == '{"the demo": "its keys"}'
    keys = json.loads((bench / "keys.json").read_text())
    assert keys["authorities"]["trust-manager"]["key"].startswith("sna_")


def test_a_dropped_bench_database_takes_its_keys_with_it(tmp_path):
    (tmp_path / "keys.json").write_text('{"of": "the dropped database"}')
    forget_keys_of_a_dropped_database(tmp_path)
    assert not (tmp_path / "keys.json").exists()
    forget_keys_of_a_dropped_database(tmp_path)  # none: nothing to do
