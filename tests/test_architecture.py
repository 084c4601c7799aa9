"""The house's shape, checked with the fast tier: packages stack in one direction with
no import cycle (.importlinter), and the service package stays small enough to read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_SERVICE_MODULES = 20


def test_packages_stack_in_one_direction_without_cycles():
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_service_package_keeps_its_modules_in_subpackages_past_twenty():
    top_level = sorted(p.name for p in (ROOT / "broker").glob("*.py"))
    assert len(top_level) <= MAX_SERVICE_MODULES, top_level
