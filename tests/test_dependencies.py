"""The console declares what it imports: the agent (`sn-agent`, from agent/) is pinned
in pyproject.toml at the version agent/ has, and the installed console requires it."""

from __future__ import annotations

import tomllib
from importlib.metadata import requires, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def declared(pyproject: Path) -> dict:
    return tomllib.loads(pyproject.read_text())["project"]


def test_the_console_pins_the_agent_at_the_version_of_agent_folder():
    agent_version = declared(ROOT / "agent" / "pyproject.toml")["version"]
    assert f"sn-agent=={agent_version}" in declared(ROOT / "pyproject.toml")["dependencies"]


def test_the_installed_console_requires_the_agent_it_was_installed_with():
    assert "sn-agent==" + version("sn-agent") in requires("selective-notification-console")
