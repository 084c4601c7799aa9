"""A deployment over hosts, on this machine: each host a `python -m launcher ROLE` in a
session and data folder of its own, all of them reaching PostgreSQL, Redis and a Spark
standalone cluster over TCP on loopback only (the commands of docs/deploy.md).

Two web hosts (the fleet's agents on one, the senders' API calls on the other), two
tree-worker hosts each serving half of the leaves, one beat, and the reports worker on
the cluster. The worm scenario is played across them, a report runs on the cluster and
equals the same report run locally, and then one tree-worker host dies: the other
takes over its leaves and no delivery is lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import redis

from reports.results import Result
from tests.broker.agent_helpers import wait_for
from tests.conftest import ROOT, free_port
from tests.launcher.hosts import (
    START_TIMEOUT_S,
    Host,
    postgres_on_tcp,
    redis_on_tcp,
    spark_cluster,
)
from tests.reports.compare import differences

SERVERS = 40
TAKEOVER_WITHIN_S = 10.0
# The servers' connection variables of the suite, which the hosts must not inherit.
SUITE_SERVERS = ("DATABASE_URL", "REDIS_URL", "CHANNEL_LAYER_URL", "CELERY_BROKER_URL")


class Deployment:
    """The hosts, their servers and how to reach them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.services: list = []
        self.hosts: dict[str, Host] = {}
        self.env: dict[str, str] = {}
        self.spark_master = ""
        self.web_ports: dict[str, int] = {}

    def manage(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=env or self.env,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip()

    def start(self, name: str, *argv: str, env: dict[str, str] | None = None) -> Host:
        host = Host(name, list(argv), self.folder / "hosts" / name)
        self.hosts[name] = host.start(env or self.env)
        return host

    def sql(self, query: str, *params) -> list[tuple]:
        with psycopg.connect(self.env["DATABASE_URL"], autocommit=True) as connection:
            return connection.execute(query, params).fetchall()

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.env["REDIS_URL"])

    def stop(self) -> None:
        for host in self.hosts.values():
            host.stop()
        for service in reversed(self.services):
            service.stop()


@pytest.fixture
def cluster(tmp_path):
    """The Spark standalone cluster (a master and two workers): its URL and commands."""
    url, cluster, commands = spark_cluster(tmp_path / "spark")
    yield url, commands
    cluster.stop()


@pytest.fixture
def deployment(tmp_path, cluster):
    """Every host started, the database prepared, the fleet's agents logged in."""
    deployment = Deployment(tmp_path)
    try:
        _start_servers(deployment, cluster[0])
        _prepare_database(deployment)
        _start_hosts(deployment)
        yield deployment
    finally:
        deployment.stop()
        for name, host in deployment.hosts.items():
            print(f"--- {name} ---\n{host.output()[-4000:]}")


def _start_servers(deployment: Deployment, spark_master: str) -> None:
    postgres_url, postgres = postgres_on_tcp(deployment.folder / "postgres")
    deployment.services.append(postgres)
    redis_url, redis_server = redis_on_tcp(deployment.folder / "redis")
    deployment.services.append(redis_server)
    env = {k: v for k, v in os.environ.items() if k not in SUITE_SERVERS}
    keys = deployment.folder / "shared" / "signing-keys"
    keys.mkdir(mode=0o700, parents=True)
    env.update(
        DATABASE_URL=postgres_url, REDIS_URL=redis_url, SECRET_KEY="the-deployments-own",
        REPORTS_DATASET=str(deployment.folder / "shared" / "dataset"),
        SIGNING_KEYS_DIR=str(keys),  # the controllers' keys: the fleet verifies
        PYTHONUNBUFFERED="1", LOG_LEVEL="WARNING",
    )  # fmt: skip
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # each host has its own
    deployment.env, deployment.spark_master = env, spark_master


def _prepare_database(deployment: Deployment) -> None:
    deployment.manage("migrate", "--noinput", "-v", "0")
    keys = deployment.folder / "shared" / "keys.json"
    keys.parent.mkdir(parents=True, exist_ok=True)
    deployment.manage("load_scenario", "--servers", str(SERVERS), "--keys-file", str(keys))
    deployment.manage("worker_queues")  # the tree


def _start_hosts(deployment: Deployment) -> None:
    for name in ("web-a", "web-b"):
        port = deployment.web_ports[name] = free_port()
        deployment.start(name, "web", "--host", "127.0.0.1", "--port", str(port),
                         "--processes", "1")  # fmt: skip
    deployment.start("tree-a", "tree-worker", "--subtree", "d0.0", "--concurrency", "1")
    deployment.start("tree-b", "tree-worker", "--subtree", "d0.1", "--concurrency", "1")
    deployment.start("beat", "beat")
    reports_env = dict(deployment.env, SPARK_MASTER=deployment.spark_master,
                       PYSPARK_PYTHON=sys.executable, SPARK_DRIVER_MEMORY="1g",
                       SPARK_SHUFFLE_PARTITIONS="4")  # two one-core workers  # fmt: skip
    deployment.start("reports", "reports-worker", env=reports_env)
    for port in deployment.web_ports.values():
        healthy = f"the web host on {port} is healthy"
        wait_for(lambda port=port: _healthy(port), healthy, timeout_s=START_TIMEOUT_S)
    web_a = str(deployment.web_ports["web-a"])
    deployment.start("fleet", "fleet", "--host", "127.0.0.1", "--port", web_a,
                     "--agents", str(SERVERS))  # fmt: skip
    both = "both tree workers announce themselves"
    wait_for(lambda: _tree_workers(deployment) == 2, both, timeout_s=START_TIMEOUT_S)
    # Before anything is sent: an agent refuses a command signed before its journal
    # began (docs/security.md, "Replays"), and the fleet's journals are new.
    logged_in = "the fleet's agents logged in"
    wait_for(lambda: _agents_in(deployment) == SERVERS, logged_in, timeout_s=START_TIMEOUT_S)


def _agents_in(deployment: Deployment) -> int:
    return deployment.sql("SELECT count(*) FROM broker_agentpresence WHERE sessions > 0")[0][0]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz.json", timeout=5) as reply:
            return json.load(reply)["ok"]
    except (OSError, ValueError):
        return False


def _announcements(deployment: Deployment) -> list[dict]:
    client = deployment.redis()
    found = []
    for key in client.scan_iter("sn-processes:*"):
        record = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
        if record:
            found.append(record)
    return found


def _tree_workers(deployment: Deployment) -> int:
    return sum(1 for a in _announcements(deployment) if a["role"] == "tree worker")


def _covered_by(deployment: Deployment, host: str) -> list[str]:
    for record in _announcements(deployment):
        if record["host"] == host and record["role"] == "tree worker":
            return json.loads(record.get("covers", "[]"))
    return []


# --- Sending through the other web host's API ------------------------------------------


@dataclass
class Sender:
    """A controller publishing through the API, signing as its own software would."""

    name: str
    token: str
    key: object  # its Ed25519 private key


def sender(deployment: Deployment, name: str) -> Sender:
    from sn_agent.signatures import private_key_from_pem

    pem = Path(deployment.env["SIGNING_KEYS_DIR"]) / "senders" / f"{name}.pem"
    return Sender(name, sender_token(deployment, name), private_key_from_pem(pem.read_bytes()))


def sender_token(deployment: Deployment, sender: str) -> str:
    script = (
        "from broker.audit import Actor; from broker.models import Client; "
        "from broker.services.clients import issue_token; "
        f"print(issue_token(client=Client.objects.get(name={sender!r}), "
        "actor=Actor('system', 'multi-host test')))"
    )
    return deployment.manage("shell", "-c", script).splitlines()[-1]


def publish(deployment: Deployment, sender: Sender, content: dict, selector: str) -> str:
    """Publish a signed event through web-b's API; the event's id."""
    from sn_agent.signatures import signed_publish

    port = deployment.web_ports["web-b"]
    event = {"content": content, "selector": selector, "lifetime_s": 600, "channel": "default"}
    event.update(signed_publish(sender.key, sender=sender.name, now=time.time(), **event))
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/events", data=json.dumps(event).encode(),
        method="POST", headers={"Authorization": f"Bearer {sender.token}",
                                "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status == 201
        return json.load(reply)["event"]


def deliveries(deployment: Deployment, event: str) -> dict[str, dict[str, int]]:
    """{subtree (d0.0, d0.1): {state: count}} of the event's deliveries."""
    rows = deployment.sql(
        """SELECT substring(dispatcher.name from 1 for 4), delivery.state, count(*)
             FROM broker_delivery delivery
             JOIN broker_client client ON client.id = delivery.receiver_id
             JOIN broker_dispatcher dispatcher ON dispatcher.id = client.dispatcher_id
            WHERE delivery.event_id = %s GROUP BY 1, 2""",
        event,
    )
    counted: dict[str, dict[str, int]] = {}
    for subtree, state, count in rows:
        counted.setdefault(subtree, {})[state] = count
    return counted


def received(counted: dict[str, dict[str, int]], subtree: str | None = None) -> int:
    """Deliveries the agents have (delivered or acknowledged), in one subtree or all."""
    return sum(
        count
        for name, states in counted.items()
        if subtree in (None, name)
        for state, count in states.items()
        if state in ("delivered", "acked")
    )


# Not routed yet: no hop at the root, or a dispatcher a hop sent the event down to
# has not recorded its own hop.
UNROUTED = """
SELECT NOT EXISTS (SELECT 1 FROM broker_trafficrecord hop
                     JOIN broker_dispatcher dispatcher ON dispatcher.id = hop.dispatcher_id
                    WHERE hop.event_id = %s AND dispatcher.parent_id IS NULL)
    OR EXISTS (SELECT 1 FROM broker_trafficrecord hop,
                      jsonb_array_elements_text(hop.forwarded_to) AS child(id)
                WHERE hop.event_id = %s
                  AND NOT EXISTS (SELECT 1 FROM broker_trafficrecord below
                                   WHERE below.event_id = hop.event_id
                                     AND below.dispatcher_id = child.id::bigint
                                     AND below.direction = 'down'))
"""


def routed(deployment: Deployment, event: str) -> bool:
    """Whether the event's way through the tree is over (as its hops recorded it)."""
    return not deployment.sql(UNROUTED, event, event)[0][0]


def settle(deployment: Deployment, event: str, expected: int, what: str) -> None:
    """Wait until the event's `expected` deliveries are all with their agents."""

    def settled() -> bool:
        counted = deliveries(deployment, event)
        total = sum(sum(states.values()) for states in counted.values())
        return total == expected and received(counted) == expected

    def explain() -> str:
        results = deployment.sql(
            "SELECT DISTINCT result::text FROM broker_delivery WHERE event_id = %s LIMIT 3", event
        )
        return f"{deliveries(deployment, event)}, results {results}"

    wait_for(settled, what, timeout_s=START_TIMEOUT_S, explain=explain)


STATUS = {"kind": "command", "action": "status"}  # every server answers it
LEFT_QUEUES = ["dispatcher.d0.0", "dispatcher.d0.0.0", "dispatcher.d0.0.1"]


@pytest.mark.timeout(900)
def test_the_scenario_plays_across_hosts_reports_run_on_the_cluster_and_a_tree_host_dies(
    deployment, cluster
):
    national = sender(deployment, "intellimune-national")
    northwest = sender(deployment, "northwest-controller")
    everyone = publish(deployment, national, STATUS, "")
    settle(deployment, everyone, SERVERS, "every server has the command")
    by_subtree = {
        name: sum(states.values()) for name, states in deliveries(deployment, everyone).items()
    }
    assert set(by_subtree) == {"d0.0", "d0.1"}  # both tree hosts deliver

    play_the_worm_scenario(deployment, national, northwest)
    started = time.monotonic()
    reports_on_the_cluster_equal_local_ones(deployment, spark_master=cluster[0])
    print(f"the report on the cluster, then locally: {time.monotonic() - started:.0f} s")
    takeover_s = a_tree_host_dies(deployment, national, left_servers=by_subtree["d0.0"])
    assert takeover_s <= TAKEOVER_WITHIN_S


def play_the_worm_scenario(deployment: Deployment, national: Sender, northwest: Sender) -> None:
    from demo.scenario import VULNERABLE, WORM_ALERT

    alert = publish(deployment, northwest, WORM_ALERT, 'region == "Northwest"')
    command = publish(deployment, national, {"kind": "command", "action": "disable-cgi"},
                      VULNERABLE)  # fmt: skip
    settle(deployment, alert, 10, "the Northwest servers have the alert")
    # The command may still be on its way down: its deliveries are counted once every
    # dispatcher it was sent to has recorded its hop (each leaf writes its deliveries
    # before its hop).
    wait_for(lambda: routed(deployment, command), "the command is routed", START_TIMEOUT_S)
    vulnerable = deployment.sql(
        "SELECT count(*) FROM broker_delivery WHERE event_id = %s", command
    )[0][0]
    assert 0 < vulnerable < SERVERS
    settle(deployment, command, vulnerable, "the vulnerable servers have the command")


def reports_on_the_cluster_equal_local_ones(deployment: Deployment, *, spark_master: str):
    """The reach report of the last hour, run by the reports host on the cluster, then
    computed again over the same window and dataset by the single-process baseline
    (bench/reports_baseline.py: the job's algorithm on DuckDB, which
    tests/bench/test_reports_baseline.py holds to every Spark job's figures): the same
    figures. (One report: each costs a Spark job on a machine the whole deployment
    shares; tests/reports check every report's figures.)"""
    queued = time.monotonic()
    run_id = int(deployment.manage("shell", "-c", REQUEST_REACH).splitlines()[-1])
    finished = lambda: deployment.sql(  # noqa: E731
        "SELECT state, error, spark_master FROM reports_reportrun WHERE id = %s "
        "AND state IN ('done', 'failed')", run_id,
    )  # fmt: skip
    ran = "the report ran on the cluster"
    [(state, error, master)] = wait_for(finished, ran, timeout_s=START_TIMEOUT_S)
    print(f"the reach report on the cluster: {time.monotonic() - queued:.0f} s")
    assert (state, error, master) == ("done", "", spark_master)
    printed = deployment.manage("shell", "-c", COMPUTE_AGAIN_LOCALLY % run_id)
    cluster, local = (Result(**result) for result in json.loads(printed.splitlines()[-1]))
    assert cluster.sections["commands"] and not differences(cluster, local)


REQUEST_REACH = """
from datetime import timedelta
from django.utils import timezone
from broker.audit import Actor
from reports.results import Params
from reports.services import request_run

end = timezone.now()
params = Params(window_start=end - timedelta(hours=1), window_end=end)
print(request_run(kind="reach", params=params, actor=Actor("system", "multi-host test")).pk)
"""

# The run's stored figures, and the baseline's over the same window and dataset (the
# one the run exported to and read), both printed as results.
COMPUTE_AGAIN_LOCALLY = """
import json
from bench.reports_baseline import baseline_result
from reports.export import dataset_root
from reports.models import ReportRun
from reports.results import Params

run = ReportRun.objects.get(pk=%d)
sections = {}
for row in run.rows.order_by("section", "position"):
    sections.setdefault(row.section, []).append(row.data)
params = Params(window_start=run.window_start, window_end=run.window_end, region=run.region)
local = baseline_result(run.kind, dataset_root(), params)
print(json.dumps([{"summary": run.summary, "sections": sections},
                  {"summary": local.summary, "sections": local.sections}], default=str))
"""


def a_tree_host_dies(deployment: Deployment, national: Sender, *, left_servers: int) -> float:
    """Kill tree-a (the d0.0 subtree) whole while an event is on its way, send another
    at once; both reach everyone. Return seconds from the kill to the second event
    being with every agent of the dead host's leaves."""
    before = deployment.sql("SELECT count(*) FROM broker_delivery")[0][0]
    in_flight = publish(deployment, national, STATUS, "")
    killed_at = time.monotonic()
    deployment.hosts["tree-a"].kill()
    after_kill = publish(deployment, national, STATUS, "")
    wait_for(
        lambda: received(deliveries(deployment, after_kill), "d0.0") == left_servers,
        "the dead host's leaves deliver again", timeout_s=60,
    )  # fmt: skip
    takeover_s = time.monotonic() - killed_at
    print(f"the dead host's leaves delivered again {takeover_s:.1f} s after the kill")
    # Said on the health page from tree-b's next beat on.
    covering = lambda: _covered_by(deployment, "tree-b") == LEFT_QUEUES  # noqa: E731
    wait_for(covering, "tree-b says it covers d0.0", timeout_s=10)
    for event in (in_flight, after_kill):
        settle(deployment, event, SERVERS, "nothing is lost")
    after = deployment.sql("SELECT count(*) FROM broker_delivery")[0][0]
    print(f"takeover: {takeover_s:.1f} s; deliveries before the kill {before}, after "
          f"{after} (+{after - before} = 2 events x {SERVERS} servers)")  # fmt: skip
    assert after - before == 2 * SERVERS
    deployment.hosts["tree-a"].start(deployment.env)  # the host is back: handed back
    handed_back = lambda: _covered_by(deployment, "tree-b") == []  # noqa: E731
    wait_for(handed_back, "tree-b hands d0.0 back", timeout_s=START_TIMEOUT_S)
    return takeover_s
