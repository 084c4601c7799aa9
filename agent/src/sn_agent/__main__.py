"""`python -m sn_agent` is `sn-agent`."""

import sys

from sn_agent.cli import main

sys.exit(main())
