"""The server processes' garbage collector: what start-up built is frozen, and young
collections are rarer (console/runtime.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from console.runtime import YOUNG_THRESHOLD

ROOT = Path(__file__).resolve().parents[2]
REPORT = "import gc; print(gc.get_threshold()[0], gc.get_freeze_count())"


def _output_of_a_fresh_process(code: str) -> str:
    # A process of its own: the test process's collector and modules stay as they are.
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def _in_a_fresh_process(code: str) -> tuple[int, int]:
    threshold, frozen = _output_of_a_fresh_process(f"{code}\n{REPORT}").split()
    return int(threshold), int(frozen)


def test_a_web_process_freezes_what_it_built_and_collects_young_objects_less_often():
    threshold, frozen = _in_a_fresh_process("import console.asgi")
    assert threshold == YOUNG_THRESHOLD
    assert frozen > 10_000  # Django and the application's modules


def test_a_plain_import_of_the_settings_leaves_the_collector_alone():
    python_default = _in_a_fresh_process("pass")  # whatever this Python's default is
    assert _in_a_fresh_process("import django; django.setup()") == python_default


AUTOBAHN_FORMATTING = """
import daphne.server  # Daphne imports its server, and so autobahn, before the application
import console.asgi, txaio
import autobahn.websocket.protocol as websocket_protocol
print(websocket_protocol.pformat([("openHandshakeTimeout", 5)]))
print(websocket_protocol.hltype(len))
txaio.set_global_log_level("debug")
print(websocket_protocol.pformat([("openHandshakeTimeout", 5)]))
print(websocket_protocol.hltype(len))
"""


def test_a_web_process_under_daphne_formats_autobahns_debug_messages_only_while_debugging():
    settings_off, name_off, settings_on, name_on = (
        _output_of_a_fresh_process(AUTOBAHN_FORMATTING).strip().splitlines()
    )
    assert settings_off == name_off == "(not formatted: debug messages are off)"
    assert settings_on == "[('openHandshakeTimeout', 5)]"
    assert name_on.startswith("<") and name_on != name_off  # coloured, as autobahn does


UNDER_UVICORN = """
import sys
import console.asgi
print(sorted({m.split(".")[0] for m in sys.modules} & {"daphne", "twisted", "autobahn", "txaio"}))
"""


def test_a_web_process_under_uvicorn_imports_neither_daphne_nor_twisted_nor_autobahn():
    # Together they would cost each web process 40 MB (docs/benchmarks.md).
    assert _output_of_a_fresh_process(UNDER_UVICORN).strip().splitlines()[-1] == "[]"
