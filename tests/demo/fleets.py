"""A simulated fleet of the scenario's web servers against the test's console: six, as
the fleet simulator's tests start it (the real agents or the light fleet), or any
number in as many processes (`fleet_running`, which the browser tests use too)."""

from __future__ import annotations

import contextlib
import subprocess
import sys

from broker.models import Delivery
from demo.scenario import ensure_signing_keys, load_scenario
from tests.broker.agent_helpers import agent_url, wait_until_fleet_ready
from tests.broker.tree_helpers import wait_until_idle
from tests.conftest import ROOT, environment_for_test_database, stop_process

SERVERS = 6


def running_fleet(asgi_server, *, signed: bool = False, light: bool = False):
    """Yield the scenario while its six web servers run in two processes (with
    `signed`, the console holds the demo's signing keys; with `light`, as the light
    fleet); stopped, and the tree idle, after."""
    scenario = load_scenario(servers=SERVERS)
    if signed:
        ensure_signing_keys()
    with fleet_running(asgi_server, agents=SERVERS, processes=2, load_interval_s=0.5, light=light):
        yield scenario


@contextlib.contextmanager
def fleet_running(
    asgi_server, *, agents: int, processes: int, load_interval_s: float, light: bool = False
):
    """While the block runs, `manage.py simulate_fleet` runs `agents` of the loaded
    scenario's servers against the test's console, every one logged in; stopped, and
    the tree idle, after."""
    wait_until_idle()
    argv = [
        sys.executable, str(ROOT / "manage.py"), "simulate_fleet", "--agents", str(agents),
        "--processes", str(processes), "--url", agent_url(asgi_server),
        "--load-interval", str(load_interval_s), *(["--light"] if light else []),
    ]  # fmt: skip
    process = subprocess.Popen(
        argv, env=environment_for_test_database(), cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        wait_until_fleet_ready(process, agents=agents)
        yield
    finally:
        stop_process(process)
        wait_until_idle()


def answered(event, receivers: int) -> list[Delivery]:
    """The event's deliveries once there are `receivers` of them, all answered (two
    leaves record theirs at different moments), else nothing."""
    deliveries = list(Delivery.objects.filter(event=event).select_related("receiver"))
    done = len(deliveries) == receivers and all(d.state in ("acked", "failed") for d in deliveries)
    return deliveries if done else []
