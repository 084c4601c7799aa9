#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys
from pathlib import Path

# Written by `./run` (launcher/__main__.py): the running demo's settings.
DEMO_ENVIRONMENT = Path(__file__).resolve().parent / "var" / "demo" / "environment"


def use_the_running_demo(path: Path = DEMO_ENVIRONMENT) -> None:
    """Beside a running `./run`, take the settings it left for what the environment
    does not set, so that management commands work with nothing to copy by hand."""
    path = Path(os.environ["DATA_DIR"]) / "environment" if os.environ.get("DATA_DIR") else path
    if not path.is_file():
        return
    for line in path.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name:
            os.environ.setdefault(name, value)


def main() -> None:
    """Run a management command; a configuration error exits with its message, no trace."""
    if "DATABASE_URL" not in os.environ:  # the launcher and tests set their own
        use_the_running_demo()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from django.core.management import execute_from_command_line

    from console.env import ConfigurationError

    try:
        execute_from_command_line(sys.argv)
    except ConfigurationError as error:
        sys.stderr.write(f"Configuration error: {error}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
