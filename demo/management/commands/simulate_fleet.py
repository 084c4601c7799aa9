"""Start a fleet of simulated web servers: real WebSocket agents in a few processes."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from broker.audit import Actor
from broker.services.clients import issue_fleet_tokens
from demo.data_folder import write_new_private
from demo.scenario import WEB_SERVER_POLICY, ensure_web_servers, trusted_authorities

SIMULATOR = Actor("system", "fleet-simulator")


class Command(BaseCommand):
    help = (
        "Provision N scenario web servers (registering the missing ones), issue their "
        "tokens, and run them as real agents in a few processes until stopped (or, with "
        "--light, as the scale benchmarks' light fleet)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--agents", type=int, default=1000)
        parser.add_argument("--processes", type=int, default=2)
        parser.add_argument("--url", default="ws://127.0.0.1:8000/ws/agent/v1/")
        parser.add_argument(
            "--load-interval", type=float, default=15.0, help="seconds between load changes"
        )
        parser.add_argument(
            "--stats-dir",
            help="where each process writes its latencies and what its agents received",
        )
        parser.add_argument(
            "--light",
            action="store_true",
            help="the light fleet of the scale benchmarks (demo/light_fleet.py): the "
            "protocol only, no agent service, actions answered in the process",
        )

    def handle(self, *args, agents: int, processes: int, light: bool, **options) -> None:
        if agents < 1 or not 1 <= processes <= agents:
            raise CommandError("--agents must be at least 1 and --processes 1 to --agents")
        specs = self._provision(agents, processes, options)
        try:
            module = "demo.light_fleet" if light else "demo.simulator"
            children = [subprocess.Popen([sys.executable, "-m", module, str(p)]) for p in specs]
            self.stdout.write(f"fleet: {agents} agents in {processes} processes")
            self.stdout.flush()
            _stop_children_on_signals(children)
            codes = [child.wait() for child in children]
        finally:
            shutil.rmtree(specs[0].parent, ignore_errors=True)
        if any(code not in (0, -signal.SIGTERM) for code in codes):
            raise CommandError(f"fleet processes exited with {codes}")

    def _provision(self, agents: int, processes: int, options: dict) -> list[Path]:
        servers = ensure_web_servers(agents)
        tokens = issue_fleet_tokens(clients=[c for c, _ in servers], actor=SIMULATOR)
        folder = Path(tempfile.mkdtemp(prefix="sn-fleet-"))
        authorities = trusted_authorities()
        trust = authorities and {"authorities": authorities, "policy": WEB_SERVER_POLICY}
        paths = []
        for part in range(processes):
            mine = servers[part::processes]
            spec = {
                "url": options["url"],
                "load_interval_s": options["load_interval"],
                "seed": part,
                "stats": _stats_path(options.get("stats_dir"), part),
                # With it, each agent acts only on signed events that agree.
                "trust": trust,
                "agents": [{"token": tokens[c.pk], "values": values} for c, values in mine],
            }
            # It holds tokens: private from its first byte, in a folder made just now.
            paths.append(write_new_private(folder / f"fleet-{part}.json", json.dumps(spec)))
        return paths


def _stats_path(folder: str | None, part: int) -> str | None:
    return str(Path(folder) / f"fleet-stats-{part}.json") if folder else None


def _stop_children_on_signals(children: list[subprocess.Popen]) -> None:
    def forward(signum, _frame) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
