"""The Selective Notification agent (docs/agent.md).

`sn_agent.client` speaks the agent protocol; `sn_agent.service` is the agent that a
managed server runs (`sn-agent run --config FILE`). Nothing here imports the server.
"""

__version__ = "0.2.1"
