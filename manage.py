#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    """Run a management command; a configuration error exits with its message, no trace."""
    if "DATABASE_URL" not in os.environ:  # the launcher and tests set their own
        from demo.data_folder import use_demo_settings

        use_demo_settings()
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
